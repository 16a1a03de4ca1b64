//! `process_logits` (`docs/semantics.md` §5.12, §4c), written from the definition: each row's
//! history is built as a token list (the generated tokens, then the drafts before the row), its
//! counts are the slot's table plus the drafts counted one by one, and every rule is applied token
//! by token in the documented order.

use specula_backend_api::logit_weights::{row_weights, sanitize_logit};
use specula_backend_api::ops::process_logits::{OpCall, PENALTY_FIELDS, mask_words, penalty};
use specula_backend_api::ops::{ProcessInputs, RowBlock, ScoresKind, VocabSlice};
use specula_backend_api::{Op, Result};

use crate::ReferenceDevice;
use crate::layout::{len_or_zero, token_index};
use crate::matrix::FloatMatrix;
use crate::weights::{logit_rank_cmp, sanitize, weight};
use specula_backend_api::host::{ProcessSlices, slice_mut};

const OP: Op = Op::ProcessLogits;

/// The largest count the frequency penalty sees (`2^24`, exact in f32).
const MAX_COUNT: i64 = 1 << 24;

/// The repetition factors must lie in `[2^-32, 2^32]`, or the step is skipped.
const FACTOR_RANGE: std::ops::RangeInclusive<f32> =
    f32::from_bits(0x2f80_0000)..=f32::from_bits(0x4f80_0000);

/// `2^64`, the largest magnitude a logit or an additive parameter is read as.
const HUGE: f32 = f32::from_bits(0x5f80_0000);

/// An additive parameter (bias, β, γ) as the float steps read it: NaN is 0, `|x| < 2^-76` is 0,
/// `|x| > 2^64` is ±2^64 — infinities included (an infinite parameter would make an infinite or
/// NaN logit).
fn additive(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        sanitize_logit(x.clamp(-HUGE, HUGE))
    }
}

/// One slot's parameters as read from the device.
struct SlotParams {
    repetition: Option<(f32, f32)>,
    frequency: f32,
    presence: f32,
    min_p: Option<u64>,
    min_tokens: i64,
    bias: Vec<(usize, f32)>,
    bad_words: Vec<Vec<i32>>,
}

/// Everything the rows read, as host slices (the unpacking shared with the CPU backend,
/// [`ProcessSlices`], which a `Reader` dereferences to); the rules below are the reference's own.
struct Reader<'a>(ProcessSlices<'a>);

impl<'a> std::ops::Deref for Reader<'a> {
    type Target = ProcessSlices<'a>;

    fn deref(&self) -> &ProcessSlices<'a> {
        &self.0
    }
}

/// Bit `v` of a mask row.
fn bit(mask: &[u32], v: usize) -> bool {
    mask[v / 32] >> (v % 32) & 1 == 1
}

/// The range `[offsets[b], offsets[b + 1])` of a list of `len` entries; empty when it is not a
/// valid range.
fn list_range(offsets: &[i32], b: usize, len: usize) -> std::ops::Range<usize> {
    let (start, end) = (offsets[b], offsets[b + 1]);
    match (usize::try_from(start), usize::try_from(end)) {
        (Ok(start), Ok(end)) if start <= end && end <= len => start..end,
        _ => 0..0,
    }
}

impl Reader<'_> {
    /// The slot and position of row `r`; `None` for a row of no slot (a padding row).
    fn source(&self, r: usize) -> Option<(usize, usize)> {
        let b = usize::try_from(self.batch_id[r])
            .ok()
            .filter(|&b| b < self.real_bsz)?;
        let pos = r as i64 - i64::from(self.cu_out[b]);
        let pos = usize::try_from(pos).ok().filter(|&i| i < self.s)?;
        Some((b, pos))
    }

    fn slot_params(&self, b: usize) -> SlotParams {
        let p = &self.penalties[b * PENALTY_FIELDS..(b + 1) * PENALTY_FIELDS];
        let (alpha, inverse) = (p[penalty::REPETITION], p[penalty::REPETITION_INVERSE]);
        let repetition = (FACTOR_RANGE.contains(&alpha) && FACTOR_RANGE.contains(&inverse))
            .then_some((alpha, inverse));
        let min_p = p[penalty::MIN_P];
        let min_p = (min_p > 0.0)
            .then(|| (f64::from(min_p.min(1.0)) * f64::from(1u32 << 24)).ceil() as u64);
        let bias = list_range(self.bias_offsets, b, self.bias_ids.len())
            .filter_map(|k| {
                Some((
                    token_index(self.bias_ids[k], self.vocab)?,
                    self.bias_values[k],
                ))
            })
            .collect();
        SlotParams {
            repetition,
            frequency: additive(p[penalty::FREQUENCY]),
            presence: additive(p[penalty::PRESENCE]),
            min_p,
            min_tokens: i64::from(self.min_tokens[b]),
            bias,
            bad_words: self.bad_word_entries(b),
        }
    }

    /// Slot `b`'s bad-word entries; parsing stops at the first entry that is malformed.
    fn bad_word_entries(&self, b: usize) -> Vec<Vec<i32>> {
        let range = list_range(self.bad_word_offsets, b, self.bad_words.len());
        let list = &self.bad_words[range];
        let mut entries = Vec::new();
        let mut k = 0;
        while k < list.len() {
            let n = list[k];
            if n < 1 || n as usize >= list.len() - k {
                break;
            }
            entries.push(list[k + 1..=k + n as usize].to_vec());
            k += n as usize + 1;
        }
        entries
    }

    /// The history of row `(b, pos)`: the generated tokens, then `draft_tokens[b, 1 ..= pos]`.
    fn history(&self, b: usize, pos: usize) -> Vec<i32> {
        let row = &self.token_ids_all[b * self.max_model_len..(b + 1) * self.max_model_len];
        let prompt = len_or_zero(self.prompt_lens[b]).min(self.max_model_len);
        let end = (prompt + len_or_zero(self.step_idx[b])).min(self.max_model_len);
        let mut history = row[prompt..end].to_vec();
        history.extend_from_slice(&self.draft_tokens[b * self.s + 1..b * self.s + 1 + pos]);
        history
    }

    /// Which tokens row `r` of slot `b` (position `pos`) masks.
    fn masked(
        &self,
        r: usize,
        b: usize,
        pos: usize,
        slot: &SlotParams,
        history: &[i32],
    ) -> Vec<bool> {
        let v_len = self.vocab;
        let mut masked = vec![false; v_len];
        let generated = i64::from(self.step_idx[b].max(0)) + pos as i64;
        if generated < slot.min_tokens {
            for &e in self.end_tokens {
                if let Some(e) = token_index(e, v_len) {
                    masked[e] = true;
                }
            }
        }
        for entry in &slot.bad_words {
            let Some((last, prefix)) = entry.split_last() else {
                continue;
            };
            if history.ends_with(prefix)
                && let Some(v) = token_index(*last, v_len)
            {
                masked[v] = true;
            }
        }
        let words = mask_words(v_len);
        if let Some(allowed) = self.allowed {
            let row = &allowed[b * words..(b + 1) * words];
            (0..v_len)
                .filter(|&v| !bit(row, v))
                .for_each(|v| masked[v] = true);
        }
        if let Some(bitmask) = self.bitmask {
            let row = &bitmask[r * words..(r + 1) * words];
            (0..v_len)
                .filter(|&v| !bit(row, v))
                .for_each(|v| masked[v] = true);
        }
        masked
    }

    /// `count[v]`: the slot's table (negative entries are 0) plus the drafts before the row,
    /// capped at `2^24`.
    fn counts(&self, b: usize, pos: usize) -> Vec<i64> {
        let table = &self.token_counts[b * self.vocab..(b + 1) * self.vocab];
        let mut counts: Vec<i64> = table.iter().map(|&c| i64::from(c.max(0))).collect();
        for &d in &self.draft_tokens[b * self.s + 1..b * self.s + 1 + pos] {
            if let Some(d) = token_index(d, self.vocab) {
                counts[d] += 1;
            }
        }
        counts.iter_mut().for_each(|c| *c = (*c).min(MAX_COUNT));
        counts
    }
}

/// The float steps of one unmasked logit (`docs/semantics.md` §4c): bias, repetition, frequency
/// and presence, each an f32 operation whose result is sanitized as §4b step 1 reads logits. When
/// they end on the value they started from, the output is the input logit itself (NaN as −inf),
/// so that a token no step changes keeps its rank (§4b step 1 ranks the logit, not its reading).
fn process_logit(l: f32, bias: Option<f32>, in_prompt: bool, count: i64, slot: &SlotParams) -> f32 {
    let read = sanitize_logit(l);
    let mut x = read;
    if let Some(bias) = bias {
        x = sanitize_logit(x + additive(bias));
    }
    if let Some((alpha, inverse)) = slot.repetition
        && (in_prompt || count > 0)
    {
        x = sanitize_logit(if x > 0.0 { x * inverse } else { x * alpha });
    }
    if count > 0 {
        x = sanitize_logit(x - slot.frequency * count as f32);
        x = sanitize_logit(x - slot.presence);
    }
    match (x == read, l.is_nan()) {
        (true, true) => f32::NEG_INFINITY,
        (true, false) => l,
        (false, _) => x,
    }
}

/// Processes the rows of the block: scores row `block.first + i` into output row `i`. The scores
/// hold the ids of `ids` (the whole vocabulary, or one rank's slice, `docs/semantics.md` §4d);
/// every rule reads its tables by global id, and a slice skips min_p.
fn process_logits(
    kind: ScoresKind,
    inputs: &ProcessInputs<'_>,
    r: &Reader<'_>,
    (rows, block, ids): (usize, RowBlock, VocabSlice),
    out: (&mut [f32], &mut [i32]),
) -> Result<()> {
    let width = ids.len;
    let matrix = FloatMatrix::new(OP, kind.dtype, inputs.scores.matrix(), rows, width)?;
    let temperature = r.temperature;
    let (processed, fallback) = out;
    let masked_value = if kind.logits { f32::NEG_INFINITY } else { 0.0 };
    let whole = ids.len == r.vocab;
    for i in 0..block.rows {
        let row = block.first + i;
        let values = matrix.row(row).unwrap_or_default();
        let dst = &mut processed[i * width..(i + 1) * width];
        let Some((b, pos)) = r.source(row) else {
            dst.fill(masked_value);
            fallback[i] = -1;
            continue;
        };
        let slot = r.slot_params(b);
        let history = r.history(b, pos);
        let masked = r.masked(row, b, pos, &slot, &history);
        let masked = &masked[ids.first..ids.end()];
        let counts = r.counts(b, pos);
        let words = mask_words(r.vocab);
        let prompt = &r.prompt_mask[b * words..(b + 1) * words];
        let mut bias = vec![None; r.vocab];
        for &(v, value) in &slot.bias {
            bias[v] = Some(value);
        }
        for (j, v) in (ids.first..ids.end()).enumerate() {
            dst[j] = if masked[j] {
                masked_value
            } else if kind.logits {
                process_logit(values[j], bias[v], bit(prompt, v), counts[v], &slot)
            } else {
                sanitize(values[j])
            };
        }
        fallback[i] = match first_unmasked(dst, masked, kind.logits) {
            -1 => -1,
            j => ids.first as i32 + j,
        };
        if let Some(min_p) = slot.min_p.filter(|_| whole) {
            let t = temperature.map_or(1.0, |t| t[row]);
            drop_below_min_p(dst, masked, kind.logits, t, min_p, masked_value);
        }
    }
    Ok(())
}

/// The first unmasked token in rank order (value descending, then id), or -1.
fn first_unmasked(row: &[f32], masked: &[bool], logits: bool) -> i32 {
    // Probabilities are sanitized here (never NaN): their float order is their rank order.
    let before = |v: usize, b: usize| {
        if logits {
            logit_rank_cmp(row[v], row[b]).is_lt()
        } else {
            row[v] > row[b]
        }
    };
    let mut best: Option<usize> = None;
    for v in (0..row.len()).filter(|&v| !masked[v]) {
        if best.is_none_or(|b| before(v, b)) {
            best = Some(v);
        }
    }
    best.map_or(-1, |v| v as i32)
}

/// min_p: tokens with `w · 2^24 < MINP · w_max` become `dropped` (weights of the processed row).
fn drop_below_min_p(
    row: &mut [f32],
    masked: &[bool],
    logits: bool,
    t: f32,
    min_p: u64,
    dropped: f32,
) {
    let weights: Vec<u64> = if logits {
        row_weights(row, t)
    } else {
        row.iter().map(|&p| weight(p)).collect()
    };
    let w_max = (0..row.len())
        .filter(|&v| !masked[v])
        .map(|v| weights[v])
        .max()
        .unwrap_or(0);
    for (v, value) in row.iter_mut().enumerate() {
        if u128::from(weights[v]) << 24 < u128::from(min_p) * u128::from(w_max) {
            *value = dropped;
        }
    }
}

/// Runs a validated `process_logits` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let shape = params.shape;
    let reader = Reader(ProcessSlices::new(inputs, params)?);
    let processed = slice_mut::<f32>(out.processed)?;
    let fallback = slice_mut::<i32>(out.fallback)?;
    let rows = (shape.rows, params.row_block(), params.ids());
    process_logits(*kind, inputs, &reader, rows, (processed, fallback))
}
