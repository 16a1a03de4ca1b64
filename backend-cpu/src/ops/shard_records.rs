//! `shard_records` (`docs/semantics.md` §5.14): per row, the slice's first K tokens in key
//! order as `(key, weight)` records: the keys of the row, a selection of the K largest, a sort
//! of those K, then their weights. Rows in parallel.

use rayon::prelude::*;
use specula_backend_api::host::slice_mut;
use specula_backend_api::ops::shard_records::OpCall;
use specula_backend_api::{FloatElement, Op, Result};

use super::sharded::SliceRows;
use super::with_float;
use crate::CpuDevice;

/// Runs a validated `shard_records` call.
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, records, params, kind) = call.parts();
    let (k, order) = (params.records, params.order);
    let out = slice_mut::<u64>(records)?;
    device.install(|| {
        with_float!(kind.dtype, Op::ShardRecords, T => {
            let rows = SliceRows::<T>::new(inputs, &params.shape)?;
            out.par_chunks_mut(2 * k).enumerate().for_each(|(r, row_out)| {
                let row = rows.row(r);
                let mut keyed: Vec<(u64, u32)> = row
                    .iter()
                    .enumerate()
                    .map(|(j, x)| (rows.key(order, x.to_f32(), j), j as u32))
                    .collect();
                let n = k.min(keyed.len());
                if n < keyed.len() {
                    keyed.select_nth_unstable_by(n - 1, |a, b| b.0.cmp(&a.0));
                    keyed.truncate(n);
                }
                keyed.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
                let weigher = rows.weigher(r);
                row_out.fill(0);
                for (record, &(key, j)) in row_out.chunks_mut(2).zip(&keyed) {
                    let j = j as usize;
                    record[0] = key;
                    record[1] = weigher.weight(row[j].to_f32(), rows.first + j);
                }
            });
            Ok(())
        })
    })
}
