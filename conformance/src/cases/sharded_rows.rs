//! What the cases of the sharded ops (`docs/semantics.md` §4d, §5.13–§5.17) share: whole rows
//! generated as a runner's, cut to one rank's slice, with the row keys of the whole rows.

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::{ShardRows, ShardShape, VocabSlice};
use specula_backend_api::shard::{KeyOrder, NO_KEY, token_key};

use super::generate::{
    Rng, f32s, float_tensor, logit_row, pick_temperature, prob_row, round_to, rows_with_ties, u64s,
};
use super::{Size, row_gens};
use crate::Result;
use crate::case::{TensorSpec, Want, scores_specs};
use crate::cases::Case;
use crate::exec::{Runner, ScoreBuffers};
use specula_backend_api::Buffer;

/// The slice of a case (`VocabSlice`, as stored in case files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    /// The first id of the slice.
    pub first: usize,
    /// The number of ids.
    pub len: usize,
    /// The whole vocabulary.
    pub vocab: usize,
}

impl From<Slice> for VocabSlice {
    fn from(s: Slice) -> Self {
        VocabSlice {
            first: s.first,
            len: s.len,
            vocab: s.vocab,
        }
    }
}

impl Slice {
    /// The slice of `[first, first + len)` of `vocab`.
    pub const fn new(first: usize, len: usize, vocab: usize) -> Self {
        Slice { first, len, vocab }
    }

    /// The op's shape for `rows` rows.
    pub fn shape(self, rows: usize) -> ShardShape {
        ShardShape {
            rows,
            slice: self.into(),
        }
    }

    /// The name part `<first>_<len>of<vocab>`.
    pub fn name(self) -> String {
        format!("{}_{}of{}", self.first, self.len, self.vocab)
    }
}

/// What the case of every sharded row op (`shard_key`, `shard_records`, `shard_histogram`,
/// `shard_walk`) holds: `rows` rows of `slice`, probabilities or logits. Flattened into each op's
/// `Params`, so a case file keeps these fields beside the op's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceRows {
    /// Rows.
    pub rows: usize,
    /// The slice the rows hold.
    pub slice: Slice,
    /// Logits rows (tensors `logits`, `temperature`) instead of `probs`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logits: bool,
}

impl SliceRows {
    /// `rows` rows of `slice`, logits where `logits` holds.
    pub const fn new(rows: usize, slice: Slice, logits: bool) -> Self {
        SliceRows {
            rows,
            slice,
            logits,
        }
    }

    /// The op's shape.
    pub fn shape(self) -> ShardShape {
        self.slice.shape(self.rows)
    }

    /// The input specs of the scores of the slice: `probs`, or `logits` and `temperature`.
    pub(crate) fn scores_specs(self) -> Vec<TensorSpec> {
        scores_specs(self.logits, ("probs", "logits"), self.rows, self.slice.len)
    }

    /// The input specs of [`ShardRows`]: the scores of the slice, `row_key`, optional `min_p`.
    pub(crate) fn rows_specs(self) -> Vec<TensorSpec> {
        let mut specs = self.scores_specs();
        specs.push(TensorSpec::new("row_key", Want::Is(DType::U64), self.rows));
        specs.push(TensorSpec::new("min_p", Want::Is(DType::F32), self.rows).optional());
        specs
    }
}

/// The uploaded buffers of [`ShardRows`].
pub(crate) struct RowBuffers {
    scores: ScoreBuffers,
    row_key: Buffer,
    min_p: Option<Buffer>,
}

impl RowBuffers {
    /// Uploads the case's scores, `row_key` and `min_p`.
    pub(crate) fn load(r: &mut Runner<'_>, logits: bool) -> Result<Self> {
        Ok(RowBuffers {
            scores: r.scores(logits, "probs", "logits")?,
            row_key: r.input("row_key")?,
            min_p: r.optional("min_p")?,
        })
    }

    /// The buffers as the ops' [`ShardRows`].
    pub(crate) fn rows(&self) -> ShardRows<'_> {
        ShardRows::new(self.scores.scores(), &self.row_key).with_min_p(self.min_p.as_ref())
    }
}

/// Whole rows of a case before they are cut: `[rows, vocab]` values as read back in `dtype`,
/// and the temperatures of logits rows.
#[derive(Clone, Debug)]
pub(crate) struct WholeRows {
    pub dtype: DType,
    pub rows: usize,
    pub vocab: usize,
    pub values: Vec<f32>,
    pub temperature: Option<Vec<f32>>,
}

impl WholeRows {
    /// `rows` rows of a runner's logits (with temperatures) or probabilities, some with ties.
    pub(crate) fn generate(
        rng: &mut Rng,
        dtype: DType,
        shape: (usize, usize),
        logits: bool,
    ) -> Self {
        let (rows, vocab) = shape;
        let values = rows_with_ties(rng, rows, |rng, _| match logits {
            true => logit_row(rng, vocab),
            false => prob_row(rng, vocab),
        });
        let temperature = logits.then(|| (0..rows).map(|_| pick_temperature(rng)).collect());
        WholeRows::of(dtype, (rows, vocab), values, temperature)
    }

    /// The rows of `values` as read back in `dtype`.
    pub(crate) fn of(
        dtype: DType,
        (rows, vocab): (usize, usize),
        values: Vec<f32>,
        temperature: Option<Vec<f32>>,
    ) -> Self {
        WholeRows {
            dtype,
            rows,
            vocab,
            values: round_to(dtype, &values),
            temperature,
        }
    }

    /// Whether the rows are logits.
    pub(crate) fn logits(&self) -> bool {
        self.temperature.is_some()
    }

    /// The case parameters of these rows cut to `slice`.
    pub(crate) fn slice_rows(&self, slice: Slice) -> SliceRows {
        SliceRows::new(self.rows, slice, self.logits())
    }

    /// Row `r`.
    pub(crate) fn row(&self, r: usize) -> &[f32] {
        &self.values[r * self.vocab..(r + 1) * self.vocab]
    }

    /// Each whole row's largest key in `order` (the row keys a runner's MAX gives).
    pub(crate) fn row_keys(&self, order: KeyOrder) -> Vec<u64> {
        (0..self.rows)
            .map(|r| {
                let row = self.row(r);
                (0..row.len())
                    .map(|id| token_key(order, self.logits(), row[id], id))
                    .max()
                    .unwrap_or(NO_KEY)
            })
            .collect()
    }

    /// The slice's values, `[rows, slice.len]`.
    pub(crate) fn cut(&self, slice: Slice) -> Vec<f32> {
        (0..self.rows)
            .flat_map(|r| self.row(r)[slice.first..slice.first + slice.len].to_vec())
            .collect()
    }

    /// `case` with the slice's scores (`probs`, or `logits` and `temperature`) and the whole
    /// rows' keys as `row_key`.
    pub(crate) fn to_case(&self, case: Case, slice: Slice) -> Case {
        let scores = float_tensor(self.dtype, &[self.rows, slice.len], &self.cut(slice));
        let case = match &self.temperature {
            None => case.with("probs", scores),
            Some(t) => case.with("logits", scores).with("temperature", f32s(t)),
        };
        case.with("row_key", u64s(&self.row_keys(KeyOrder::Rank)))
    }
}

/// The slices a generated case cuts from rows of `vocab`: the middle one of three ranks (or the
/// whole row) and the last token alone.
pub(crate) fn slices_of(vocab: usize) -> Vec<Slice> {
    let mut out = Vec::new();
    match VocabSlice::even(vocab, 3, 1) {
        Some(s) => out.push(Slice::new(s.first, s.len, vocab)),
        None => out.push(Slice::new(0, vocab, vocab)),
    }
    if vocab > 1 {
        out.push(Slice::new(vocab - 1, 1, vocab));
    }
    out
}

/// The row shapes of the generated cases: those of the row ops up to `V = 32000` (the sharded
/// ops see one slice of a row, and the reference sorts it).
pub(crate) fn shapes(size: Size, stream: &str, dtype: DType) -> Vec<(String, Rng, (usize, usize))> {
    row_gens(size, stream, dtype)
        .into_iter()
        .filter(|g| g.vocab <= 32_000 && g.rows <= 64)
        .map(|g| (g.name(), g.rng, (g.rows, g.vocab)))
        .collect()
}

/// A per-row min_p for some rows (0: off).
pub(crate) fn min_ps(rng: &mut Rng, rows: usize) -> Vec<f32> {
    (0..rows)
        .map(|_| rng.pick(&[0.0, 0.0, 0.05, 0.3, 1.0]))
        .collect()
}

/// `values` as a u64 tensor of `shape` (a golden output).
pub(crate) fn u64_tensor(shape: &[usize], values: &[u64]) -> crate::tensor::HostTensor {
    crate::tensor::HostTensor::new(shape, values)
}

/// A key built by hand for golden cases: `(ord << 20) | (2^20 − 1 − id)`.
pub(crate) const fn golden_key(ord: u64, id: u64) -> u64 {
    (ord << 20) | (0xF_FFFF - id)
}

/// `KeyOrder` in case files, by name (`rank`, `argmax`).
pub(crate) mod key_order {
    use serde::{Deserialize, Deserializer, Serializer};
    use specula_backend_api::shard::KeyOrder;

    /// Writes the order's name.
    pub(crate) fn serialize<S: Serializer>(order: &KeyOrder, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(order.name())
    }

    /// Reads an order's name.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<KeyOrder, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}
