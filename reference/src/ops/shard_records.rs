//! `shard_records` (`docs/semantics.md` §5.14): the slice's first K tokens in key order, found
//! with a sort.

use std::cmp::Reverse;

use specula_backend_api::host::slice_mut;
use specula_backend_api::ops::shard_records::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::SliceRows;
use crate::ReferenceDevice;
use crate::shard::key;

/// Runs a validated `shard_records` call.
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, records, params, kind) = call.parts();
    let rows = SliceRows::new(Op::ShardRecords, *kind, inputs, &params.shape)?;
    let first = params.shape.slice.first;
    let k = params.records;
    let out = slice_mut::<u64>(records)?;
    out.fill(0);
    for (r, row_out) in out.chunks_mut(2 * k).enumerate() {
        let Some((values, weigher)) = rows.row(r) else {
            continue;
        };
        let key_of = |j: usize| key(params.order, kind.logits, values[j], first + j);
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by_key(|&j| Reverse(key_of(j)));
        for (record, &j) in row_out.chunks_mut(2).zip(&order) {
            record[0] = key_of(j);
            record[1] = weigher.weight(values[j], first + j);
        }
    }
    Ok(())
}
