//! The inputs of a validated `process_logits` (or of the fused processed sample) as host slices:
//! the unpacking the CPU backend and the reference device share. The rules of
//! `docs/semantics.md` §4c that read these slices stay apart in each (the reference is the
//! oracle the CPU backend is held to).

use super::slice;
use crate::Result;
use crate::ops::{ProcessInputs, ProcessParams};

/// Every table a processed row reads, as host slices, and the batch shape.
#[derive(Clone, Copy, Debug)]
pub struct ProcessSlices<'a> {
    /// `V`: the vocabulary of the tables.
    pub vocab: usize,
    /// `S`: the most tokens a slot feeds in a step.
    pub s: usize,
    /// The slots of the step.
    pub real_bsz: usize,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
    /// `cu_seqlens_q_output`: the first output row of each slot.
    pub cu_out: &'a [i32],
    /// `batch_id_per_token_output`: the slot of each output row.
    pub batch_id: &'a [i32],
    /// The history: prompt then generated tokens per slot.
    pub token_ids_all: &'a [i32],
    /// Prompt length per slot.
    pub prompt_lens: &'a [i32],
    /// Tokens generated so far per slot.
    pub step_idx: &'a [i32],
    /// Last accepted token and drafts per slot.
    pub draft_tokens: &'a [i32],
    /// Occurrences of each token among a slot's generated tokens.
    pub token_counts: &'a [i32],
    /// Prompt-token bits per slot.
    pub prompt_mask: &'a [u32],
    /// `[max_bsz, 5]` penalties per slot.
    pub penalties: &'a [f32],
    /// `min_tokens` per slot.
    pub min_tokens: &'a [i32],
    /// The end tokens `min_tokens` masks.
    pub end_tokens: &'a [i32],
    /// Per-slot offsets into the bias entries.
    pub bias_offsets: &'a [i32],
    /// Token ids of the bias entries.
    pub bias_ids: &'a [i32],
    /// Values of the bias entries.
    pub bias_values: &'a [f32],
    /// Per-slot offsets into the bad words.
    pub bad_word_offsets: &'a [i32],
    /// The encoded bad words.
    pub bad_words: &'a [i32],
    /// Allowed-token masks per slot, if any.
    pub allowed: Option<&'a [u32]>,
    /// The runner's bitmask per row, if any.
    pub bitmask: Option<&'a [u32]>,
    /// Per-row temperatures of logits rows (`None` for probabilities).
    pub temperature: Option<&'a [f32]>,
}

impl<'a> ProcessSlices<'a> {
    /// The host slices of `inputs` (buffers of a host-memory device) under `params`.
    pub fn new(inputs: &ProcessInputs<'a>, params: &ProcessParams<'_>) -> Result<Self> {
        let (h, s) = (&inputs.history, &inputs.slots);
        Ok(ProcessSlices {
            vocab: params.shape.vocab,
            s: params.dims.max_step_tokens,
            real_bsz: params.dims.real_bsz,
            max_model_len: params.max_model_len,
            cu_out: slice(inputs.layout.cu_seqlens_q_output)?,
            batch_id: slice(inputs.layout.batch_id_per_token_output)?,
            token_ids_all: slice(h.token_ids_all)?,
            prompt_lens: slice(h.prompt_lens)?,
            step_idx: slice(h.step_idx)?,
            draft_tokens: slice(h.draft_tokens)?,
            token_counts: slice(h.token_counts)?,
            prompt_mask: slice(h.prompt_mask)?,
            penalties: slice(s.penalties)?,
            min_tokens: slice(s.min_tokens)?,
            end_tokens: slice(s.end_tokens)?,
            bias_offsets: slice(s.bias_offsets)?,
            bias_ids: slice(s.bias_ids)?,
            bias_values: slice(s.bias_values)?,
            bad_word_offsets: slice(s.bad_word_offsets)?,
            bad_words: slice(s.bad_words)?,
            allowed: s.allowed.map(slice).transpose()?,
            bitmask: inputs.bitmask.map(slice).transpose()?,
            temperature: inputs.scores.temperature().map(slice).transpose()?,
        })
    }
}
