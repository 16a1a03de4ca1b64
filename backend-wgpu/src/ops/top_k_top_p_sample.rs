//! `top_k_top_p_sample` (`shaders/top_k_top_p_sample.wgsl`): one workgroup per row, one dispatch
//! per row chunk. REJECTION (`verify_draft_tokens`) samples its target rows with the same kernel.

use specula_backend_api::ops::{RowShape, SampleInputs, TopKTopPSampleCall};
use specula_backend_api::{DType, Op, Result};

use super::matrix_row_dispatches;
use crate::WgpuDevice;
use crate::gpu::{Bound, Dispatch};
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

specula_backend_api::kernel_args! {
    /// `top_k_top_p_sample_<dtype>`, after its [`RowHead`]: rows `row0 ..` of the chunk bound at
    /// `probs` (logits with their per-row `temperature` when `logits` is 1); with `with_aux` each
    /// row's kept set and total weight are written to `aux` (8 words per row); with `has_fallback`
    /// a row of total weight 0 yields its entry of `fallback` (`process_logits`).
    pub(crate) struct TopKTopPSampleArgs {
        probs_off: u32,
        top_k_off: u32,
        top_p_off: u32,
        seed_off: u32,
        tokens_off: u32,
        aux_off: u32,
        with_aux: u32,
        temperature_off: u32,
        logits: u32,
        fallback_off: u32,
        has_fallback: u32,
    }
}

/// `top_k_top_p_sample_<dtype>`.
const SAMPLE: Entry<TopKTopPSampleArgs, RowHead> = Entry::new(Kernel::TopKTopPSample, None, 0);

/// The facts of `shaders/top_k_top_p_sample.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts =
    KernelFacts::rows(&[Library::Select, Library::Draw], &[SAMPLE.args()]);

/// The dispatches sampling every row of `inputs.scores` into `tokens` (and, with `aux`, recording
/// each row's kept set and total weight for REJECTION). `op` is the op they are recorded for.
pub(crate) fn sample_dispatches(
    device: &WgpuDevice,
    op: Op,
    dtype: DType,
    inputs: &SampleInputs<'_>,
    tokens: Bound,
    aux: Option<Bound>,
    shape: &RowShape,
) -> Result<Vec<Dispatch>> {
    let kernel = (&SAMPLE, dtype);
    matrix_row_dispatches(
        device,
        op,
        kernel,
        inputs.scores.matrix(),
        shape,
        |b, probs_off| {
            Ok(TopKTopPSampleArgs {
                probs_off,
                top_k_off: b.buffer(2, inputs.top_k)?,
                top_p_off: b.buffer(3, inputs.top_p)?,
                seed_off: b.buffer(4, inputs.seed)?,
                tokens_off: b.bound(5, tokens.clone()),
                aux_off: match &aux {
                    Some(a) => b.bound(6, a.clone()),
                    None => b.dummy(6),
                },
                with_aux: u32::from(aux.is_some()),
                // Probability rows read no temperature: `top_p` stands in (read-only, so it
                // cannot clash with the placeholder of `aux`, which is writable).
                temperature_off: b
                    .buffer(7, inputs.scores.temperature().unwrap_or(inputs.top_p))?,
                logits: u32::from(inputs.scores.is_logits()),
                // Without a fallback, `top_k` stands in (read-only i32, never read).
                fallback_off: b.buffer(8, inputs.fallback.unwrap_or(inputs.top_k))?,
                has_fallback: u32::from(inputs.fallback.is_some()),
            })
        },
    )
}

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: TopKTopPSampleCall<'_>) -> Result<()> {
    let op = Op::TopKTopPSample;
    let (inputs, tokens, params, &kind) = call.parts();
    let out = device.gpu.bind(op, tokens)?;
    let dispatches = sample_dispatches(device, op, kind.dtype, inputs, out, None, &params.shape)?;
    device.gpu.run(op, dispatches)
}
