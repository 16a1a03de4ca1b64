//! `argmax` (`shaders/argmax.wgsl`): one workgroup per row, one dispatch per row chunk.

use specula_backend_api::ops::ArgmaxCall;
use specula_backend_api::{Op, Result};

use super::matrix_row_dispatches;
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

specula_backend_api::kernel_args! {
    /// `argmax_<dtype>`, after its [`RowHead`]: rows `row0 ..` of the chunk bound at `input`.
    pub(crate) struct ArgmaxArgs {
        input_off: u32,
        out_off: u32,
    }
}

/// `argmax_<dtype>`.
const ARGMAX: Entry<ArgmaxArgs, RowHead> = Entry::new(Kernel::Argmax, None, 0);

/// The facts of `shaders/argmax.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::rows(&[Library::Select], &[ARGMAX.args()]);

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: ArgmaxCall<'_>) -> Result<()> {
    let op = Op::Argmax;
    let (&input, out, shape, &dtype) = call.parts();
    let kernel = (&ARGMAX, dtype);
    let dispatches = matrix_row_dispatches(device, op, kernel, input, shape, |b, input_off| {
        Ok(ArgmaxArgs {
            input_off,
            out_off: b.buffer(2, out)?,
        })
    })?;
    device.gpu.run(op, dispatches)
}
