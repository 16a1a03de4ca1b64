//! What the host code of the sharded ops shares (`docs/semantics.md` §4d, `shaders/shard.wgsl`):
//! the bindings of a rank's rows weighed as rows of the whole vocabulary, and the key order as the
//! kernels take it.

use specula_backend_api::abi::KernelArgs;
use specula_backend_api::ops::{RowShape, ShardRows};
use specula_backend_api::shard::KeyOrder;
use specula_backend_api::{DType, Op, Result};

use super::{Binder, matrix_row_dispatches};
use crate::WgpuDevice;
use crate::gpu::Dispatch;
use crate::kernels::{Entry, RowHead};

/// Declares the argument struct of a sharded row kernel
/// ([`kernel_args!`](specula_backend_api::kernel_args)): the fields of [`BoundRows`] first (after
/// the [`RowHead`]), then the kernel's own; and `bound`, the struct with the [`BoundRows`] fields
/// set and the others zero, to complete with struct update syntax.
macro_rules! shard_row_args {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        specula_backend_api::kernel_args! {
            $(#[$meta])*
            $vis struct $name {
                input_off: u32,
                temperature_off: u32,
                row_key_off: u32,
                min_p_off: u32,
                has_min_p: u32,
                logits: u32,
                $($field: $ty),*
            }
        }

        impl $name {
            /// The arguments with the bound rows' fields set and the others zero.
            fn bound(rows: $crate::ops::sharded::BoundRows) -> Self {
                Self {
                    input_off: rows.input_off,
                    temperature_off: rows.temperature_off,
                    row_key_off: rows.row_key_off,
                    min_p_off: rows.min_p_off,
                    has_min_p: rows.has_min_p,
                    logits: rows.logits,
                    ..Self::default()
                }
            }
        }
    };
}

pub(crate) use shard_row_args;

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

/// The [`BoundRows`] of `rows` whose chunk of scores is bound at 1 at `input_off`: binds the
/// temperatures at 2 (the placeholder for probability rows), the row keys at 3 and the min_p
/// values at 4 (the placeholder without them).
fn bind_rows(b: &mut Binder<'_>, rows: &ShardRows<'_>, input_off: u32) -> Result<BoundRows> {
    Ok(BoundRows {
        input_off,
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

/// The dispatches of a sharded row kernel for `op` ([`matrix_row_dispatches`]: one per row chunk
/// of `rows`' scores, bound at 1), each with the chunk's rows bound at 1 to 4 ([`bind_rows`]); `args` binds the
/// kernel's other buffers and returns its arguments, given the bound rows.
pub(crate) fn shard_row_dispatches<A: KernelArgs + bytemuck::Pod>(
    device: &WgpuDevice,
    op: Op,
    kernel: (&Entry<A, RowHead>, DType),
    rows: &ShardRows<'_>,
    shape: &RowShape,
    mut args: impl FnMut(&mut Binder<'_>, BoundRows) -> Result<A>,
) -> Result<Vec<Dispatch>> {
    let matrix = rows.scores.matrix();
    matrix_row_dispatches(device, op, kernel, matrix, shape, |b, input_off| {
        let bound = bind_rows(b, rows, input_off)?;
        args(b, bound)
    })
}
