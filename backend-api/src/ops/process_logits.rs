//! `process_logits` (`docs/semantics.md` §5.12, §4c): arguments and validation.
//!
//! The op applies every per-request sampling parameter of §4c to each output row, from that row's
//! own history (the generated tokens plus the drafts before the row): masks (min_tokens, bad words,
//! allowed token ids, a runner-supplied bitmask), logit bias, repetition / frequency / presence
//! penalties and min_p. Its outputs feed the sampling ops: `processed` in place of the rows, and
//! `fallback` as their `fallback` input (the token a row yields when its total weight is 0).

use super::{BatchDims, Check, OutputLayout, RowShape, Scores, ScoresKind, VocabSlice};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Error, Op, Result};

/// A validated `process_logits`. Facts: the scores' dtype and kind. Nothing to launch when
/// `rows == 0`.
pub type ProcessLogitsCall<'c, 'o> =
    Call<'c, ProcessInputs<'c>, ProcessOutputs<'o>, ProcessParams<'c>, ScoresKind>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = ProcessLogitsCall<'c, 'o>;

/// Entries per slot of the `penalties` table: `α, α⁻¹, β, γ, min_p`.
pub const PENALTY_FIELDS: usize = 5;

/// The column of each field in a `penalties` row.
pub mod penalty {
    /// Repetition penalty `α` (> 0; 1 = off).
    pub const REPETITION: usize = 0;
    /// `α⁻¹ = f32(1/α)`, computed on the host.
    pub const REPETITION_INVERSE: usize = 1;
    /// Frequency penalty `β` (0 = off).
    pub const FREQUENCY: usize = 2;
    /// Presence penalty `γ` (0 = off).
    pub const PRESENCE: usize = 3;
    /// `min_p` in [0, 1] (0 = off).
    pub const MIN_P: usize = 4;
}

/// The words of a token bitmask row: `ceil(vocab / 32)`.
pub const fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// The history each output row is processed against (`docs/semantics.md` §4c).
#[derive(Clone, Copy, Debug)]
pub struct TokenHistory<'a> {
    /// `[max_bsz, max_model_len]` i32: prompt then generated tokens (read for multi-token bad
    /// words: the generated tokens `[prompt_lens[b], prompt_lens[b] + step_idx[b])`).
    pub token_ids_all: &'a Buffer,
    /// `[max_bsz]` i32 prompt length per slot.
    pub prompt_lens: &'a Buffer,
    /// `[max_bsz]` i32 tokens generated so far.
    pub step_idx: &'a Buffer,
    /// `[max_bsz, S]` i32: position 0 the last accepted token, positions 1.. the drafts.
    pub draft_tokens: &'a Buffer,
    /// `[max_bsz, vocab]` i32: occurrences of each token among the slot's generated tokens, kept by
    /// `update_state` (negative entries count as 0).
    pub token_counts: &'a Buffer,
    /// `[max_bsz, ceil(vocab / 32)]` u32: bit `v mod 32` of word `v / 32` is set when `v` occurs in
    /// the prompt (the repetition penalty applies to it).
    pub prompt_mask: &'a Buffer,
}

/// Per-slot parameters and token lists (`docs/semantics.md` §4c).
#[derive(Clone, Copy, Debug)]
pub struct SlotProcessing<'a> {
    /// `[max_bsz, 5]` f32: `α, α⁻¹, β, γ, min_p` per slot (see [`penalty`]).
    pub penalties: &'a Buffer,
    /// `[max_bsz]` i32: end tokens are masked while the generated position is below it.
    pub min_tokens: &'a Buffer,
    /// `[E]` i32, `E ≥ 1`: the end tokens `min_tokens` masks.
    pub end_tokens: &'a Buffer,
    /// `[max_bsz + 1]` i32: slot `b`'s bias entries are `bias_offsets[b] .. bias_offsets[b + 1]`.
    pub bias_offsets: &'a Buffer,
    /// `[NB ≥ 1]` i32 token ids of the bias entries.
    pub bias_ids: &'a Buffer,
    /// `[NB]` f32 values of the bias entries.
    pub bias_values: &'a Buffer,
    /// `[max_bsz + 1]` i32: slot `b`'s bad words are `bad_words[bad_word_offsets[b] ..
    /// bad_word_offsets[b + 1]]`.
    pub bad_word_offsets: &'a Buffer,
    /// `[NW ≥ 1]` i32: each entry is its length `n ≥ 1` followed by its `n` tokens.
    pub bad_words: &'a Buffer,
    /// Optional `[max_bsz, ceil(vocab / 32)]` u32 allowed-token masks (all ones: no restriction).
    pub allowed: Option<&'a Buffer>,
}

/// The per-slot tables of [`SlotProcessing`], owned: kept on the device (by a runner, a bench, a
/// test) and lent to each call with [`slots`](ProcessingTables::slots), beside the end tokens
/// (which other ops read too) and the optional allowed-token masks.
#[derive(Debug)]
pub struct ProcessingTables {
    /// See [`SlotProcessing::penalties`].
    pub penalties: Buffer,
    /// See [`SlotProcessing::min_tokens`].
    pub min_tokens: Buffer,
    /// See [`SlotProcessing::bias_offsets`].
    pub bias_offsets: Buffer,
    /// See [`SlotProcessing::bias_ids`].
    pub bias_ids: Buffer,
    /// See [`SlotProcessing::bias_values`].
    pub bias_values: Buffer,
    /// See [`SlotProcessing::bad_word_offsets`].
    pub bad_word_offsets: Buffer,
    /// See [`SlotProcessing::bad_words`].
    pub bad_words: Buffer,
}

impl ProcessingTables {
    /// The tables, lent as the per-slot parameters of one call, with `end_tokens` and the
    /// allowed-token masks `allowed`.
    pub fn slots<'a>(
        &'a self,
        end_tokens: &'a Buffer,
        allowed: Option<&'a Buffer>,
    ) -> SlotProcessing<'a> {
        SlotProcessing {
            penalties: &self.penalties,
            min_tokens: &self.min_tokens,
            end_tokens,
            bias_offsets: &self.bias_offsets,
            bias_ids: &self.bias_ids,
            bias_values: &self.bias_values,
            bad_word_offsets: &self.bad_word_offsets,
            bad_words: &self.bad_words,
            allowed,
        }
    }
}

/// Inputs of `process_logits`.
#[derive(Clone, Copy, Debug)]
pub struct ProcessInputs<'a> {
    /// `[rows, vocab]` logits with their per-row temperature (min_p weighs them by §4b), or
    /// probabilities (masks and min_p only).
    pub scores: Scores<'a>,
    /// The output layout: the slot of each row, and the first row of each slot.
    pub layout: OutputLayout<'a>,
    /// The history of each row.
    pub history: TokenHistory<'a>,
    /// The per-slot parameters.
    pub slots: SlotProcessing<'a>,
    /// Optional `[rows, ceil(vocab / 32)]` u32 runner bitmask (structured output): a 0 bit masks
    /// the token.
    pub bitmask: Option<&'a Buffer>,
}

/// The processing of `process_logits` without its scores: what a sampling op takes to apply the
/// processing to its own rows itself (the fused form, `docs/semantics.md` §5.12), every row of
/// the scores at once.
#[derive(Clone, Copy, Debug)]
pub struct RowProcessing<'a> {
    /// The output layout: the slot of each row, and the first row of each slot.
    pub layout: OutputLayout<'a>,
    /// The history of each row.
    pub history: TokenHistory<'a>,
    /// The per-slot parameters.
    pub slots: SlotProcessing<'a>,
    /// Optional `[rows, ceil(vocab / 32)]` u32 runner bitmask (a 0 bit masks the token).
    pub bitmask: Option<&'a Buffer>,
    /// The batch shape.
    pub dims: BatchDims,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
    /// Host copies of the parameters, for validation.
    pub host: Option<HostProcessing<'a>>,
}

impl<'a> RowProcessing<'a> {
    /// The `process_logits` inputs of these rows of `scores`.
    pub fn inputs(&self, scores: Scores<'a>) -> ProcessInputs<'a> {
        ProcessInputs {
            scores,
            layout: self.layout,
            history: self.history,
            slots: self.slots,
            bitmask: self.bitmask,
        }
    }

    /// The `process_logits` parameters of every row of a `shape` matrix.
    pub fn params(&self, shape: RowShape) -> ProcessParams<'a> {
        ProcessParams {
            dims: self.dims,
            shape,
            block: None,
            slice: None,
            max_model_len: self.max_model_len,
            host: self.host,
        }
    }
}

/// A block of consecutive rows of the scores: rows `first .. first + rows`.
///
/// `process_logits` can process a block of the step's rows at a time (a CPU keeps the block in
/// its caches between `process_logits` and the sampling op that reads it). Row `first + i` of
/// every per-row input — the scores, their temperatures, the layout and the bitmask — becomes
/// row `i` of the outputs; the output layout still places each row in its slot, so the block's
/// rows have the history of their absolute positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowBlock {
    /// The first row of the block.
    pub first: usize,
    /// The number of rows in the block.
    pub rows: usize,
}

/// Outputs of `process_logits`.
#[derive(Debug)]
pub struct ProcessOutputs<'a> {
    /// `[rows, vocab]` f32 (`rows` of the block; `[rows, slice.len]` with
    /// [`ProcessParams::slice`]): the processed rows (masked and min_p-dropped tokens are −inf
    /// for logits, 0 for probabilities).
    pub processed: &'a mut Buffer,
    /// `[rows]` i32 (`rows` of the block): the token a row yields when its total weight is 0 —
    /// its first unmasked token in rank order, or -1 when every token is masked (with
    /// [`ProcessParams::slice`]: the slice's first unmasked token, a global id, or -1).
    pub fallback: &'a mut Buffer,
}

/// Host copies of the per-slot values, for validation.
#[derive(Clone, Copy, Debug)]
pub struct HostProcessing<'a> {
    /// `[max_bsz, 5]` as on the device.
    pub penalties: &'a [f32],
    /// The bias ids in use (each in `[0, vocab)`; may be empty).
    pub bias_ids: &'a [i32],
    /// The bias values in use (each finite).
    pub bias_values: &'a [f32],
    /// The encoded bad words in use (every token in `[0, vocab)`, every length ≥ 1; may be empty).
    pub bad_words: &'a [i32],
}

/// Parameters of `process_logits`.
#[derive(Clone, Copy, Debug)]
pub struct ProcessParams<'a> {
    /// The batch shape.
    pub dims: BatchDims,
    /// The rows (`rows ≤` the layout's row capacity) and the vocabulary `V` of the tables: the
    /// scores are `[rows, vocab]`, or `[rows, slice.len]` with [`ProcessParams::slice`].
    pub shape: RowShape,
    /// The rows processed: `None` for all of them, else a block of them (`first + rows ≤
    /// shape.rows`); the outputs hold the block's rows.
    pub block: Option<RowBlock>,
    /// The rows are one rank's slice of sharded rows (`docs/semantics.md` §4d, §5.12): the
    /// scores and `processed` hold the ids `[first, first + len)` of a vocabulary of
    /// `shape.vocab` tokens (`slice.vocab == shape.vocab`), every other input is the whole
    /// table (indexed by global id), and min_p is not applied (it needs the whole row's
    /// maximum: the sharded ops apply it). Needs [`Capabilities::sliced_processing`]
    /// (`Unsupported` otherwise). `None`: whole rows.
    ///
    /// [`Capabilities::sliced_processing`]: crate::Capabilities::sliced_processing
    pub slice: Option<VocabSlice>,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
    /// Host copies of the parameters, for validation.
    pub host: Option<HostProcessing<'a>>,
}

impl ProcessParams<'_> {
    /// The rows processed: [`ProcessParams::block`], or every row of the scores.
    pub fn row_block(&self) -> RowBlock {
        self.block.unwrap_or(RowBlock {
            first: 0,
            rows: self.shape.rows,
        })
    }

    /// The ids the scores hold: [`ProcessParams::slice`], or the whole vocabulary.
    pub fn ids(&self) -> VocabSlice {
        self.slice
            .unwrap_or_else(|| VocabSlice::whole(self.shape.vocab))
    }

    /// The matrix shape of the scores and of `processed`: `[rows, slice.len]`.
    pub fn scores_shape(&self) -> RowShape {
        RowShape {
            rows: self.shape.rows,
            vocab: self.ids().len,
        }
    }
}

/// Validates `process_logits`.
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    inputs: &ProcessInputs<'c>,
    out: &'c mut ProcessOutputs<'o>,
    params: &ProcessParams<'c>,
) -> Result<ProcessLogitsCall<'c, 'o>> {
    let check = Check::new(Op::ProcessLogits, device);
    validate_slice(&check, device, params)?;
    let (kind, block) = validate_processing(&check, device, inputs, params)?;
    let width = params.ids().len;
    let len = check.product("processed", block.rows, width)?;
    check.exact("processed", out.processed, DType::F32, len)?;
    check.exact("fallback", out.fallback, DType::I32, block.rows)?;
    let call = Call::new(*inputs, out, *params, kind);
    Ok(call
        .with_extent(block.rows, width)
        .launching_nothing_if(block.rows == 0))
}

/// A slice (`docs/semantics.md` §4d) lies within the tables' vocabulary, on a device that
/// processes slices.
fn validate_slice(
    check: &Check<'_>,
    device: &DeviceDesc,
    params: &ProcessParams<'_>,
) -> Result<()> {
    let Some(slice) = params.slice else {
        return Ok(());
    };
    if !device.capabilities.sliced_processing {
        return Err(Error::Unsupported {
            backend: device.info.kind,
            op: check.op,
            what: "logits processing of a vocabulary slice".to_owned(),
        });
    }
    slice.validate(check)?;
    if slice.vocab != params.shape.vocab {
        return Err(Error::invalid(
            check.op,
            "slice",
            format!("a slice of the vocabulary {}", params.shape.vocab),
            format!("a slice of {}", slice.vocab),
        ));
    }
    Ok(())
}

/// Every check of `process_logits` but its outputs': the scores' kind and the rows processed.
/// `check` names the op the errors report (`process_logits`, or the sampling op that applies
/// the processing itself).
pub(crate) fn validate_processing(
    check: &Check<'_>,
    device: &DeviceDesc,
    inputs: &ProcessInputs<'_>,
    params: &ProcessParams<'_>,
) -> Result<(ScoresKind, RowBlock)> {
    if !device.capabilities.processing {
        return Err(Error::Unsupported {
            backend: device.info.kind,
            op: check.op,
            what: "logits processing".to_owned(),
        });
    }
    let dims = &params.dims;
    let shape = &params.shape;
    dims.validate(check.op)?;
    let kind = inputs
        .scores
        .validate(check, ("probs", "logits"), &params.scores_shape())?;
    let capacity = inputs.layout.validate(check, dims)?;
    if shape.rows > capacity {
        // More rows than the layout describes (`batch_id_per_token_output` has one entry per
        // output row): the rows' buffer is refused, the most it may hold being capacity · V.
        return Err(Error::ShapeMismatch {
            op: check.op,
            arg: if kind.logits { "logits" } else { "probs" },
            expected: capacity.saturating_mul(shape.vocab),
            actual: inputs.scores.matrix().len(),
        });
    }
    validate_history(check, &inputs.history, params)?;
    validate_slots(check, &inputs.slots, params)?;
    let words = check.product("bitmask", shape.rows, mask_words(shape.vocab))?;
    if let Some(bitmask) = inputs.bitmask {
        check.exact("bitmask", bitmask, DType::U32, words)?;
    }
    if let Some(host) = &params.host {
        validate_host(check, host, dims.max_bsz, shape.vocab)?;
    }
    Ok((kind, validate_block(check, params)?))
}

/// The block lies within the scores' rows.
fn validate_block(check: &Check<'_>, params: &ProcessParams<'_>) -> Result<RowBlock> {
    let block = params.row_block();
    match block.first.checked_add(block.rows) {
        Some(end) if end <= params.shape.rows => Ok(block),
        _ => Err(Error::invalid(
            check.op,
            "block",
            format!("first + rows <= rows {}", params.shape.rows),
            format!("first {}, rows {}", block.first, block.rows),
        )),
    }
}

/// The per-slot history buffers.
fn validate_history(
    check: &Check<'_>,
    h: &TokenHistory<'_>,
    params: &ProcessParams<'_>,
) -> Result<()> {
    let dims = &params.dims;
    let n = dims.max_bsz;
    let all = check.product("token_ids_all", n, params.max_model_len)?;
    check.exact("token_ids_all", h.token_ids_all, DType::I32, all)?;
    check.exact("prompt_lens", h.prompt_lens, DType::I32, n)?;
    check.exact("step_idx", h.step_idx, DType::I32, n)?;
    let slot_tokens = check.product("draft_tokens", n, dims.max_step_tokens)?;
    check.exact("draft_tokens", h.draft_tokens, DType::I32, slot_tokens)?;
    let counts = check.product("token_counts", n, params.shape.vocab)?;
    check.exact("token_counts", h.token_counts, DType::I32, counts)?;
    let words = check.product("prompt_mask", n, mask_words(params.shape.vocab))?;
    check.exact("prompt_mask", h.prompt_mask, DType::U32, words)
}

/// The per-slot parameters and lists.
fn validate_slots(
    check: &Check<'_>,
    s: &SlotProcessing<'_>,
    params: &ProcessParams<'_>,
) -> Result<()> {
    let n = params.dims.max_bsz;
    let table = check.product("penalties", n, PENALTY_FIELDS)?;
    check.exact("penalties", s.penalties, DType::F32, table)?;
    check.exact("min_tokens", s.min_tokens, DType::I32, n)?;
    check.at_least("end_tokens", s.end_tokens, DType::I32, 1)?;
    check.exact("bias_offsets", s.bias_offsets, DType::I32, n + 1)?;
    let entries = check.at_least("bias_ids", s.bias_ids, DType::I32, 1)?;
    check.exact("bias_values", s.bias_values, DType::F32, entries)?;
    check.exact("bad_word_offsets", s.bad_word_offsets, DType::I32, n + 1)?;
    check.at_least("bad_words", s.bad_words, DType::I32, 1)?;
    if let Some(allowed) = s.allowed {
        let words = check.product("allowed", n, mask_words(params.shape.vocab))?;
        check.exact("allowed", allowed, DType::U32, words)?;
    }
    Ok(())
}

/// Host copies: finite penalties with `α > 0` and `min_p ∈ [0, 1]`; ids in `[0, vocab)`; finite
/// bias values; well-formed bad-word entries.
fn validate_host(
    check: &Check<'_>,
    host: &HostProcessing<'_>,
    max_bsz: usize,
    vocab: usize,
) -> Result<()> {
    let table = max_bsz * PENALTY_FIELDS;
    if host.penalties.len() != table {
        return Err(Error::ShapeMismatch {
            op: check.op,
            arg: "host penalties",
            expected: table,
            actual: host.penalties.len(),
        });
    }
    for (b, row) in host.penalties.chunks_exact(PENALTY_FIELDS).enumerate() {
        check_penalty_row(check, b, row)?;
    }
    let in_vocab = |id: i32| usize::try_from(id).is_ok_and(|v| v < vocab);
    if let Some((i, id)) = host
        .bias_ids
        .iter()
        .enumerate()
        .find(|(_, id)| !in_vocab(**id))
    {
        return Err(Error::invalid(
            check.op,
            "bias_ids",
            format!("entry {i} in [0, {vocab})"),
            id,
        ));
    }
    if let Some((i, v)) = host
        .bias_values
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite())
    {
        return Err(Error::invalid(
            check.op,
            "bias_values",
            format!("entry {i} finite"),
            v,
        ));
    }
    check_bad_words(check, host.bad_words, vocab)
}

/// One slot's `α, α⁻¹, β, γ, min_p`.
fn check_penalty_row(check: &Check<'_>, b: usize, row: &[f32]) -> Result<()> {
    let invalid = |what: &str, value: f32| {
        Err(Error::invalid(
            check.op,
            "penalties",
            format!("slot {b}: {what}"),
            value,
        ))
    };
    if let Some(v) = row.iter().find(|v| !v.is_finite()) {
        return invalid("finite values", *v);
    }
    if row[penalty::REPETITION] <= 0.0 {
        return invalid("repetition penalty > 0", row[penalty::REPETITION]);
    }
    let min_p = row[penalty::MIN_P];
    if !(0.0..=1.0).contains(&min_p) {
        return invalid("min_p in [0, 1]", min_p);
    }
    Ok(())
}

/// The encoded bad words: `n ≥ 1` then `n` tokens in `[0, vocab)`, entries filling the host copy
/// (which may be empty; the device buffer then holds one unused element).
fn check_bad_words(check: &Check<'_>, words: &[i32], vocab: usize) -> Result<()> {
    let mut i = 0;
    while i < words.len() {
        let n = words[i];
        let fits = usize::try_from(n).is_ok_and(|n| n >= 1 && i + n < words.len());
        if !fits {
            return Err(Error::invalid(
                check.op,
                "bad_words",
                format!("entry at {i}: a length in 1 ..= {}", words.len() - i - 1),
                n,
            ));
        }
        let n = n as usize;
        for (j, &t) in words[i + 1..=i + n].iter().enumerate() {
            if !usize::try_from(t).is_ok_and(|v| v < vocab) {
                return Err(Error::invalid(
                    check.op,
                    "bad_words",
                    format!("token {} of the entry at {i} in [0, {vocab})", j + 1),
                    t,
                ));
            }
        }
        i += n + 1;
    }
    Ok(())
}
