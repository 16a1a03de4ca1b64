//! `argmax` (`shaders/argmax.wgsl`): one workgroup per row, one dispatch per row chunk.

use specula_backend_api::ops::ArgmaxCall;
use specula_backend_api::{Op, Result};

use super::row_chunk_dispatches;
use crate::WgpuDevice;
use crate::kernels::{ArgsStruct, Entry, Kernel, RowHead};

specula_backend_api::kernel_args! {
    /// `argmax_<dtype>`, after its [`RowHead`]: rows `row0 ..` of the chunk bound at `input`.
    pub(crate) struct ArgmaxArgs {
        input_off: u32,
        out_off: u32,
    }
}

/// `argmax_<dtype>`.
const ARGMAX: Entry<ArgmaxArgs, RowHead> = Entry::new(Kernel::Argmax, None, 0);

/// The argument structs of `shaders/argmax.wgsl`, generated into its module.
pub(crate) const ARGS: &[ArgsStruct] = &[ARGMAX.args()];

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: ArgmaxCall<'_>) -> Result<()> {
    let op = Op::Argmax;
    let (&input, out, shape, &dtype) = call.parts();
    let kernel = (&ARGMAX, dtype);
    let dispatches = row_chunk_dispatches(device, op, kernel, input, shape, |b, chunk| {
        Ok(ArgmaxArgs {
            input_off: b.rows(1, input, shape.vocab, chunk)?,
            out_off: b.buffer(2, out)?,
        })
    })?;
    device.gpu.run(op, dispatches)
}
