//! `softmax` (`shaders/softmax.wgsl`): one workgroup per row, one dispatch per row chunk.

use specula_backend_api::ops::SoftmaxCall;
use specula_backend_api::{Op, Result};

use super::row_chunk_dispatches;
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

specula_backend_api::kernel_args! {
    /// `softmax_<dtype>`, after its [`RowHead`]: rows `row0 ..` of the chunks bound at `logits` and
    /// `probs`.
    pub(crate) struct SoftmaxArgs {
        logits_off: u32,
        temperature_off: u32,
        probs_off: u32,
    }
}

/// `softmax_<dtype>`.
const SOFTMAX: Entry<SoftmaxArgs, RowHead> = Entry::new(Kernel::Softmax, None, 0);

/// The facts of `shaders/softmax.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts =
    KernelFacts::rows(&[Library::Select, Library::RowStats], &[SOFTMAX.args()]);

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: SoftmaxCall<'_>) -> Result<()> {
    let op = Op::Softmax;
    let (inputs, probs, params, &dtype) = call.parts();
    let shape = &params.shape;
    let kernel = (&SOFTMAX, dtype);
    // Chunks must fit both the logits and the f32 output.
    let dispatches = row_chunk_dispatches(device, op, kernel, probs, shape, |b, chunk| {
        Ok(SoftmaxArgs {
            logits_off: b.rows(1, inputs.logits, shape.vocab, chunk)?,
            temperature_off: b.buffer(2, inputs.temperature)?,
            probs_off: b.rows(3, probs, shape.vocab, chunk)?,
        })
    })?;
    device.gpu.run(op, dispatches)
}
