//! `shard_histogram` (`docs/semantics.md` §5.15, `kernels/shard_histogram.cl`): one cluster per
//! row; rows of probabilities or of logits weighed as rows of the whole vocabulary (§4d).

use specula_backend_api::WarmUp;
use specula_backend_api::ops::shard_histogram::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::bind_rows;
use super::{ArgsStruct, count, flag, scores_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `shard_histogram_<dtype>`: `rows` rows of the slice `[first, first +
    /// len)`, the buckets of key bits `[shift, shift + 8)`; `has_min_p` when the rows have a
    /// min_p.
    pub(crate) struct ShardHistogramArgs {
        rows: u32,
        len: u32,
        first: u32,
        shift: u32,
        has_min_p: u32,
    }
}

/// The argument structs of `kernels/shard_histogram.cl`, declared in its program from the Rust
/// above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<ShardHistogramArgs>()];

/// Launches `shard_histogram_<dtype>` built for the rows' kind.
pub(crate) fn run(runtime: &Runtime, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let (key, entry) = scores_program(Op::ShardHistogram, *kind);
    let mut buffers = KernelBuffers::default();
    bind_rows(&mut buffers, runtime, &inputs.rows)?;
    buffers.bind(&[inputs.prefix, inputs.floor, out.counts, out.masses])?;
    let slice = params.shape.slice;
    let args = ShardHistogramArgs {
        rows: count(params.shape.rows),
        len: count(slice.len),
        first: count(slice.first),
        shift: params.shift,
        has_min_p: flag(inputs.rows.min_p.is_some()),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype and row kind (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::scores_programs(Op::ShardHistogram, plan)
}
