//! What the host code of the sharded ops shares (`docs/semantics.md` §4d, `kernels/shard.cuh`):
//! the pointers of a rank's rows weighed as rows of the whole vocabulary, and the key order as
//! the kernels take it.

use specula_backend_api::ops::{ShardRows, ShardShape};
use specula_backend_api::shard::KeyOrder;
use specula_backend_api::{Op, Result};

use super::{flag, grid_x, to_u32};
use crate::device::CudaDevice;

/// The device addresses and sizes of a rank's rows: the fields every sharded kernel's argument
/// block starts with.
pub(crate) struct RowPointers {
    pub(crate) scores: u64,
    pub(crate) temperature: u64,
    pub(crate) row_key: u64,
    pub(crate) min_p: u64,
    pub(crate) rows: u32,
    pub(crate) len: u32,
    pub(crate) first: u32,
    pub(crate) logits: u32,
    pub(crate) vec: u32,
}

impl RowPointers {
    /// The pointers of `rows` over `shape` (no temperature for probability rows, no min_p
    /// without one: null).
    pub(crate) fn of(
        device: &CudaDevice,
        op: Op,
        rows: &ShardRows<'_>,
        shape: &ShardShape,
    ) -> Result<Self> {
        let matrix = rows.scores.matrix();
        Ok(RowPointers {
            scores: device.ptr(op, matrix)?,
            temperature: device.opt_ptr(op, rows.scores.temperature())?,
            row_key: device.ptr(op, rows.row_key)?,
            min_p: device.opt_ptr(op, rows.min_p)?,
            rows: grid_x(op, shape.rows)?,
            len: to_u32(op, "len", shape.slice.len)?,
            first: to_u32(op, "first", shape.slice.first)?,
            logits: flag(rows.scores.is_logits()),
            vec: device.vec_ok(op, matrix, shape.slice.len)?,
        })
    }
}

/// The order as the kernels take it (`SHARD_ORDER_RANK` 0, `SHARD_ORDER_ARGMAX` 1 in
/// `shard.cuh`).
pub(crate) fn order_code(order: KeyOrder) -> u32 {
    match order {
        KeyOrder::Rank => 0,
        KeyOrder::Argmax => 1,
    }
}
