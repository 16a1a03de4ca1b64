//! `shard_key` (`docs/semantics.md` §5.13, `shaders/shard_key.wgsl`): one workgroup per row, one
//! dispatch per row chunk.

use specula_backend_api::ops::shard_key::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::order_code;
use super::{matrix_row_dispatches, u};
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

specula_backend_api::kernel_args! {
    /// `shard_key_<dtype>`, after its [`RowHead`]: rows `row0 ..` of the chunk bound at `input`,
    /// ids `first ..` of the vocabulary, keyed in `order` (of logits when `logits` is 1); with
    /// `has_ids` the key of token `ids[r]`.
    pub(crate) struct ShardKeyArgs {
        input_off: u32,
        ids_off: u32,
        has_ids: u32,
        keys_off: u32,
        first: u32,
        order: u32,
        logits: u32,
    }
}

/// `shard_key_<dtype>`.
const SHARD_KEY: Entry<ShardKeyArgs, RowHead> = Entry::new(Kernel::ShardKey, None, 0);

/// The facts of `shaders/shard_key.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::rows(&[Library::Shard], &[SHARD_KEY.args()]);

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardKey;
    let (inputs, keys, params, &kind) = call.parts();
    let shape = params.shape.matrix();
    let matrix = inputs.scores.matrix();
    let kernel = (&SHARD_KEY, kind.dtype);
    let dispatches = matrix_row_dispatches(device, op, kernel, matrix, &shape, |b, input_off| {
        Ok(ShardKeyArgs {
            input_off,
            ids_off: b.optional(2, inputs.ids)?,
            has_ids: u32::from(inputs.ids.is_some()),
            keys_off: b.buffer(3, keys)?,
            first: u(params.shape.slice.first),
            order: order_code(params.order),
            logits: u32::from(kind.logits),
        })
    })?;
    device.gpu.run(op, dispatches)
}
