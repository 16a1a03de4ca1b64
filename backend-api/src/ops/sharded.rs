//! What the per-rank ops of sharded rows share (`docs/semantics.md` §4d, §5.13–§5.17): the
//! slice of the vocabulary a rank holds, and its rows weighed as rows of the whole vocabulary.

use super::{Check, RowShape, Scores, ScoresKind};
use crate::{Buffer, DType, Error, Result};

/// The ids `[first, first + len)` of a vocabulary of `vocab` tokens: the slice one rank holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VocabSlice {
    /// `s_r`, the first id of the slice.
    pub first: usize,
    /// `s_{r+1} − s_r ≥ 1`, the number of ids.
    pub len: usize,
    /// `V`, the whole vocabulary (`1 ..= 2^20`).
    pub vocab: usize,
}

impl VocabSlice {
    /// The whole vocabulary as one slice (one rank).
    pub const fn whole(vocab: usize) -> Self {
        VocabSlice {
            first: 0,
            len: vocab,
            vocab,
        }
    }

    /// The slice of rank `rank` of `ranks` when `vocab` is split as evenly as possible: the first
    /// `vocab mod ranks` slices have one id more (`None` when `rank ≥ ranks` or a slice would be
    /// empty).
    pub fn even(vocab: usize, ranks: usize, rank: usize) -> Option<Self> {
        if rank >= ranks || vocab < ranks {
            return None;
        }
        let (base, extra) = (vocab / ranks, vocab % ranks);
        let first = rank * base + rank.min(extra);
        let len = base + usize::from(rank < extra);
        Some(VocabSlice { first, len, vocab })
    }

    /// One past the last id (`s_{r+1}`).
    pub const fn end(&self) -> usize {
        self.first + self.len
    }

    /// Whether the global id `id` is in the slice.
    pub fn holds(&self, id: i64) -> bool {
        id >= self.first as i64 && id < self.end() as i64
    }

    /// Validates `1 ≤ vocab ≤ 2^20`, `len ≥ 1` and `first + len ≤ vocab`.
    pub(crate) fn validate(&self, check: &Check<'_>) -> Result<()> {
        check.vocab(self.vocab)?;
        if self.len == 0
            || self
                .first
                .checked_add(self.len)
                .is_none_or(|end| end > self.vocab)
        {
            return Err(Error::invalid(
                check.op,
                "slice",
                format!("1 <= len and first + len <= vocab {}", self.vocab),
                format!("[{}, {} + {})", self.first, self.first, self.len),
            ));
        }
        Ok(())
    }
}

/// The shape of a sharded op's rows: `rows` rows of the slice (`[rows, slice.len]` scores).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardShape {
    /// Number of rows `R`.
    pub rows: usize,
    /// The slice the rows hold.
    pub slice: VocabSlice,
}

impl ShardShape {
    /// The `[rows, slice.len]` matrix shape of the slice's rows.
    pub const fn matrix(&self) -> RowShape {
        RowShape {
            rows: self.rows,
            vocab: self.slice.len,
        }
    }

    /// Validates the slice, that the device runs sharded ops, and the scores' `[rows, len]`
    /// matrix (and temperatures); returns their kind.
    pub(crate) fn validate_scores(
        &self,
        check: &Check<'_>,
        scores: &Scores<'_>,
    ) -> Result<ScoresKind> {
        check.sharded()?;
        self.slice.validate(check)?;
        scores.validate(check, ("probs", "logits"), &self.matrix())
    }
}

/// A rank's rows, weighed as rows of the whole vocabulary (`docs/semantics.md` §4d): the slice's
/// scores, the row key of each whole row, and optionally each row's min_p.
#[derive(Clone, Copy, Debug)]
pub struct ShardRows<'a> {
    /// `[rows, slice.len]` probabilities, or logits with their per-row temperature.
    pub scores: Scores<'a>,
    /// `[rows]` u64: each whole row's row key (the MAX over the ranks of `shard_key` in rank
    /// order; [`NO_KEY`](crate::shard::NO_KEY) when every token is masked): its maximum and its
    /// first token in rank order.
    pub row_key: &'a Buffer,
    /// Optional `[rows]` f32 per-row `min_p` (§4c; 0 or NaN: off), applied against the whole
    /// row's largest weight.
    pub min_p: Option<&'a Buffer>,
}

impl<'a> ShardRows<'a> {
    /// The rows of `scores` with their row keys, without min_p.
    pub fn new(scores: Scores<'a>, row_key: &'a Buffer) -> Self {
        ShardRows {
            scores,
            row_key,
            min_p: None,
        }
    }

    /// These rows with a per-row `min_p` (`None`: off).
    pub fn with_min_p(self, min_p: Option<&'a Buffer>) -> Self {
        ShardRows { min_p, ..self }
    }

    /// Validates the scores, the row keys and the min_p values against `shape`.
    pub(crate) fn validate(&self, check: &Check<'_>, shape: &ShardShape) -> Result<ScoresKind> {
        let kind = shape.validate_scores(check, &self.scores)?;
        check.exact("row_key", self.row_key, DType::U64, shape.rows)?;
        if let Some(min_p) = self.min_p {
            check.exact("min_p", min_p, DType::F32, shape.rows)?;
        }
        Ok(kind)
    }
}
