//! `shard_key` (`docs/semantics.md` §5.13): the largest key of the slice, or a given token's.

use specula_backend_api::Result;
use specula_backend_api::host::{slice, slice_mut};
use specula_backend_api::ops::shard_key::OpCall;

use crate::ReferenceDevice;
use crate::matrix::FloatMatrix;
use crate::shard::key;

/// Runs a validated `shard_key` call.
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, keys, params, kind) = call.parts();
    let (shape, order) = (params.shape, params.order);
    let first = shape.slice.first;
    let values = FloatMatrix::new(
        specula_backend_api::Op::ShardKey,
        kind.dtype,
        inputs.scores.matrix(),
        shape.rows,
        shape.slice.len,
    )?;
    let ids = inputs.ids.map(slice::<i32>).transpose()?;
    for (r, out) in slice_mut::<u64>(keys)?.iter_mut().enumerate() {
        let Some(row) = values.row(r) else { continue };
        let key_of = |j: usize| key(order, kind.logits, row[j], first + j);
        *out = match ids {
            // The given token's key, or 0 when this slice does not hold it.
            Some(ids) => usize::try_from(i64::from(ids[r]) - first as i64)
                .ok()
                .filter(|&j| j < row.len())
                .map_or(0, key_of),
            None => (0..row.len()).map(key_of).max().unwrap_or(0),
        };
    }
    Ok(())
}
