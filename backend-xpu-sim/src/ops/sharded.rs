//! What the host code of the sharded ops shares (`docs/semantics.md` §4d, `kernels/shard.cl`):
//! the buffers of a rank's rows weighed as rows of the whole vocabulary, and the key order as the
//! kernels take it.

use specula_backend_api::Result;
use specula_backend_api::ops::ShardRows;
use specula_backend_api::shard::KeyOrder;

use crate::runtime::{KernelBuffers, Runtime};

/// Appends the buffers of `rows` in the order of the kernels' parameters: the `[rows, len]`
/// scores, the temperatures (the placeholder for probability rows), the row keys and the min_p
/// values (the placeholder without them).
pub(crate) fn bind_rows(
    buffers: &mut KernelBuffers,
    runtime: &Runtime,
    rows: &ShardRows<'_>,
) -> Result<()> {
    buffers
        .bind(&[rows.scores.matrix()])?
        .bind_optional(runtime, &[rows.scores.temperature()])?
        .bind(&[rows.row_key])?
        .bind_optional(runtime, &[rows.min_p])?;
    Ok(())
}

/// The order as the kernels take it (`ORDER_RANK` 0, `ORDER_ARGMAX` 1 in `shard.cl`).
pub(crate) fn order_code(order: KeyOrder) -> u32 {
    match order {
        KeyOrder::Rank => 0,
        KeyOrder::Argmax => 1,
    }
}
