//! `shard_key` (`docs/semantics.md` §5.13): arguments and validation.

use super::sharded::ShardShape;
use super::{Check, Scores, ScoresKind};
use crate::call::{Call, DeviceDesc};
use crate::shard::KeyOrder;
use crate::{Buffer, DType, Op, Result};

/// A validated `shard_key`: output `keys [rows]` u64. Facts: the scores' dtype and kind. Nothing
/// to launch when `rows == 0`.
pub type ShardKeyCall<'c> = Call<'c, ShardKeyInputs<'c>, Buffer, ShardKeyParams, ScoresKind>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = ShardKeyCall<'c>;

/// Inputs of `shard_key`.
#[derive(Clone, Copy, Debug)]
pub struct ShardKeyInputs<'a> {
    /// `[rows, slice.len]` probabilities or logits (the temperature plays no part).
    pub scores: Scores<'a>,
    /// Optional `[rows]` i32 global token ids: the key of that token (when the slice holds it)
    /// instead of the slice's largest key.
    pub ids: Option<&'a Buffer>,
}

impl<'a> ShardKeyInputs<'a> {
    /// The largest key of each row of `scores`.
    pub fn new(scores: Scores<'a>) -> Self {
        ShardKeyInputs { scores, ids: None }
    }

    /// These inputs with per-row token ids (`None`: the largest key).
    pub fn with_ids(self, ids: Option<&'a Buffer>) -> Self {
        ShardKeyInputs { ids, ..self }
    }
}

/// Parameters of `shard_key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardKeyParams {
    /// The rows and the slice they hold.
    pub shape: ShardShape,
    /// The order the keys rank tokens in.
    pub order: KeyOrder,
}

/// Validates `shard_key`.
pub(crate) fn validate<'c>(
    device: &DeviceDesc,
    inputs: &ShardKeyInputs<'c>,
    keys: &'c mut Buffer,
    params: &ShardKeyParams,
) -> Result<ShardKeyCall<'c>> {
    let check = Check::new(Op::ShardKey, device);
    let shape = &params.shape;
    let kind = shape.validate_scores(&check, &inputs.scores)?;
    if let Some(ids) = inputs.ids {
        check.exact("ids", ids, DType::I32, shape.rows)?;
    }
    check.exact("keys", keys, DType::U64, shape.rows)?;
    let call = Call::new(*inputs, keys, *params, kind);
    Ok(call
        .with_extent(shape.rows, shape.slice.len)
        .launching_nothing_if(shape.rows == 0))
}
