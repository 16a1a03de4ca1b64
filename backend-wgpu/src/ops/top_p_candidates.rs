//! `top_p_candidates` (`shaders/top_p_candidates.wgsl`): one workgroup per row, one dispatch per
//! row chunk.

use specula_backend_api::ops::TopPCandidatesCall;
use specula_backend_api::{Op, Result};

use super::{matrix_row_dispatches, u};
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

specula_backend_api::kernel_args! {
    /// `top_p_candidates_<dtype>`, after its [`RowHead`]: rows `row0 ..` of the chunk bound at
    /// `probs` (logits with their per-row `temperature` when `logits` is 1), `C` candidates; with
    /// `has_fallback` a row of total weight 0 yields its entry of `fallback` (`process_logits`).
    pub(crate) struct TopPCandidatesArgs {
        probs_off: u32,
        top_p_off: u32,
        batch_id_off: u32,
        has_batch_id: u32,
        ids_off: u32,
        scores_off: u32,
        lens_off: u32,
        candidates: u32,
        temperature_off: u32,
        logits: u32,
        fallback_off: u32,
        has_fallback: u32,
    }
}

/// `top_p_candidates_<dtype>`.
const TOP_P_CANDIDATES: Entry<TopPCandidatesArgs, RowHead> =
    Entry::new(Kernel::TopPCandidates, None, 0);

/// The facts of `shaders/top_p_candidates.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts =
    KernelFacts::rows(&[Library::Select], &[TOP_P_CANDIDATES.args()]);

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: TopPCandidatesCall<'_, '_>) -> Result<()> {
    let op = Op::TopPCandidates;
    let (inputs, out, params, &kind) = call.parts();
    let shape = &params.shape;
    let kernel = (&TOP_P_CANDIDATES, kind.dtype);
    let dispatches = matrix_row_dispatches(
        device,
        op,
        kernel,
        inputs.scores.matrix(),
        shape,
        |b, probs_off| {
            Ok(TopPCandidatesArgs {
                probs_off,
                top_p_off: b.buffer(2, inputs.top_p)?,
                batch_id_off: b.optional(3, inputs.batch_id_per_token_output)?,
                has_batch_id: u32::from(inputs.batch_id_per_token_output.is_some()),
                ids_off: b.buffer(4, out.ids)?,
                scores_off: b.buffer(5, out.scores)?,
                lens_off: b.buffer(6, out.lens)?,
                candidates: u(params.candidates),
                temperature_off: b.optional(7, inputs.scores.temperature())?,
                logits: u32::from(kind.logits),
                // Without a fallback, `top_p` stands in (read-only, never read).
                fallback_off: b.buffer(8, inputs.fallback.unwrap_or(inputs.top_p))?,
                has_fallback: u32::from(inputs.fallback.is_some()),
            })
        },
    )?;
    device.gpu.run(op, dispatches)
}
