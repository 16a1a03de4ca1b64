//! `shard_exp_sum` (`docs/semantics.md` §5.17, `shaders/shard_exp_sum.wgsl`): one workgroup per
//! row, one dispatch per row chunk.

use specula_backend_api::ops::RowShape;
use specula_backend_api::ops::shard_exp_sum::OpCall;
use specula_backend_api::{Op, Result};

use super::matrix_row_dispatches;
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

specula_backend_api::kernel_args! {
    /// `shard_exp_sum_<dtype>`, after its [`RowHead`]: rows `row0 ..` of the chunk of logits
    /// bound at `input`, with their `temperature` and `row_key`.
    pub(crate) struct ShardExpSumArgs {
        input_off: u32,
        temperature_off: u32,
        row_key_off: u32,
        sums_off: u32,
    }
}

/// `shard_exp_sum_<dtype>`.
const SHARD_EXP_SUM: Entry<ShardExpSumArgs, RowHead> = Entry::new(Kernel::ShardExpSum, None, 0);

/// The facts of `shaders/shard_exp_sum.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts =
    KernelFacts::rows(&[Library::Shard], &[SHARD_EXP_SUM.args()]);

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardExpSum;
    let (inputs, sums, params, &dtype) = call.parts();
    let shape: RowShape = params.shape.matrix();
    let kernel = (&SHARD_EXP_SUM, dtype);
    let dispatches =
        matrix_row_dispatches(device, op, kernel, inputs.logits, &shape, |b, input_off| {
            Ok(ShardExpSumArgs {
                input_off,
                temperature_off: b.buffer(2, inputs.temperature)?,
                row_key_off: b.buffer(3, inputs.row_key)?,
                sums_off: b.buffer(4, sums)?,
            })
        })?;
    device.gpu.run(op, dispatches)
}
