//! `softmax` (`docs/semantics.md` §5.5): `probs = softmax(logits / temperature)` per row, f32 out, one block
//! per row (`kernels/softmax.cu`).

use specula_backend_api::ops::SoftmaxCall;
use specula_backend_api::{Op, Result};

use super::{grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile};
use crate::launch::ROW_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/softmax.cu`.
    pub(crate) struct SoftmaxArgs {
        logits: u64 as "const SPECULA_T::raw*", // [rows, vocab]
        temperature: u64 as "const float*",     // [rows]
        probs: u64 as "float*",                 // [rows, vocab]
        rows: u32, vocab: u32, vec: u32, pad: u32,
    }
}

/// What `kernels/softmax.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["softmax"],
    Instances::Float,
    &[ArgsStruct::of::<SoftmaxArgs>()],
);

/// Launches `softmax` over the call's rows.
pub(crate) fn run(device: &CudaDevice, mut call: SoftmaxCall<'_>) -> Result<()> {
    let op = Op::Softmax;
    let (inputs, probs, params, &dtype) = call.parts();
    let shape = &params.shape;
    let args = SoftmaxArgs {
        logits: device.ptr(op, inputs.logits)?,
        temperature: device.ptr(op, inputs.temperature)?,
        probs: device.ptr(op, probs)?,
        rows: grid_x(op, shape.rows)?,
        vocab: to_u32(op, "vocab", shape.vocab)?,
        vec: device.vec_ok(op, inputs.logits, shape.vocab)?,
        pad: 0,
    };
    let kernels = device.kernels(KernelFile::Softmax, Instance::float(dtype, dtype));
    kernels.launch("softmax", (args.rows, 1, 1), ROW_BLOCK, &args)
}
