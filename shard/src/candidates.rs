//! Sharded `top_p_candidates` (`docs/semantics.md` §5.7, §4d): the first C gathered records with
//! a positive weight, and the row's total weight.

use specula_backend_api::DeviceExt;
use specula_backend_api::fixed_point::{reaches_top_p, top_p_fixed};
use specula_backend_api::shard::{KeyOrder, key_id, key_value};

use crate::error::{Result, ShardError};
use crate::rows::{Shard, SliceRows};
use crate::sample::{gather_records, gather_rows, walk};

/// The candidates of the rows: `[rows, C]` ids and scores and `[rows]` lens, as the unsharded op
/// writes them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidates {
    /// `[rows, C]` ids, -1 padding.
    pub ids: Vec<i32>,
    /// `[rows, C]` scores, 0 padding.
    pub scores: Vec<f32>,
    /// `[rows]` lens.
    pub lens: Vec<i32>,
}

/// `top_p_candidates` of the whole rows of which this rank holds `rows`: `top_p` per row,
/// `candidates = C`, and `padding[r]` for the rows whose `batch_id_per_token_output` is negative
/// (ids -1, scores 0, lens 0).
pub fn top_p_candidates(
    shard: &Shard<'_>,
    rows: &SliceRows<'_>,
    top_p: &[f32],
    candidates: usize,
    padding: Option<&[bool]>,
) -> Result<Candidates> {
    let n = top_p.len();
    if candidates == 0 || candidates > specula_backend_api::abi::MAX_CANDIDATES {
        return Err(ShardError::InvalidArgument {
            what: format!("candidates {candidates} not in 1 ..= 128"),
        });
    }
    let row_keys = shard.row_keys(rows, n, KeyOrder::Rank)?;
    let zero = shard.zero_tokens(rows, &row_keys)?;
    let key_buffer = shard.device.upload(&row_keys)?;
    let weighed = crate::rows::Shard::weighed(rows, &key_buffer);
    let k = vec![candidates; n];
    let gathered = gather_records(shard, &weighed, &k)?;
    let (_, mass) = walk(shard, &weighed, &vec![0; n], &vec![u64::MAX; n])?;
    let all: Vec<usize> = (0..n).collect();
    let totals: Vec<u64> = gather_rows(shard, &mass, &all)?
        .iter()
        .map(|m| m.iter().sum())
        .collect();
    let mut out = Candidates {
        ids: vec![-1; n * candidates],
        scores: vec![0.0; n * candidates],
        lens: vec![0; n],
    };
    for (r, mut records) in gathered {
        if padding.is_some_and(|p| p[r]) {
            continue;
        }
        let (ids, scores) = (
            &mut out.ids[r * candidates..(r + 1) * candidates],
            &mut out.scores[r * candidates..(r + 1) * candidates],
        );
        let total = totals[r];
        if total == 0 {
            ids[0] = zero[r];
            out.lens[r] = i32::from(ids[0] >= 0);
            continue;
        }
        records.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
        let p = top_p_fixed(top_p[r]);
        let (mut mass, mut lens, mut count) = (0u64, None, 0);
        for (i, &(key, w)) in records
            .iter()
            .filter(|(_, w)| *w > 0)
            .take(candidates)
            .enumerate()
        {
            ids[i] = key_id(key) as i32;
            scores[i] = score(rows.scores.is_logits(), key, w, total);
            mass += w;
            count = i + 1;
            if lens.is_none() && reaches_top_p(mass, p, total) {
                lens = Some(count);
            }
        }
        out.lens[r] = lens.unwrap_or(count) as i32;
    }
    Ok(out)
}

/// A candidate's score: its sanitized probability (the value its key carries), or for a logits
/// row `q = floor(w · 2^40 / W)` cut to its 24 most significant bits, as `q · 2^-40`.
fn score(logits: bool, key: u64, w: u64, total: u64) -> f32 {
    if !logits {
        return key_value(key);
    }
    let q = ((u128::from(w) << 40) / u128::from(total)) as u64;
    let low_bits = (64 - q.leading_zeros()).saturating_sub(24);
    let q = q >> low_bits << low_bits;
    (q as f64 / (1u64 << 40) as f64) as f32
}
