//! `shard_records` (`docs/semantics.md` §5.14): arguments and validation.

use super::sharded::{ShardRows, ShardShape};
use super::{Check, ScoresKind};
use crate::call::{Call, DeviceDesc};
use crate::shard::KeyOrder;
use crate::{Buffer, DType, Error, Op, Result};

/// A validated `shard_records`: output `records [rows, K, 2]` u64. Facts: the scores' dtype and
/// kind. Nothing to launch when `rows == 0`.
pub type ShardRecordsCall<'c> = Call<'c, ShardRows<'c>, Buffer, ShardRecordsParams, ScoresKind>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = ShardRecordsCall<'c>;

/// Parameters of `shard_records`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardRecordsParams {
    /// The rows and the slice they hold.
    pub shape: ShardShape,
    /// `K`, the records per row (`1 ..= 1024`, `abi::MAX_SHARD_RECORDS`).
    pub records: usize,
    /// The order the records follow (and their keys rank in).
    pub order: KeyOrder,
}

/// Validates `shard_records`.
pub(crate) fn validate<'c>(
    device: &DeviceDesc,
    inputs: &ShardRows<'c>,
    records: &'c mut Buffer,
    params: &ShardRecordsParams,
) -> Result<ShardRecordsCall<'c>> {
    let check = Check::new(Op::ShardRecords, device);
    let shape = &params.shape;
    let kind = inputs.validate(&check, shape)?;
    if !(1..=crate::abi::MAX_SHARD_RECORDS).contains(&params.records) {
        return Err(Error::invalid(
            check.op,
            "records",
            format!("1 ..= {}", crate::abi::MAX_SHARD_RECORDS),
            params.records,
        ));
    }
    let len = check.product("records", shape.rows, 2 * params.records)?;
    check.exact("records", records, DType::U64, len)?;
    let call = Call::new(*inputs, records, *params, kind);
    Ok(call
        .with_extent(shape.rows, shape.slice.len)
        .launching_nothing_if(shape.rows == 0))
}
