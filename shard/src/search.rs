//! The radix search of `docs/semantics.md` §4d step 3: the exact threshold key where the count
//! (top-k) or the mass (top-p) from the top of the rank order reaches a target, found 8 key bits
//! a round with `shard_histogram` and a SUM over the ranks.

use specula_backend_api::DeviceExt;
use specula_backend_api::abi::{SHARD_HISTOGRAM_BUCKETS, SHARD_KEY_BITS, SHARD_KEY_ID_BITS};
use specula_backend_api::ops::{
    ShardHistogramInputs, ShardHistogramOutputs, ShardHistogramParams, ShardRows,
};
use specula_backend_api::shard::ord_value;

use crate::error::Result;
use crate::rows::{HostRows, Shard};

/// The bucket shifts of the rounds: bits `[44, 52)`, `[36, 44)`, … `[4, 12)`, then `[0, 8)`.
const SHIFTS: [u32; 7] = [44, 36, 28, 20, 12, 4, 0];

/// What a search counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// Tokens: the threshold is the key of the `need`-th token.
    Count,
    /// Weight: the threshold is the key of the token where the mass reaches `need`.
    Mass,
}

/// One row's search.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowSearch {
    /// The row.
    pub row: usize,
    /// Its row key (the weights' maximum).
    pub row_key: u64,
    /// The survivors' lowest key (0: all).
    pub floor: u64,
    /// The count or mass to reach from the top (≥ 1, at most what the survivors hold).
    pub need: u64,
}

/// A row's progress: the key bits above `low` are known (`known = key >> low`).
#[derive(Clone, Copy, Debug)]
struct Progress {
    known: u64,
    low: u32,
    need: u64,
    done: Option<u64>,
}

/// The threshold key of each row of `searches`, in order: the keys at or above it are the
/// shortest prefix of the survivors (keys `≥ floor`) whose count or mass reaches `need`.
pub(crate) fn search(
    shard: &Shard<'_>,
    rows: &ShardRows<'_>,
    host: &HostRows<'_>,
    searches: &[RowSearch],
    target: Target,
) -> Result<Vec<u64>> {
    let n = host.rows();
    let mut progress: Vec<Progress> = searches
        .iter()
        .map(|s| Progress {
            known: 0,
            low: SHARD_KEY_BITS,
            need: s.need,
            done: None,
        })
        .collect();
    let mut floor = vec![0u64; n];
    for s in searches {
        floor[s.row] = s.floor;
    }
    let device = shard.device;
    let floor = device.upload(&floor)?;
    let mut counts = device.alloc::<u64>(n * SHARD_HISTOGRAM_BUCKETS)?;
    let mut masses = device.alloc::<u64>(n * SHARD_HISTOGRAM_BUCKETS)?;
    for shift in SHIFTS {
        let active: Vec<usize> = (0..searches.len())
            .filter(|&i| progress[i].done.is_none())
            .collect();
        if active.is_empty() {
            break;
        }
        // Rows not searched (or done) get a prefix no key has: their histograms stay empty.
        let mut prefix = vec![u64::MAX; n];
        for &i in &active {
            let p = progress[i];
            prefix[searches[i].row] = p.known >> (shift + 8 - p.low);
        }
        let prefix = device.upload(&prefix)?;
        device.shard_histogram(
            &ShardHistogramInputs {
                rows: *rows,
                prefix: &prefix,
                floor: &floor,
            },
            &mut ShardHistogramOutputs {
                counts: &mut counts,
                masses: &mut masses,
            },
            &ShardHistogramParams {
                shape: shard.shape(n),
                shift,
            },
        )?;
        let local: Vec<u64> = device.download(match target {
            Target::Count => &counts,
            Target::Mass => &masses,
        })?;
        let mut sums: Vec<u64> = active
            .iter()
            .flat_map(|&i| {
                let row = searches[i].row;
                local[row * SHARD_HISTOGRAM_BUCKETS..(row + 1) * SHARD_HISTOGRAM_BUCKETS].to_vec()
            })
            .collect();
        shard.group.sum_u64(&mut sums)?;
        for (&i, histogram) in active.iter().zip(sums.chunks(SHARD_HISTOGRAM_BUCKETS)) {
            let s = searches[i];
            progress[i] = step(progress[i], histogram, shift, target, |ord| {
                // The weight every token of one value has (the argmax-only rows, whose tokens
                // of one value may weigh differently, never come here).
                host.weigher(s.row, s.row_key).weight(ord_value(ord), 0)
            });
        }
    }
    Ok(progress
        .iter()
        .map(|p| p.done.unwrap_or(p.known << p.low))
        .collect())
}

/// One round of one row: picks the bucket where the count or mass from the top reaches `need`,
/// and stops when the rest of that bucket is all needed.
fn step(
    mut p: Progress,
    histogram: &[u64],
    shift: u32,
    target: Target,
    value_weight: impl Fn(u32) -> u64,
) -> Progress {
    let prefix = p.known >> (shift + 8 - p.low);
    // The last round (bits [0, 8) after [4, 12)) overlaps the bits already known: the prefix
    // given to `shard_histogram` cannot hold them, so the buckets whose top bits differ from
    // them (tokens above or below the chosen bucket, counted already) are skipped here.
    let overlap = shift + 8 - p.low;
    let known_top = p.known & ((1u64 << overlap) - 1);
    let mut above = 0u64;
    let mut bucket = 0;
    for b in (0..SHARD_HISTOGRAM_BUCKETS).rev() {
        if overlap > 0 && (b as u64) >> (8 - overlap) != known_top {
            continue;
        }
        if above.saturating_add(histogram[b]) >= p.need {
            bucket = b;
            break;
        }
        above = above.saturating_add(histogram[b]);
    }
    p.need -= above;
    p.known = (prefix << 8) | bucket as u64;
    p.low = shift;
    let in_bucket = histogram[bucket];
    // Every token of the bucket is needed: the threshold is its lowest key.
    let whole = p.need >= in_bucket;
    // The bucket is one value (its ordinal is known): its tokens weigh alike, so the tokens
    // needed follow from the mass.
    let one_value = target == Target::Mass && p.low <= SHARD_KEY_ID_BITS && !whole && {
        let w = value_weight((p.known >> (SHARD_KEY_ID_BITS - p.low)) as u32);
        w > 0 && p.need.div_ceil(w) == in_bucket / w
    };
    if whole || one_value || shift == 0 {
        p.done = Some(p.known << p.low);
    }
    p
}
