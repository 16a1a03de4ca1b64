//! `shard_key` (`docs/semantics.md` §5.13): per row, the slice's largest key, or a given token's.
//! One pass per row, rows in parallel.

use rayon::prelude::*;
use specula_backend_api::host::{slice, slice_mut};
use specula_backend_api::ops::shard_key::OpCall;
use specula_backend_api::shard::{NO_KEY, token_key};
use specula_backend_api::{FloatElement, Op, Result};

use super::with_float;
use crate::CpuDevice;

/// Runs a validated `shard_key` call.
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, keys, params, kind) = call.parts();
    let (slice_of, order, logits) = (params.shape.slice, params.order, kind.logits);
    let ids = inputs.ids.map(slice::<i32>).transpose()?;
    let keys = slice_mut::<u64>(keys)?;
    device.install(|| {
        with_float!(kind.dtype, Op::ShardKey, T => {
            let values = slice::<T>(inputs.scores.matrix())?;
            let key_at = |row: &[T], j: usize| {
                token_key(order, logits, row[j].to_f32(), slice_of.first + j)
            };
            keys.par_iter_mut()
                .zip(values.par_chunks(slice_of.len))
                .enumerate()
                .for_each(|(r, (key, row))| {
                    *key = match ids {
                        Some(ids) => usize::try_from(i64::from(ids[r]) - slice_of.first as i64)
                            .ok()
                            .filter(|&j| j < row.len())
                            .map_or(NO_KEY, |j| key_at(row, j)),
                        None => (0..row.len()).map(|j| key_at(row, j)).max().unwrap_or(NO_KEY),
                    };
                });
            Ok(())
        })
    })
}
