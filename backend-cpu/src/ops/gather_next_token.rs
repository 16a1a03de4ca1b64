//! `gather_next_token` (`docs/semantics.md` §5.2): copies, for every output row, the hidden-state row it
//! predicts from.
//!
//! The copy is bit-exact for every dtype because it moves bytes (`hidden · size_of(dtype)` per row)
//! and never looks at the values. Rows are independent, so they are filled in parallel; a row whose
//! source cannot be resolved from the (untrusted) device layout is zeros.

use rayon::prelude::*;
use specula_backend_api::ops::gather_next_token::OpCall;
use specula_backend_api::ops::*;
use specula_backend_api::slots::{SlotKind, slot_kind};
use specula_backend_api::{Buffer, Result};

use super::build_output_layout::LayoutView;
use crate::CpuDevice;
use specula_backend_api::host::{bytes, bytes_mut, slice};

/// Below this many bytes per task, rayon's scheduling costs more than the copy.
const MIN_TASK_BYTES: usize = 64 * 1024;

/// Gathers the next-token rows: one per output row (`is_speculative`) or one per slot (zeros for
/// slots without output).
pub(crate) fn gather_next_token(
    inputs: &GatherInputs<'_>,
    out: &mut Buffer,
    params: &GatherParams<'_>,
) -> Result<()> {
    let dims = &params.dims;
    let row_bytes = params.hidden * inputs.hidden_states.dtype().size_bytes();
    let src = bytes(inputs.hidden_states)?;
    let cu_in = slice::<i32>(inputs.cu_seqlens_q)?;
    let view = LayoutView::new(&inputs.lens, &inputs.layout, dims)?;
    let token_num = params.token_num;

    // The packed input row of slot `b` at position `pos` (`None` when it is outside the input).
    let packed_row = |b: usize, pos: i64| -> Option<usize> {
        let row = i64::from(*cu_in.get(b)?) + pos;
        usize::try_from(row).ok().filter(|&r| r < token_num)
    };
    // The last packed token of slot `b`, as a prefill row and the non-speculative path read it.
    let last_row =
        |b: usize| -> Option<usize> { packed_row(b, i64::from(*view.this_time.get(b)?) - 1) };

    let source = |t: usize| -> Option<usize> {
        if params.is_speculative {
            let row = view.row_source(t)?;
            match slot_kind(view.this_time[row.slot], view.encoder[row.slot]) {
                SlotKind::Prefill => last_row(row.slot),
                // Decode row k predicts from packed token k of the slot.
                SlotKind::Decode => packed_row(row.slot, row.pos as i64),
                SlotKind::Empty => None,
            }
        } else if t < dims.real_bsz && view.output_rows(t) > 0 {
            last_row(t)
        } else {
            None
        }
    };

    let dst = bytes_mut(out)?;
    // `hidden ≥ 1` is validated, so `row_bytes > 0` and `par_chunks_mut` cannot panic.
    dst.par_chunks_mut(row_bytes)
        .with_min_len((MIN_TASK_BYTES / row_bytes).max(1))
        .enumerate()
        .for_each(|(t, row)| {
            let from = source(t).and_then(|r| src.get(r * row_bytes..(r + 1) * row_bytes));
            match from {
                Some(from) => row.copy_from_slice(from),
                None => row.fill(0),
            }
        });
    Ok(())
}

/// Runs a validated `gather_next_token` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, _) = call.parts();
    device.install(|| gather_next_token(inputs, out, params))
}
