//! `softmax` (`docs/semantics.md` §5.5): `probs = softmax(logits / temperature)` per row, f32 out, one block
//! per row (`kernels/softmax.cu`).

use specula_backend_api::ops::SoftmaxCall;
use specula_backend_api::{Op, Result};

use super::{grid_x, to_u32};
use crate::args::SoftmaxArgs;
use crate::device::CudaDevice;
use crate::kernels::{Instance, KernelFile};
use crate::launch::ROW_BLOCK;

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
