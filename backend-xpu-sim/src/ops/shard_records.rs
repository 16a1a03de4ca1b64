//! `shard_records` (`docs/semantics.md` §5.14, `kernels/shard_records.cl`): one cluster per row;
//! rows of probabilities or of logits weighed as rows of the whole vocabulary (§4d).

use specula_backend_api::WarmUp;
use specula_backend_api::ops::shard_records::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::{bind_rows, order_code};
use super::{ArgsStruct, count, flag, scores_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `shard_records_<dtype>`: `rows` rows of the slice `[first, first +
    /// len)`, `records` (`K`) records each in `order`; `has_min_p` when the rows have a min_p.
    pub(crate) struct ShardRecordsArgs {
        rows: u32,
        len: u32,
        first: u32,
        records: u32,
        order: u32,
        has_min_p: u32,
    }
}

/// The argument structs of `kernels/shard_records.cl`, declared in its program from the Rust
/// above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<ShardRecordsArgs>()];

/// Launches `shard_records_<dtype>` built for the rows' kind.
pub(crate) fn run(runtime: &Runtime, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, records, params, kind) = call.parts();
    let (key, entry) = scores_program(Op::ShardRecords, *kind);
    let mut buffers = KernelBuffers::default();
    bind_rows(&mut buffers, runtime, inputs)?;
    buffers.bind(&[records])?;
    let slice = params.shape.slice;
    let args = ShardRecordsArgs {
        rows: count(params.shape.rows),
        len: count(slice.len),
        first: count(slice.first),
        records: count(params.records),
        order: order_code(params.order),
        has_min_p: flag(inputs.min_p.is_some()),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype and row kind (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::scores_programs(Op::ShardRecords, plan)
}
