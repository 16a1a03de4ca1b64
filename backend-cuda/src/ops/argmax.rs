//! `argmax` (`docs/semantics.md` §5.4): per row, the id of the largest value (NaN lowest, −0 equal to +0,
//! ties to the lowest id), one block per row (`kernels/argmax.cu`).

use specula_backend_api::Op;
use specula_backend_api::Result;
use specula_backend_api::ops::ArgmaxCall;

use super::{grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile};
use crate::launch::ROW_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/argmax.cu`.
    pub(crate) struct ArgmaxArgs {
        input: u64 as "const SPECULA_T::raw*", // [rows, vocab]
        out: u64 as "i32*",                    // [rows]
        rows: u32, vocab: u32, vec: u32, pad: u32,
    }
}

/// What `kernels/argmax.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["argmax"],
    Instances::Float,
    &[ArgsStruct::of::<ArgmaxArgs>()],
);

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
