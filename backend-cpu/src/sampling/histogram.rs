//! Rank-order selection without sorting a row.
//!
//! The rank order of a row is "rank key descending, then token id ascending" (`docs/semantics.md` §4). Every
//! set the sampling ops work with — the top-k survivors, the top-p kept set, the first C candidates
//! — is a *prefix* of that order, so it is described by a [`Prefix`]: all tokens whose key is above
//! a threshold key, plus the first `take` tokens (by id) whose key equals it.
//!
//! A prefix reaching a target (a count for top-k, a mass for top-p) is found with a histogram over
//! the high 16 bits of the keys (sanitized probabilities are ≤ 1.0, so `key >> 16 ≤ 0x3f80`), a
//! walk over the bins from the top, and an exact pass over the single bin where the target is
//! crossed. Only that bin's tokens are ordered, never the whole row.

use std::cell::RefCell;

use specula_backend_api::FloatElement;
use specula_backend_api::fixed_point::{key_weight, rank_key};

/// Number of histogram bins: `(1.0f32).to_bits() >> 16` is the largest index.
const BINS: usize = (0x3f80_0000 >> 16) + 1;

/// The rank key of the smallest probability with a nonzero weight (`2^-40`): keys at or above it
/// are exactly the tokens with `w > 0`.
pub(crate) const MIN_WEIGHT_KEY: u32 = 0x2b80_0000;

/// A prefix of a row in rank order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prefix {
    /// Tokens with a larger key are in the prefix.
    pub key: u32,
    /// Of the tokens whose key equals `key`, the first `take` by id are in the prefix.
    pub take: usize,
    /// Number of tokens in the prefix (`usize::MAX` when not computed).
    pub count: usize,
    /// Total weight of the prefix.
    pub mass: u64,
}

impl Prefix {
    /// The whole row (count and mass unknown).
    pub const ALL: Prefix = Prefix {
        key: 0,
        take: usize::MAX,
        count: usize::MAX,
        mass: u64::MAX,
    };

    /// The tokens with a nonzero weight (count and mass unknown).
    pub const POSITIVE_WEIGHT: Prefix = Prefix {
        key: MIN_WEIGHT_KEY,
        take: usize::MAX,
        count: usize::MAX,
        mass: u64::MAX,
    };

    /// A membership test for a scan of the row in ascending id order.
    #[inline]
    pub fn member(&self) -> Member {
        Member {
            key: self.key,
            take: self.take,
            seen: 0,
        }
    }
}

/// Tests membership of a [`Prefix`] while the row is scanned in ascending id order.
pub(crate) struct Member {
    key: u32,
    take: usize,
    seen: usize,
}

impl Member {
    /// Whether the next token (in id order) with this key is in the prefix.
    #[inline(always)]
    pub fn admit(&mut self, key: u32) -> bool {
        if key > self.key {
            true
        } else if key == self.key && self.seen < self.take {
            self.seen += 1;
            true
        } else {
            false
        }
    }
}

/// What a target is counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Metric {
    /// Number of tokens (top-k, candidates).
    Count,
    /// Total weight (top-p).
    Mass,
}

/// Per-thread scratch space, allocated once per worker thread and reused for every row.
pub(crate) struct Scratch {
    counts: Vec<u64>,
    mass: Vec<u64>,
    bin: Vec<(u32, u32)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        counts: vec![0; BINS],
        mass: vec![0; BINS],
        bin: Vec::new(),
    });
}

/// Runs `f` with this thread's scratch space.
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}

/// Totals of a subset of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Number of tokens.
    pub count: usize,
    /// Total weight.
    pub mass: u64,
}

#[inline(always)]
fn key_of<T: FloatElement>(v: T) -> u32 {
    rank_key(v.to_f32())
}

/// The first token of the whole row in rank order: the largest key, lowest id.
pub(crate) fn first_prob_in_rank<T: FloatElement>(row: &[T]) -> usize {
    let mut best = 0usize;
    let mut best_key = 0u32;
    for (id, &v) in row.iter().enumerate() {
        let key = key_of(v);
        if key > best_key {
            best_key = key;
            best = id;
        }
    }
    best
}

/// Fills the histogram with the members of `within` and returns their totals.
fn histogram<T: FloatElement>(row: &[T], within: &Prefix, scratch: &mut Scratch) -> Totals {
    scratch.counts.fill(0);
    scratch.mass.fill(0);
    let mut member = within.member();
    let mut totals = Totals { count: 0, mass: 0 };
    for &v in row {
        let key = key_of(v);
        if member.admit(key) {
            let bin = (key >> 16) as usize;
            let w = key_weight(key);
            scratch.counts[bin] += 1;
            scratch.mass[bin] += w;
            totals.count += 1;
            totals.mass += w;
        }
    }
    totals
}

/// The number and total weight of the members of `within`.
pub(crate) fn totals<T: FloatElement>(row: &[T], within: &Prefix, scratch: &mut Scratch) -> Totals {
    histogram(row, within, scratch)
}

/// The shortest prefix of `within` (itself a prefix) whose `metric` reaches `target`.
///
/// Returns `within` with its totals when the whole of it does not reach the target, and an empty
/// prefix for a target of 0.
pub(crate) fn shortest_prefix<T: FloatElement>(
    row: &[T],
    within: &Prefix,
    metric: Metric,
    target: u64,
    scratch: &mut Scratch,
) -> Prefix {
    let totals = histogram(row, within, scratch);
    if target == 0 {
        return Prefix {
            key: u32::MAX,
            take: 0,
            count: 0,
            mass: 0,
        };
    }
    let reached = |count: u64, mass: u64| match metric {
        Metric::Count => count >= target,
        Metric::Mass => mass >= target,
    };
    if !reached(totals.count as u64, totals.mass) {
        return Prefix {
            count: totals.count,
            mass: totals.mass,
            ..*within
        };
    }
    // Walk the bins from the top to the one where the target is crossed.
    let (mut count, mut mass) = (0u64, 0u64);
    let mut crossing = 0;
    for bin in (0..BINS).rev() {
        let (c, m) = (scratch.counts[bin], scratch.mass[bin]);
        if reached(count + c, mass + m) {
            crossing = bin;
            break;
        }
        count += c;
        mass += m;
    }
    // Order the members of that bin exactly: gathered in id order, a stable sort by key
    // descending leaves equal keys in id order, which is the rank order.
    let bin_tokens = &mut scratch.bin;
    bin_tokens.clear();
    let mut member = within.member();
    for (id, &v) in row.iter().enumerate() {
        let key = key_of(v);
        if member.admit(key) && (key >> 16) as usize == crossing {
            bin_tokens.push((key, id as u32));
        }
    }
    bin_tokens.sort_by_key(|&(key, _)| std::cmp::Reverse(key));
    let mut group_start = 0;
    for (i, &(key, _)) in bin_tokens.iter().enumerate() {
        if i > 0 && key != bin_tokens[i - 1].0 {
            group_start = i;
        }
        count += 1;
        mass += key_weight(key);
        if reached(count, mass) {
            return Prefix {
                key,
                take: i - group_start + 1,
                count: count as usize,
                mass,
            };
        }
    }
    // Unreachable: the bin was chosen because its members reach the target.
    Prefix {
        count: totals.count,
        mass: totals.mass,
        ..*within
    }
}

/// The kept set of `top_k_top_p_sample` for one row (`docs/semantics.md` §5.6 steps 1–2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    /// A prefix with a positive mass.
    Prefix(Prefix),
    /// The survivors weigh nothing: the result is this token (the first in rank order).
    Degenerate(usize),
}

/// Applies top-k then top-p to a row.
pub(crate) fn prob_kept_set<T: FloatElement>(row: &[T], top_k: i32, top_p_fixed: u64) -> Kept {
    with_scratch(|scratch| {
        let vocab = row.len();
        let survivors = match usize::try_from(top_k) {
            Ok(k) if k > 0 && k < vocab => {
                shortest_prefix(row, &Prefix::ALL, Metric::Count, k as u64, scratch)
            }
            _ => {
                let totals = histogram(row, &Prefix::ALL, scratch);
                Prefix {
                    count: totals.count,
                    mass: totals.mass,
                    ..Prefix::ALL
                }
            }
        };
        if survivors.mass == 0 {
            return Kept::Degenerate(first_prob_in_rank(row));
        }
        let target =
            specula_backend_api::fixed_point::top_p_target_mass(top_p_fixed, survivors.mass);
        Kept::Prefix(shortest_prefix(
            row,
            &survivors,
            Metric::Mass,
            target,
            scratch,
        ))
    })
}

/// Draws from the members of `prefix` proportionally to their weights: the member, in ascending id
/// order, whose cumulative weight first exceeds `floor(draw · mass / 2^64)`.
pub(crate) fn draw_in_prefix<T: FloatElement>(
    row: &[T],
    prefix: &Prefix,
    draw: u64,
) -> Option<usize> {
    let t = specula_backend_api::fixed_point::scale_draw(draw, prefix.mass);
    let mut member = prefix.member();
    let mut cumulative = 0u64;
    for (id, &v) in row.iter().enumerate() {
        let key = key_of(v);
        if member.admit(key) {
            cumulative += key_weight(key);
            if cumulative > t {
                return Some(id);
            }
        }
    }
    None
}

/// The weight of token `id` within `prefix` (0 for non-members).
pub(crate) fn weight_in_prefix<T: FloatElement>(row: &[T], prefix: &Prefix, id: usize) -> u64 {
    let key = key_of(row[id]);
    if key > prefix.key {
        return key_weight(key);
    }
    if key < prefix.key {
        return 0;
    }
    // Same key as the boundary group: a member iff fewer than `take` group tokens precede it.
    let before = row[..id].iter().filter(|&&v| key_of(v) == key).count();
    if before < prefix.take {
        key_weight(key)
    } else {
        0
    }
}

/// The total weight of a whole row (no sanitizing beyond the contract's).
pub(crate) fn total_weight<T: FloatElement>(row: &[T]) -> u64 {
    row.iter().map(|&v| key_weight(key_of(v))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::lcg::Lcg;

    /// The rank order by a full sort, for checking the histogram selection.
    fn rank_order(row: &[f32]) -> Vec<usize> {
        let mut ids: Vec<usize> = (0..row.len()).collect();
        ids.sort_by(|&a, &b| rank_key(row[b]).cmp(&rank_key(row[a])).then(a.cmp(&b)));
        ids
    }

    fn members(row: &[f32], prefix: &Prefix) -> Vec<usize> {
        let mut member = prefix.member();
        (0..row.len())
            .filter(|&i| member.admit(rank_key(row[i])))
            .collect()
    }

    fn lcg_row(seed: u64, vocab: usize, ties: bool) -> Vec<f32> {
        let mut lcg = Lcg(seed);
        (0..vocab)
            .map(|_| {
                let u = lcg.unit();
                if ties {
                    (u * 8.0).floor() / 64.0
                } else {
                    u * u * u / 100.0
                }
            })
            .collect()
    }

    #[test]
    fn count_prefix_matches_a_full_sort() {
        for seed in 0..40 {
            let row = lcg_row(seed, 1 + (seed as usize * 37) % 500, seed % 2 == 0);
            let order = rank_order(&row);
            for k in [1, 2, 7, row.len() / 2, row.len()] {
                let k = k.clamp(1, row.len());
                let p = with_scratch(|s| {
                    shortest_prefix(&row, &Prefix::ALL, Metric::Count, k as u64, s)
                });
                let mut expected: Vec<usize> = order[..k].to_vec();
                expected.sort();
                assert_eq!(members(&row, &p), expected, "seed {seed} k {k}");
                assert_eq!(p.count, k);
            }
        }
    }

    #[test]
    fn mass_prefix_is_the_shortest_reaching_the_target() {
        for seed in 0..40 {
            let row = lcg_row(seed, 1 + (seed as usize * 53) % 700, seed % 3 == 0);
            let order = rank_order(&row);
            let total = total_weight(&row);
            for frac in [1u64, 3, 50, 99, 100] {
                let target = (total as u128 * frac as u128 / 100) as u64;
                if target == 0 {
                    continue;
                }
                let p =
                    with_scratch(|s| shortest_prefix(&row, &Prefix::ALL, Metric::Mass, target, s));
                let mut mass = 0;
                let mut n = 0;
                while mass < target {
                    mass += specula_backend_api::fixed_point::weight(row[order[n]]);
                    n += 1;
                }
                let mut expected: Vec<usize> = order[..n].to_vec();
                expected.sort();
                assert_eq!(members(&row, &p), expected, "seed {seed} frac {frac}");
                assert_eq!(p.mass, mass);
            }
        }
    }
}
