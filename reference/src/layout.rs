//! Reading the batch layout from device memory (`docs/semantics.md` §2): which slot and position an
//! output row belongs to, with every device value range-checked.

use specula_backend_api::Result;
use specula_backend_api::ops::{BatchDims, OutputLayout, SlotLens};
use specula_backend_api::slots::{SlotKind, slot_kind, slot_output_rows};

use specula_backend_api::host::slice;

/// A negative device length counts as 0.
pub(crate) fn len_or_zero(value: i32) -> usize {
    usize::try_from(value).unwrap_or(0)
}

/// A token id as an index into a row of `vocab` entries; `None` outside `[0, V)`.
pub(crate) fn token_index(token: i32, vocab: usize) -> Option<usize> {
    usize::try_from(token).ok().filter(|&t| t < vocab)
}

/// An exact sum stored as an i32: clamped to `[i32::MIN, i32::MAX]` instead of wrapping.
pub(crate) fn saturate_i32(value: i64) -> i32 {
    i32::try_from(value).unwrap_or(if value < 0 { i32::MIN } else { i32::MAX })
}

/// Output row `t`'s origin: slot `slot`, its `pos`-th output row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowSource {
    /// The slot, below `real_bsz`.
    pub(crate) slot: usize,
    /// The position among the slot's output rows.
    pub(crate) pos: usize,
}

/// The slot lengths and the output layout as they are in device memory.
pub(crate) struct Layout<'a> {
    this_time: &'a [i32],
    encoder: &'a [i32],
    cu_out: &'a [i32],
    batch_id: &'a [i32],
    dims: BatchDims,
}

impl<'a> Layout<'a> {
    /// Reads the buffers (shapes are validated).
    pub(crate) fn new(
        lens: &SlotLens<'a>,
        layout: &OutputLayout<'a>,
        dims: BatchDims,
    ) -> Result<Self> {
        Ok(Layout {
            this_time: slice(lens.seq_lens_this_time)?,
            encoder: slice(lens.seq_lens_encoder)?,
            cu_out: slice(layout.cu_seqlens_q_output)?,
            batch_id: slice(layout.batch_id_per_token_output)?,
            dims,
        })
    }

    /// The kind of live slot `b` (`None` for `b ≥ real_bsz`).
    pub(crate) fn kind(&self, b: usize) -> Option<SlotKind> {
        if b >= self.dims.real_bsz {
            return None;
        }
        Some(slot_kind(*self.this_time.get(b)?, *self.encoder.get(b)?))
    }

    /// `seq_lens_this_time[b]` as read from the device.
    pub(crate) fn this_time(&self, b: usize) -> Option<i32> {
        self.this_time.get(b).copied()
    }

    /// The output rows of live slot `b` (0 for other slots).
    pub(crate) fn output_rows(&self, b: usize) -> usize {
        match self.kind(b) {
            Some(_) => slot_output_rows(
                self.this_time[b],
                self.encoder[b],
                self.dims.max_step_tokens,
            ),
            None => 0,
        }
    }

    /// Where output row `t` comes from: `b = batch_id[t]` a live slot and
    /// `pos = t − cu_seqlens_q_output[b]` one of its rows; `None` (padding) otherwise.
    pub(crate) fn source(&self, t: usize) -> Option<RowSource> {
        let slot = usize::try_from(*self.batch_id.get(t)?).ok()?;
        let start = i64::from(*self.cu_out.get(slot)?);
        let pos = usize::try_from(t as i64 - start).ok()?;
        (pos < self.output_rows(slot)).then_some(RowSource { slot, pos })
    }
}
