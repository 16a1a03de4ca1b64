//! What the host code of the sharded ops shares (`docs/semantics.md` §4d, `shaders/shard.wgsl`):
//! the bindings of a rank's rows weighed as rows of the whole vocabulary, and the key order as the
//! kernels take it.

use specula_backend_api::Result;
use specula_backend_api::ops::ShardRows;
use specula_backend_api::shard::KeyOrder;

use super::Binder;

/// Where the bindings 1 to 4 of a sharded row kernel start (element offsets) and what the rows
/// are: the fields of its argument struct after the [`RowHead`](crate::kernels::RowHead).
pub(crate) struct BoundRows {
    pub(crate) input_off: u32,
    pub(crate) temperature_off: u32,
    pub(crate) row_key_off: u32,
    pub(crate) min_p_off: u32,
    pub(crate) has_min_p: u32,
    pub(crate) logits: u32,
}

/// Binds rows `chunk` of `rows`' `[rows, len]` scores at 1, the temperatures at 2 (the
/// placeholder for probability rows), the row keys at 3 and the min_p values at 4 (the
/// placeholder without them).
pub(crate) fn bind_rows(
    b: &mut Binder<'_>,
    rows: &ShardRows<'_>,
    len: usize,
    chunk: (usize, usize),
) -> Result<BoundRows> {
    Ok(BoundRows {
        input_off: b.rows(1, rows.scores.matrix(), len, chunk)?,
        temperature_off: b.optional(2, rows.scores.temperature())?,
        row_key_off: b.buffer(3, rows.row_key)?,
        min_p_off: b.optional(4, rows.min_p)?,
        has_min_p: u32::from(rows.min_p.is_some()),
        logits: u32::from(rows.scores.is_logits()),
    })
}

/// The order as the kernels take it (`ORDER_RANK` 0, `ORDER_ARGMAX` 1 in `shard.wgsl`).
pub(crate) fn order_code(order: KeyOrder) -> u32 {
    match order {
        KeyOrder::Rank => 0,
        KeyOrder::Argmax => 1,
    }
}
