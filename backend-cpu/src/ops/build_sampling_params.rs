//! `build_sampling_params` (`docs/semantics.md` §5.3): batch-level bookkeeping, run sequentially.

use specula_backend_api::Result;
use specula_backend_api::ops::build_sampling_params::OpCall;
use specula_backend_api::ops::*;
use specula_backend_api::rng::row_seed;

use super::build_output_layout::LayoutView;
use crate::CpuDevice;
use specula_backend_api::host::{slice, slice_mut};

/// Expands per-slot `top_p`, `top_k`, temperature and `infer_seed` into per-output-row arrays.
///
/// Row `j` of slot `b` gets seed `(infer_seed[b] + 4·j) mod MAX_INFER_SEED` (prefill: `j = 0`), the
/// other values copied raw; padding rows get `top_p` 1.0, `top_k` 0, temperature 1.0, seed 0, so a
/// consumer that processes every row sees a harmless neutral setting there.
pub(crate) fn build_sampling_params(
    inputs: &SamplingParamsInputs<'_>,
    out: &mut RowSamplingParams<'_>,
    params: &SamplingParamsParams<'_>,
) -> Result<()> {
    let view = LayoutView::new(&inputs.lens, &inputs.layout, &params.dims)?;
    let slot_top_p = slice::<f32>(inputs.slots.top_p)?;
    let slot_top_k = slice::<i32>(inputs.slots.top_k)?;
    let slot_temperature = slice::<f32>(inputs.slots.temperature)?;
    let slot_seed = slice::<u64>(inputs.slots.infer_seed)?;

    let top_p = slice_mut::<f32>(out.top_p)?;
    let top_k = slice_mut::<i32>(out.top_k)?;
    let temperature = slice_mut::<f32>(out.temperature)?;
    let seed = slice_mut::<u64>(out.seed)?;
    let outputs = top_p
        .iter_mut()
        .zip(top_k.iter_mut())
        .zip(temperature.iter_mut())
        .zip(seed.iter_mut());
    for (t, (((top_p, top_k), temperature), seed)) in outputs.enumerate() {
        // Slot-indexed reads go through `get`: `row_source` bounds `b` by real_bsz ≤ max_bsz, but
        // a checked read costs nothing here and keeps the function obviously panic-free.
        let row = view.row_source(t).and_then(|src| {
            let b = src.slot;
            Some((
                *slot_top_p.get(b)?,
                *slot_top_k.get(b)?,
                *slot_temperature.get(b)?,
                row_seed(*slot_seed.get(b)?, src.pos as u64),
            ))
        });
        let (p, k, temp, s) = row.unwrap_or((1.0, 0, 1.0, 0));
        *top_p = p;
        *top_k = k;
        *temperature = temp;
        *seed = s;
    }
    Ok(())
}

/// Runs a validated `build_sampling_params` call (the front has checked every argument).
pub(crate) fn run(_device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, _) = call.parts();
    build_sampling_params(inputs, out, params)
}
