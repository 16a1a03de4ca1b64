//! `argmax` (`docs/semantics.md` §5.4): per row, the id of the largest value (NaN lowest, −0 equal to +0,
//! ties to the lowest id), one block per row (`kernels/argmax.cu`).

use specula_backend_api::Op;
use specula_backend_api::Result;
use specula_backend_api::ops::ArgmaxCall;

use super::{grid_x, to_u32};
use crate::args::ArgmaxArgs;
use crate::device::CudaDevice;
use crate::kernels::{Instance, KernelFile};
use crate::launch::ROW_BLOCK;

/// Launches `argmax` over the call's rows.
pub(crate) fn run(device: &CudaDevice, mut call: ArgmaxCall<'_>) -> Result<()> {
    let op = Op::Argmax;
    let (&input, out, shape, &dtype) = call.parts();
    let args = ArgmaxArgs {
        input: device.ptr(op, input)?,
        out: device.ptr(op, out)?,
        rows: grid_x(op, shape.rows)?,
        vocab: to_u32(op, "vocab", shape.vocab)?,
        vec: device.vec_ok(op, input, shape.vocab)?,
        pad: 0,
    };
    let kernels = device.kernels(KernelFile::Argmax, Instance::float(dtype, dtype));
    kernels.launch("argmax", (args.rows, 1, 1), ROW_BLOCK, &args)
}
