//! `shard_histogram` (`docs/semantics.md` §5.15): one loop over the slice per row.

use specula_backend_api::host::{slice, slice_mut};
use specula_backend_api::ops::shard_histogram::OpCall;
use specula_backend_api::shard::KeyOrder;
use specula_backend_api::{Op, Result};

use super::sharded::SliceRows;
use crate::ReferenceDevice;
use crate::shard::key;

/// Runs a validated `shard_histogram` call.
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let rows = SliceRows::new(Op::ShardHistogram, *kind, &inputs.rows, &params.shape)?;
    let first = params.shape.slice.first;
    let prefix = slice::<u64>(inputs.prefix)?;
    let floor = slice::<u64>(inputs.floor)?;
    let counts = slice_mut::<u64>(out.counts)?;
    let masses = slice_mut::<u64>(out.masses)?;
    counts.fill(0);
    masses.fill(0);
    let shift = params.shift;
    for r in 0..params.shape.rows {
        let Some((values, weigher)) = rows.row(r) else {
            continue;
        };
        for (j, &x) in values.iter().enumerate() {
            let k = key(KeyOrder::Rank, kind.logits, x, first + j);
            // The prefix is the key above the bucket's 8 bits (all of it from bit 64 on).
            let above = k.checked_shr(shift + 8).unwrap_or(0);
            if k < floor[r] || above != prefix[r] {
                continue;
            }
            let bucket = r * 256 + ((k >> shift) & 255) as usize;
            counts[bucket] += 1;
            masses[bucket] += weigher.weight(x, first + j);
        }
    }
    Ok(())
}
