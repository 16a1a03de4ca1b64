//! `shard_walk` (`docs/semantics.md` §5.16, `shaders/shard_walk.wgsl`): one workgroup per row,
//! one dispatch per row chunk of the rows and, with REJECTION's residual, per row chunk of the
//! draft rows (each row runs in the dispatch of its draft row's chunk).

use specula_backend_api::ops::shard_walk::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::{shard_row_args, shard_row_dispatches};
use super::u;
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

shard_row_args! {
    /// `shard_walk_<dtype>`, after its [`RowHead`] and the [`BoundRows`](super::sharded::BoundRows)
    /// fields: rows `row0 ..` of the chunk bound at `input` (logits with their `temperature` when
    /// `logits` is 1), ids `first ..` of the vocabulary, weighed from `row_key` (and `min_p` when
    /// `has_min_p`), kept from `threshold` up and walked from `offset`; with `has_residual` the
    /// residual against the draft rows `draft_lo .. draft_hi` (of `draft_rows`) bound at `draft`.
    pub(crate) struct ShardWalkArgs {
        threshold_off: u32,
        offset_off: u32,
        draft_off: u32,
        draft_key_off: u32,
        draft_row_off: u32,
        target_mass_off: u32,
        draft_mass_off: u32,
        tokens_off: u32,
        mass_off: u32,
        count_off: u32,
        first: u32,
        has_residual: u32,
        draft_rows: u32,
        draft_lo: u32,
        draft_hi: u32,
    }
}

/// `shard_walk_<dtype>`.
const SHARD_WALK: Entry<ShardWalkArgs, RowHead> = Entry::new(Kernel::ShardWalk, None, 0);

/// The facts of `shaders/shard_walk.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts =
    KernelFacts::rows(&[Library::Shard, Library::ShardRows], &[SHARD_WALK.args()]);

/// Records and submits one dispatch per (row chunk, draft chunk), all in one submission.
pub(crate) fn run(device: &WgpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardWalk;
    let (inputs, out, params, &kind) = call.parts();
    let shape = params.shape.matrix();
    let len = shape.vocab;
    let residual = inputs.residual.as_ref();
    let draft_rows = residual.map_or(0, |r| r.draft_key.len());
    let draft_chunks = match residual {
        Some(r) => device.gpu.row_chunks(r.draft, draft_rows, len),
        None => vec![(0, 0)],
    };
    let kernel = (&SHARD_WALK, kind.dtype);
    let mut dispatches = Vec::new();
    for dc in draft_chunks {
        dispatches.extend(shard_row_dispatches(
            device,
            op,
            kernel,
            &inputs.rows,
            &shape,
            |b, rows| {
                Ok(ShardWalkArgs {
                    threshold_off: b.buffer(5, inputs.threshold)?,
                    offset_off: b.buffer(6, inputs.offset)?,
                    draft_off: match residual {
                        Some(r) => b.rows(7, r.draft, len, dc)?,
                        None => b.dummy(7),
                    },
                    draft_key_off: b.optional(8, residual.map(|r| r.draft_key))?,
                    draft_row_off: b.optional(9, residual.map(|r| r.draft_row))?,
                    target_mass_off: b.optional(10, residual.map(|r| r.target_mass))?,
                    draft_mass_off: b.optional(11, residual.map(|r| r.draft_mass))?,
                    tokens_off: b.buffer(12, out.tokens)?,
                    mass_off: b.buffer(13, out.mass)?,
                    count_off: b.buffer(14, out.count)?,
                    first: u(params.shape.slice.first),
                    has_residual: u32::from(residual.is_some()),
                    draft_rows: u(draft_rows),
                    draft_lo: u(dc.0),
                    draft_hi: u(dc.1),
                    ..ShardWalkArgs::bound(rows)
                })
            },
        )?);
    }
    device.gpu.run(op, dispatches)
}
