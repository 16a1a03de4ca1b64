//! `shard_walk` (`docs/semantics.md` §5.16, `kernels/shard_walk.cl`): one cluster per row; rows of
//! probabilities or of logits weighed as rows of the whole vocabulary (§4d), walked with their
//! kept weights or with REJECTION's residual against draft rows of the same kind and dtype.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::shard_walk::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::bind_rows;
use super::{ArgsStruct, count, flag, scores_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `shard_walk_<dtype>`: `rows` rows of the slice `[first, first + len)`;
    /// `has_min_p` when the rows have a min_p; `has_residual` when they walk with the residual
    /// against `draft_rows` draft rows.
    pub(crate) struct ShardWalkArgs {
        rows: u32,
        len: u32,
        first: u32,
        has_min_p: u32,
        has_residual: u32,
        draft_rows: u32,
    }
}

/// The argument structs of `kernels/shard_walk.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<ShardWalkArgs>()];

/// Launches `shard_walk_<dtype>` built for the rows' kind; without a residual its five buffers
/// are the placeholder and `has_residual = 0`.
pub(crate) fn run(runtime: &Runtime, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let (key, entry) = scores_program(Op::ShardWalk, *kind);
    let residual = inputs.residual.as_ref();
    let mut buffers = KernelBuffers::default();
    bind_rows(&mut buffers, runtime, &inputs.rows)?;
    buffers
        .bind(&[inputs.threshold, inputs.offset])?
        .bind_optional(
            runtime,
            &[
                residual.map(|r| r.draft),
                residual.map(|r| r.draft_key),
                residual.map(|r| r.draft_row),
                residual.map(|r| r.target_mass),
                residual.map(|r| r.draft_mass),
            ],
        )?
        .bind(&[out.tokens, out.mass, out.count])?;
    let slice = params.shape.slice;
    let args = ShardWalkArgs {
        rows: count(params.shape.rows),
        len: count(slice.len),
        first: count(slice.first),
        has_min_p: flag(inputs.rows.min_p.is_some()),
        has_residual: flag(residual.is_some()),
        draft_rows: residual.map_or(0, |r| count(r.draft_key.len())),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype and row kind (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::scores_programs(Op::ShardWalk, plan)
}
