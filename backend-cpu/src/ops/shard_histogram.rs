//! `shard_histogram` (`docs/semantics.md` §5.15): per row, one pass over the slice; a token's
//! weight is computed only when its key falls in the row's prefix. Rows in parallel.

use rayon::prelude::*;
use specula_backend_api::abi::SHARD_HISTOGRAM_BUCKETS;
use specula_backend_api::host::{slice, slice_mut};
use specula_backend_api::ops::shard_histogram::OpCall;
use specula_backend_api::shard::KeyOrder;
use specula_backend_api::{FloatElement, Op, Result};

use super::sharded::SliceRows;
use super::with_float;
use crate::CpuDevice;

/// Runs a validated `shard_histogram` call.
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let shift = params.shift;
    let prefix = slice::<u64>(inputs.prefix)?;
    let floor = slice::<u64>(inputs.floor)?;
    let counts = slice_mut::<u64>(out.counts)?;
    let masses = slice_mut::<u64>(out.masses)?;
    device.install(|| {
        with_float!(kind.dtype, Op::ShardHistogram, T => {
            let rows = SliceRows::<T>::new(&inputs.rows, &params.shape)?;
            counts
                .par_chunks_mut(SHARD_HISTOGRAM_BUCKETS)
                .zip(masses.par_chunks_mut(SHARD_HISTOGRAM_BUCKETS))
                .enumerate()
                .for_each(|(r, (counts, masses))| {
                    counts.fill(0);
                    masses.fill(0);
                    let weigher = rows.weigher(r);
                    for (j, x) in rows.row(r).iter().enumerate() {
                        let x = x.to_f32();
                        let key = rows.key(KeyOrder::Rank, x, j);
                        let above = key.checked_shr(shift + 8).unwrap_or(0);
                        if key < floor[r] || above != prefix[r] {
                            continue;
                        }
                        let bucket = ((key >> shift) & 0xff) as usize;
                        counts[bucket] += 1;
                        masses[bucket] += weigher.weight(x, rows.first + j);
                    }
                });
            Ok(())
        })
    })
}
