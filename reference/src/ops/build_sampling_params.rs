//! `build_sampling_params` (`docs/semantics.md` §3, §5.3).

use specula_backend_api::Result;
use specula_backend_api::ops::build_sampling_params::OpCall;
use specula_backend_api::ops::{RowSamplingParams, SamplingParamsInputs, SamplingParamsParams};
use specula_backend_api::rng::row_seed;

use crate::ReferenceDevice;
use crate::layout::Layout;
use specula_backend_api::host::{slice, slice_mut};

/// One output row's `(top_p, top_k, temperature, seed)`.
type RowParams = (f32, i32, f32, u64);

/// What a padding (or unresolvable) row gets: a harmless neutral setting.
const PADDING: RowParams = (1.0, 0, 1.0, 0);

/// Expands the per-slot values per output row: row `k` of slot `b` copies the slot's `top_p`,
/// `top_k` and temperature unchanged and takes the seed `(infer_seed[b] + 4k) mod MAX_INFER_SEED`
/// (`k = 0` for the prefill row).
pub(crate) fn build_sampling_params(
    inputs: &SamplingParamsInputs<'_>,
    out: &mut RowSamplingParams<'_>,
    params: &SamplingParamsParams<'_>,
) -> Result<()> {
    let layout = Layout::new(&inputs.lens, &inputs.layout, params.dims)?;
    let top_p = slice::<f32>(inputs.slots.top_p)?;
    let top_k = slice::<i32>(inputs.slots.top_k)?;
    let temperature = slice::<f32>(inputs.slots.temperature)?;
    let infer_seed = slice::<u64>(inputs.slots.infer_seed)?;
    let row = |t: usize| -> Option<RowParams> {
        let src = layout.source(t)?;
        let b = src.slot;
        Some((
            *top_p.get(b)?,
            *top_k.get(b)?,
            *temperature.get(b)?,
            row_seed(*infer_seed.get(b)?, src.pos as u64),
        ))
    };

    let out_top_p = slice_mut::<f32>(out.top_p)?;
    let out_top_k = slice_mut::<i32>(out.top_k)?;
    let out_temperature = slice_mut::<f32>(out.temperature)?;
    let out_seed = slice_mut::<u64>(out.seed)?;
    for t in 0..out_seed.len() {
        let (p, k, temp, seed) = row(t).unwrap_or(PADDING);
        out_top_p[t] = p;
        out_top_k[t] = k;
        out_temperature[t] = temp;
        out_seed[t] = seed;
    }
    Ok(())
}

/// Runs a validated `build_sampling_params` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, _) = call.parts();
    build_sampling_params(inputs, out, params)
}
