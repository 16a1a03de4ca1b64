//! `shard_histogram` (`docs/semantics.md` §5.15): arguments and validation.

use super::sharded::{ShardRows, ShardShape};
use super::{Check, ScoresKind};
use crate::abi::SHARD_HISTOGRAM_BUCKETS;
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Error, Op, Result};

/// A validated `shard_histogram`. Facts: the scores' dtype and kind. Nothing to launch when
/// `rows == 0`.
pub type ShardHistogramCall<'c, 'o> =
    Call<'c, ShardHistogramInputs<'c>, ShardHistogramOutputs<'o>, ShardHistogramParams, ScoresKind>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = ShardHistogramCall<'c, 'o>;

/// Inputs of `shard_histogram`.
#[derive(Clone, Copy, Debug)]
pub struct ShardHistogramInputs<'a> {
    /// The rows, weighed as rows of the whole vocabulary.
    pub rows: ShardRows<'a>,
    /// `[rows]` u64: the bits of the key chosen so far, `key >> (shift + 8)` (a value no key has
    /// leaves the row's histogram empty).
    pub prefix: &'a Buffer,
    /// `[rows]` u64: the survivors' lowest key; tokens with a smaller key are left out (0: none).
    pub floor: &'a Buffer,
}

/// Outputs of `shard_histogram`.
#[derive(Debug)]
pub struct ShardHistogramOutputs<'a> {
    /// `[rows, 256]` u64: the number of tokens per bucket.
    pub counts: &'a mut Buffer,
    /// `[rows, 256]` u64: their total weight per bucket.
    pub masses: &'a mut Buffer,
}

/// Parameters of `shard_histogram`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardHistogramParams {
    /// The rows and the slice they hold.
    pub shape: ShardShape,
    /// The bucket of a token is `(key >> shift) & 255` (`shift ≤ 56`).
    pub shift: u32,
}

/// The largest `shift` of `shard_histogram`.
pub const MAX_HISTOGRAM_SHIFT: u32 = 56;

/// Validates `shard_histogram`.
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    inputs: &ShardHistogramInputs<'c>,
    out: &'c mut ShardHistogramOutputs<'o>,
    params: &ShardHistogramParams,
) -> Result<ShardHistogramCall<'c, 'o>> {
    let check = Check::new(Op::ShardHistogram, device);
    let shape = &params.shape;
    let kind = inputs.rows.validate(&check, shape)?;
    if params.shift > MAX_HISTOGRAM_SHIFT {
        return Err(Error::invalid(
            check.op,
            "shift",
            format!("0 ..= {MAX_HISTOGRAM_SHIFT}"),
            params.shift,
        ));
    }
    check.exact("prefix", inputs.prefix, DType::U64, shape.rows)?;
    check.exact("floor", inputs.floor, DType::U64, shape.rows)?;
    let len = check.product("counts", shape.rows, SHARD_HISTOGRAM_BUCKETS)?;
    check.exact("counts", out.counts, DType::U64, len)?;
    check.exact("masses", out.masses, DType::U64, len)?;
    let call = Call::new(*inputs, out, *params, kind);
    Ok(call
        .with_extent(shape.rows, shape.slice.len)
        .launching_nothing_if(shape.rows == 0))
}
