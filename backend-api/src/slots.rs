//! Slot kinds and the output-row rule of the batch layout (`docs/semantics.md` §2), shared by every
//! backend.

/// What a slot does this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// `seq_lens_this_time == 0` (or negative): no output row.
    Empty,
    /// `seq_lens_encoder > 0`: the whole remaining prompt, one output row.
    Prefill,
    /// Otherwise: the last accepted token plus drafts, `this_time` output rows.
    Decode,
}

/// The kind of a slot from its `seq_lens_this_time` and `seq_lens_encoder` only.
#[inline]
pub fn slot_kind(seq_len_this_time: i32, seq_len_encoder: i32) -> SlotKind {
    if seq_len_this_time <= 0 {
        SlotKind::Empty
    } else if seq_len_encoder > 0 {
        SlotKind::Prefill
    } else {
        SlotKind::Decode
    }
}

/// The number of output rows of a slot: 0 (empty), 1 (prefill), `min(this_time, S)` (decode).
#[inline]
pub fn slot_output_rows(
    seq_len_this_time: i32,
    seq_len_encoder: i32,
    max_step_tokens: usize,
) -> usize {
    match slot_kind(seq_len_this_time, seq_len_encoder) {
        SlotKind::Empty => 0,
        SlotKind::Prefill => 1,
        SlotKind::Decode => (seq_len_this_time as usize).min(max_step_tokens),
    }
}

/// The number of packed input tokens of a slot: `max(this_time, 0)`.
#[inline]
pub fn slot_input_tokens(seq_len_this_time: i32) -> usize {
    seq_len_this_time.max(0) as usize
}
