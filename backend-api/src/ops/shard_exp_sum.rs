//! `shard_exp_sum` (`docs/semantics.md` §5.17): arguments and validation.

use super::sharded::ShardShape;
use super::{Check, Scores};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Op, Result};

/// A validated `shard_exp_sum`: output `sums [rows]` f32. Facts: the logits' dtype. Nothing to
/// launch when `rows == 0`.
pub type ShardExpSumCall<'c> = Call<'c, ShardExpSumInputs<'c>, Buffer, ShardExpSumParams, DType>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = ShardExpSumCall<'c>;

/// Inputs of `shard_exp_sum`.
#[derive(Clone, Copy, Debug)]
pub struct ShardExpSumInputs<'a> {
    /// `[rows, slice.len]` logits.
    pub logits: &'a Buffer,
    /// `[rows]` f32 temperatures (device values: negative or NaN count as 1.0).
    pub temperature: &'a Buffer,
    /// `[rows]` u64: each whole row's row key in rank order (its maximum).
    pub row_key: &'a Buffer,
}

/// Parameters of `shard_exp_sum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardExpSumParams {
    /// The rows and the slice they hold.
    pub shape: ShardShape,
}

/// Validates `shard_exp_sum`.
pub(crate) fn validate<'c>(
    device: &DeviceDesc,
    inputs: &ShardExpSumInputs<'c>,
    sums: &'c mut Buffer,
    params: &ShardExpSumParams,
) -> Result<ShardExpSumCall<'c>> {
    let check = Check::new(Op::ShardExpSum, device);
    let shape = &params.shape;
    let scores = Scores::logits(inputs.logits, inputs.temperature);
    let kind = shape.validate_scores(&check, &scores)?;
    check.exact("row_key", inputs.row_key, DType::U64, shape.rows)?;
    check.exact("sums", sums, DType::F32, shape.rows)?;
    let call = Call::new(*inputs, sums, *params, kind.dtype);
    Ok(call
        .with_extent(shape.rows, shape.slice.len)
        .launching_nothing_if(shape.rows == 0))
}
