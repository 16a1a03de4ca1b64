//! `shard_walk` (`docs/semantics.md` §5.16): arguments and validation.

use super::sharded::{ShardRows, ShardShape};
use super::{Check, ScoresKind};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Error, Op, Result};

/// A validated `shard_walk`. Facts: the scores' dtype and kind. Nothing to launch when
/// `rows == 0`.
pub type ShardWalkCall<'c, 'o> =
    Call<'c, ShardWalkInputs<'c>, ShardWalkOutputs<'o>, ShardWalkParams, ScoresKind>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = ShardWalkCall<'c, 'o>;

/// Inputs of `shard_walk`.
#[derive(Clone, Copy, Debug)]
pub struct ShardWalkInputs<'a> {
    /// The rows, weighed as rows of the whole vocabulary.
    pub rows: ShardRows<'a>,
    /// `[rows]` u64: the kept tokens are those whose key is at least this (0: every token).
    pub threshold: &'a Buffer,
    /// `[rows]` u64: where the walk starts within the slice's mass (`u64::MAX`: no walk).
    pub offset: &'a Buffer,
    /// REJECTION's residual in place of the kept weights, when given.
    pub residual: Option<ShardResidual<'a>>,
}

/// The residual of REJECTION (`docs/semantics.md` §5.8) of each row against a draft row:
/// `ρ[v] = floor(max(0, wp[v]·Wq − wq[v]·Wp) / 2^k)`, `wp` the kept weights of the row.
#[derive(Clone, Copy, Debug)]
pub struct ShardResidual<'a> {
    /// `[n ≥ 1, slice.len]` draft rows of the scores' kind and dtype (logits are weighed at the
    /// temperature of the row they are checked against).
    pub draft: &'a Buffer,
    /// `[n]` u64: each draft row's row key (its whole row's largest key in rank order).
    pub draft_key: &'a Buffer,
    /// `[rows]` i32: the draft row each row is checked against (outside `[0, n)`: no residual).
    pub draft_row: &'a Buffer,
    /// `[rows]` u64: `Wp`, the whole row's kept mass.
    pub target_mass: &'a Buffer,
    /// `[rows]` u64: `Wq`, the whole draft row's total weight.
    pub draft_mass: &'a Buffer,
}

/// Outputs of `shard_walk`.
#[derive(Debug)]
pub struct ShardWalkOutputs<'a> {
    /// `[rows]` i32: the global id of the first token, in ascending id order, whose running weight
    /// exceeds the offset; -1 when the slice's mass does not.
    pub tokens: &'a mut Buffer,
    /// `[rows]` u64: the slice's kept mass (or residual mass).
    pub mass: &'a mut Buffer,
    /// `[rows]` u64: the number of the slice's kept tokens.
    pub count: &'a mut Buffer,
}

/// Parameters of `shard_walk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardWalkParams {
    /// The rows and the slice they hold.
    pub shape: ShardShape,
}

/// Validates `shard_walk`.
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    inputs: &ShardWalkInputs<'c>,
    out: &'c mut ShardWalkOutputs<'o>,
    params: &ShardWalkParams,
) -> Result<ShardWalkCall<'c, 'o>> {
    let check = Check::new(Op::ShardWalk, device);
    let shape = &params.shape;
    let kind = inputs.rows.validate(&check, shape)?;
    check.exact("threshold", inputs.threshold, DType::U64, shape.rows)?;
    check.exact("offset", inputs.offset, DType::U64, shape.rows)?;
    if let Some(residual) = &inputs.residual {
        validate_residual(&check, residual, shape, kind)?;
    }
    check.exact("tokens", out.tokens, DType::I32, shape.rows)?;
    check.exact("mass", out.mass, DType::U64, shape.rows)?;
    check.exact("count", out.count, DType::U64, shape.rows)?;
    let call = Call::new(*inputs, out, *params, kind);
    Ok(call
        .with_extent(shape.rows, shape.slice.len)
        .launching_nothing_if(shape.rows == 0))
}

fn validate_residual(
    check: &Check<'_>,
    residual: &ShardResidual<'_>,
    shape: &ShardShape,
    kind: ScoresKind,
) -> Result<()> {
    let (dtype, draft_rows) = check.float_rows("draft", residual.draft, shape.slice.len)?;
    if dtype != kind.dtype {
        return Err(Error::DTypeMismatch {
            op: check.op,
            arg: "draft",
            expected: kind.dtype.name().to_owned(),
            actual: dtype,
        });
    }
    check.exact("draft_key", residual.draft_key, DType::U64, draft_rows)?;
    check.exact("draft_row", residual.draft_row, DType::I32, shape.rows)?;
    check.exact("target_mass", residual.target_mass, DType::U64, shape.rows)?;
    check.exact("draft_mass", residual.draft_mass, DType::U64, shape.rows)
}
