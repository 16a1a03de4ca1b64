//! The machinery of the sampling ops (`top_k_top_p_sample`, `top_p_candidates`, REJECTION's
//! target rows): the single streaming pass (`scan`), the floor-and-collect fast path (`fast`) and
//! the histogram path for the rows the fast path leaves (`histogram`). All three make the same
//! integer decisions; `docs/performance.md` describes them. Logits rows (`docs/semantics.md` §4b) have their
//! own exact path (`logits`).

use specula_backend_api::fixed_point::{reaches_top_p, top_p_fixed};

pub(crate) mod band;
pub(crate) mod fast;
pub(crate) mod histogram;
#[cfg(test)]
pub(crate) mod lcg;
pub(crate) mod logits;
#[cfg(target_arch = "x86_64")]
pub(crate) mod pack;
#[cfg(test)]
pub(crate) mod probe;
pub(crate) mod scan;

/// One row of `top_p_candidates`' outputs, `ids` and `scores` (C entries each), as every path fills
/// it (the fast path, the histogram path, logits rows).
#[derive(Debug)]
pub(crate) struct CandidateRow<'a> {
    /// The candidates' token ids, -1 past the last.
    pub(crate) ids: &'a mut [i32],
    /// Their scores, 0 past the last.
    pub(crate) scores: &'a mut [f32],
}

impl CandidateRow<'_> {
    /// C, the most candidates the row holds.
    pub(crate) fn capacity(&self) -> usize {
        self.ids.len()
    }

    /// Every entry empty: id -1, score 0.
    pub(crate) fn clear(&mut self) {
        self.ids.fill(-1);
        self.scores.fill(0.0);
    }

    /// The row of a row that weighs nothing: its first token in rank order alone, score 0;
    /// returns `lens`, 1.
    pub(crate) fn only(&mut self, id: usize) -> i32 {
        self.clear();
        self.ids[0] = id as i32;
        1
    }

    /// Writes `members` — `(id, score, weight)` in rank order, at most C — after clearing the row,
    /// and returns `lens`: the length of the shortest prefix whose weight reaches `top_p` of
    /// `total` (every member when none does).
    pub(crate) fn fill(
        &mut self,
        members: impl IntoIterator<Item = (u32, f32, u64)>,
        top_p: f32,
        total: u64,
    ) -> i32 {
        self.clear();
        let p = top_p_fixed(top_p);
        let mut mass = 0u64;
        let mut written = 0;
        let mut lens = None;
        for (id, score, weight) in members {
            self.ids[written] = id as i32;
            self.scores[written] = score;
            written += 1;
            mass += weight;
            if lens.is_none() && reaches_top_p(mass, p, total) {
                lens = Some(written);
            }
        }
        lens.unwrap_or(written) as i32
    }
}
