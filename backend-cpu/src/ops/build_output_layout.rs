//! `build_output_layout` (`docs/semantics.md` §5.1).
//!
//! Batch-level bookkeeping over `max_bsz` slots, so it runs sequentially on the calling thread:
//! the work is a few prefix sums, far below the cost of a rayon dispatch.
//!
//! [`LayoutView::row_source`] is the one place that maps an output row back to its slot and
//! position; `gather_next_token` and `build_sampling_params` use it too, so every op agrees on
//! which rows are valid and which are padding.

use specula_backend_api::Result;
use specula_backend_api::ops::build_output_layout::OpCall;
use specula_backend_api::ops::*;
use specula_backend_api::slots::{slot_input_tokens, slot_output_rows};

use crate::CpuDevice;
use specula_backend_api::host::{slice, slice_mut};

/// Where an output row comes from: its slot `b` and its position `k` among the slot's output rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowSource {
    /// The slot, in `0 .. real_bsz`.
    pub(crate) slot: usize,
    /// The output row within the slot, in `0 .. slot_output_rows(slot)`.
    pub(crate) pos: usize,
}

/// The device-resident layout arrays an output row is resolved against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayoutView<'a> {
    /// `seq_lens_this_time`, `[max_bsz]`.
    pub(crate) this_time: &'a [i32],
    /// `seq_lens_encoder`, `[max_bsz]`.
    pub(crate) encoder: &'a [i32],
    /// `cu_seqlens_q_output`, `[real_bsz + 1]`.
    pub(crate) cu_out: &'a [i32],
    /// `batch_id_per_token_output`, `[rows]`.
    pub(crate) batch_id: &'a [i32],
    /// `real_bsz`.
    pub(crate) real_bsz: usize,
    /// `S`.
    pub(crate) max_step_tokens: usize,
}

impl<'a> LayoutView<'a> {
    /// Reads the lengths and layout buffers (their shapes were validated by the caller).
    pub(crate) fn new(
        lens: &SlotLens<'a>,
        layout: &OutputLayout<'a>,
        dims: &BatchDims,
    ) -> Result<Self> {
        Ok(LayoutView {
            this_time: slice::<i32>(lens.seq_lens_this_time)?,
            encoder: slice::<i32>(lens.seq_lens_encoder)?,
            cu_out: slice::<i32>(layout.cu_seqlens_q_output)?,
            batch_id: slice::<i32>(layout.batch_id_per_token_output)?,
            real_bsz: dims.real_bsz,
            max_step_tokens: dims.max_step_tokens,
        })
    }

    /// The output rows of slot `b` (0 outside the buffers).
    #[inline]
    pub(crate) fn output_rows(&self, b: usize) -> usize {
        match (self.this_time.get(b), self.encoder.get(b)) {
            (Some(&t), Some(&e)) => slot_output_rows(t, e, self.max_step_tokens),
            _ => 0,
        }
    }

    /// Resolves output row `t` as the decisions say: `b = batch_id[t]` must be a described slot and
    /// `k = t − cu_seqlens_q_output[b]` one of its output rows; anything else is padding (`None`).
    /// Every value read here is device content, so every step is range-checked.
    #[inline]
    pub(crate) fn row_source(&self, t: usize) -> Option<RowSource> {
        let b = usize::try_from(*self.batch_id.get(t)?).ok()?;
        if b >= self.real_bsz {
            return None;
        }
        let start = i64::from(*self.cu_out.get(b)?);
        let pos = usize::try_from(t as i64 - start).ok()?;
        (pos < self.output_rows(b)).then_some(RowSource { slot: b, pos })
    }
}

/// Saturating conversion of a running sum to an i32 entry: hostile lengths (e.g. several slots of
/// `i32::MAX`) must not wrap into negative offsets.
#[inline]
fn to_i32(value: usize) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// Writes the output layout of `docs/semantics.md` §2: rows per slot, the packed-input and output prefix sums, and the
/// slot of every output row (-1 for padding rows). Slots `≥ real_bsz` produce nothing.
pub(crate) fn build_output_layout(
    lens: &SlotLens<'_>,
    out: &mut LayoutOutputs<'_>,
    params: &LayoutParams<'_>,
) -> Result<()> {
    let dims = &params.dims;
    let this_time = slice::<i32>(lens.seq_lens_this_time)?;
    let encoder = slice::<i32>(lens.seq_lens_encoder)?;
    let s = dims.max_step_tokens;

    let seq_lens_output = slice_mut::<i32>(out.seq_lens_output)?;
    for (b, rows) in seq_lens_output.iter_mut().enumerate() {
        *rows = if b < dims.real_bsz {
            to_i32(slot_output_rows(this_time[b], encoder[b], s))
        } else {
            0
        };
    }

    // Sums run in usize with saturation, so a garbage length cannot overflow; each output-row count
    // is at most S, so the output sums are bounded by real_bsz · S = the row capacity anyway.
    let cu_in = slice_mut::<i32>(out.cu_seqlens_q)?;
    let mut acc = 0usize;
    cu_in[0] = 0;
    for b in 0..dims.real_bsz {
        acc = acc.saturating_add(slot_input_tokens(this_time[b]));
        cu_in[b + 1] = to_i32(acc);
    }

    let cu_out = slice_mut::<i32>(out.cu_seqlens_q_output)?;
    let batch_id = slice_mut::<i32>(out.batch_id_per_token_output)?;
    let mut t = 0usize;
    cu_out[0] = 0;
    for b in 0..dims.real_bsz {
        let rows = slot_output_rows(this_time[b], encoder[b], s);
        // rows ≤ S and the buffer holds ≥ real_bsz · S entries, so this slice is in range; `get_mut`
        // keeps it panic-free regardless.
        if let Some(dst) = batch_id.get_mut(t..t + rows) {
            dst.fill(to_i32(b));
        }
        t += rows;
        cu_out[b + 1] = to_i32(t);
    }
    if let Some(padding) = batch_id.get_mut(t..) {
        padding.fill(-1);
    }
    Ok(())
}

/// Runs a validated `build_output_layout` call (the front has checked every argument).
pub(crate) fn run(_device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (lens, out, params, _) = call.parts();
    build_output_layout(lens, out, params)
}
