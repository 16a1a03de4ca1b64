//! The inputs of a validated `verify_draft_tokens` that every strategy reads, as host slices:
//! the unpacking the CPU backend and the reference device share. The stop rule and the
//! strategies' checks that read them stay apart in each (duplicated on purpose:
//! `docs/architecture.md`).

use super::slice;
use crate::Result;
use crate::ops::VerifyInputs;

/// The drafts, the layout and the per-slot state of a verify call, as host slices.
#[derive(Clone, Copy, Debug)]
pub struct VerifySlices<'a> {
    /// `[max_bsz, S]`: position 0 the last accepted token, positions 1.. the drafts.
    pub draft_tokens: &'a [i32],
    /// Tokens fed this step per slot.
    pub seq_lens_this_time: &'a [i32],
    /// Prompt tokens of a prefill slot.
    pub seq_lens_encoder: &'a [i32],
    /// The first output row of each slot.
    pub cu_seqlens_q_output: &'a [i32],
    /// The slot has stopped.
    pub stop_flags: &'a [u8],
    /// The slot is blocked this step.
    pub is_block_step: &'a [u8],
    /// 1: the slot is inside a reasoning section.
    pub reasoning_status: &'a [i32],
    /// Tokens generated so far per slot.
    pub step_idx: &'a [i32],
    /// The most tokens a slot may generate.
    pub max_dec_len: &'a [i32],
    /// The end tokens.
    pub end_tokens: &'a [i32],
    /// Per-row seeds.
    pub seeds: &'a [u64],
}

impl<'a> VerifySlices<'a> {
    /// The host slices of `inputs` (buffers of a host-memory device).
    pub fn new(inputs: &VerifyInputs<'a>) -> Result<Self> {
        let state = &inputs.state;
        Ok(VerifySlices {
            draft_tokens: slice(inputs.draft_tokens)?,
            seq_lens_this_time: slice(inputs.lens.seq_lens_this_time)?,
            seq_lens_encoder: slice(inputs.lens.seq_lens_encoder)?,
            cu_seqlens_q_output: slice(inputs.cu_seqlens_q_output)?,
            stop_flags: slice(state.stop_flags)?,
            is_block_step: slice(state.is_block_step)?,
            reasoning_status: slice(state.reasoning_status)?,
            step_idx: slice(state.step_idx)?,
            max_dec_len: slice(state.max_dec_len)?,
            end_tokens: slice(state.end_tokens)?,
            seeds: slice(inputs.seeds)?,
        })
    }
}
