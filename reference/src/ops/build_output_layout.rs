//! `build_output_layout` (`docs/semantics.md` §2, §5.1).

use specula_backend_api::Result;
use specula_backend_api::ops::build_output_layout::OpCall;
use specula_backend_api::ops::{LayoutOutputs, LayoutParams, SlotLens};
use specula_backend_api::slots::{slot_input_tokens, slot_output_rows};

use crate::ReferenceDevice;
use crate::layout::saturate_i32;
use specula_backend_api::host::{slice, slice_mut};

/// Writes `out[0] = 0` and `out[b + 1] = counts[0] + … + counts[b]`, each sum exact and clamped at
/// `i32::MAX` when stored.
fn exclusive_prefix_sum(out: &mut [i32], counts: &[usize]) {
    let mut sum = 0i64;
    if let Some(first) = out.first_mut() {
        *first = 0;
    }
    for (entry, &count) in out.iter_mut().skip(1).zip(counts) {
        sum = sum.saturating_add(count as i64);
        *entry = saturate_i32(sum);
    }
}

/// Rows per slot, the packed-input and output prefix sums, and the slot of every output row (-1
/// for the padding rows `t ≥ T_out`).
pub(crate) fn build_output_layout(
    lens: &SlotLens<'_>,
    out: &mut LayoutOutputs<'_>,
    params: &LayoutParams<'_>,
) -> Result<()> {
    let dims = params.dims;
    let this_time = &slice::<i32>(lens.seq_lens_this_time)?[..dims.real_bsz];
    let encoder = &slice::<i32>(lens.seq_lens_encoder)?[..dims.real_bsz];
    let output_rows: Vec<usize> = this_time
        .iter()
        .zip(encoder)
        .map(|(&t, &e)| slot_output_rows(t, e, dims.max_step_tokens))
        .collect();
    let input_tokens: Vec<usize> = this_time.iter().map(|&t| slot_input_tokens(t)).collect();

    let seq_lens_output = slice_mut::<i32>(out.seq_lens_output)?;
    seq_lens_output.fill(0);
    for (entry, &rows) in seq_lens_output.iter_mut().zip(&output_rows) {
        *entry = saturate_i32(rows as i64);
    }
    exclusive_prefix_sum(slice_mut::<i32>(out.cu_seqlens_q)?, &input_tokens);
    exclusive_prefix_sum(slice_mut::<i32>(out.cu_seqlens_q_output)?, &output_rows);

    let batch_id = slice_mut::<i32>(out.batch_id_per_token_output)?;
    batch_id.fill(-1);
    // Every slot has at most S rows and the buffer holds at least real_bsz · S: all rows fit.
    let slots = output_rows
        .iter()
        .enumerate()
        .flat_map(|(b, &rows)| std::iter::repeat_n(saturate_i32(b as i64), rows));
    for (entry, slot) in batch_id.iter_mut().zip(slots) {
        *entry = slot;
    }
    Ok(())
}

/// Runs a validated `build_output_layout` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (lens, out, params, _) = call.parts();
    build_output_layout(lens, out, params)
}
