//! The partition of the vocabulary over the ranks, agreed by every rank.

use specula_backend_api::ops::VocabSlice;

use crate::collective::Group;
use crate::error::{Result, ShardError};

/// Every rank's slice, in rank order: `[s_0, s_1), [s_1, s_2), …, [s_{N−1}, V)` (contiguous,
/// each non-empty), as every rank reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    slices: Vec<VocabSlice>,
    rank: usize,
}

impl Partition {
    /// Exchanges the ranks' slices (one all-gather) and checks that they partition one
    /// vocabulary in rank order: every rank gets the same [`ShardError::Mismatch`] otherwise
    /// (another `V`, a gap, an overlap, an empty slice).
    pub fn agree(group: &Group, slice: VocabSlice) -> Result<Partition> {
        let mine = [slice.first as u64, slice.len as u64, slice.vocab as u64];
        let gathered = group.all_gather(&mine)?;
        let slices: Vec<VocabSlice> = gathered
            .chunks(3)
            .map(|s| VocabSlice {
                first: s[0] as usize,
                len: s[1] as usize,
                vocab: s[2] as usize,
            })
            .collect();
        let mismatch = |what: String| ShardError::Mismatch { what };
        let vocab = slices[0].vocab;
        if let Some((r, s)) = slices.iter().enumerate().find(|(_, s)| s.vocab != vocab) {
            return Err(mismatch(format!(
                "rank 0 has V = {vocab}, rank {r} has V = {}",
                s.vocab
            )));
        }
        let mut next = 0;
        for (r, s) in slices.iter().enumerate() {
            if s.first != next || s.len == 0 {
                return Err(mismatch(format!(
                    "rank {r} holds [{}, {}), expected a non-empty slice from {next} (slices {:?})",
                    s.first,
                    s.first + s.len,
                    slices.iter().map(|s| (s.first, s.len)).collect::<Vec<_>>()
                )));
            }
            next = s.first + s.len;
        }
        if next != vocab {
            return Err(mismatch(format!(
                "the slices end at {next}, not at V = {vocab}"
            )));
        }
        Ok(Partition {
            slices,
            rank: group.rank(),
        })
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.slices.len()
    }

    /// The vocabulary.
    pub fn vocab(&self) -> usize {
        self.slices[0].vocab
    }

    /// This rank's slice.
    pub fn mine(&self) -> VocabSlice {
        self.slices[self.rank]
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Every slice, in rank order.
    pub fn slices(&self) -> &[VocabSlice] {
        &self.slices
    }
}
