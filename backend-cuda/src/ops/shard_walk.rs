//! `shard_walk` (`docs/semantics.md` §5.16): the kept (or REJECTION's residual) mass of each row
//! of a slice and the walk from an offset, one block per row (`kernels/shard_walk.cu`).

use specula_backend_api::ops::shard_walk::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::RowPointers;
use super::to_u32;
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile, Library};
use crate::launch::ROW_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/shard_walk.cu`.
    pub(crate) struct ShardWalkArgs {
        scores: u64 as "const SPECULA_T::raw*", // [rows, len] probabilities or logits
        temperature: u64 as "const float*",     // [rows] (logits rows only)
        row_key: u64 as "const u64*",           // [rows]
        min_p: u64 as "const float*",           // [rows] or null
        threshold: u64 as "const u64*",         // [rows]: the least kept key
        offset: u64 as "const u64*",            // [rows]: where the walk starts
        draft: u64 as "const SPECULA_T::raw*",  // [draft_rows, len] or null (no residual)
        draft_key: u64 as "const u64*",         // [draft_rows]
        draft_row: u64 as "const i32*",         // [rows]
        target_mass: u64 as "const u64*",       // [rows]: Wp
        draft_mass: u64 as "const u64*",        // [rows]: Wq
        tokens: u64 as "i32*",                  // [rows]
        mass: u64 as "u64*",                    // [rows]
        count: u64 as "u64*",                   // [rows]
        rows: u32, len: u32, first: u32, draft_rows: u32, logits: u32, pad: u32,
    }
}

/// What `kernels/shard_walk.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["shard_walk"],
    Instances::Float,
    &[ArgsStruct::of::<ShardWalkArgs>()],
)
.on(&[Library::Shard]);

/// Launches `shard_walk` over the call's rows (without a residual its five pointers are null).
pub(crate) fn run(device: &CudaDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardWalk;
    let (inputs, out, params, &kind) = call.parts();
    let rows = RowPointers::of(device, op, &inputs.rows, &params.shape)?;
    let residual = inputs.residual.as_ref();
    let args = ShardWalkArgs {
        scores: rows.scores,
        temperature: rows.temperature,
        row_key: rows.row_key,
        min_p: rows.min_p,
        threshold: device.ptr(op, inputs.threshold)?,
        offset: device.ptr(op, inputs.offset)?,
        draft: device.opt_ptr(op, residual.map(|r| r.draft))?,
        draft_key: device.opt_ptr(op, residual.map(|r| r.draft_key))?,
        draft_row: device.opt_ptr(op, residual.map(|r| r.draft_row))?,
        target_mass: device.opt_ptr(op, residual.map(|r| r.target_mass))?,
        draft_mass: device.opt_ptr(op, residual.map(|r| r.draft_mass))?,
        tokens: device.ptr(op, out.tokens)?,
        mass: device.ptr(op, out.mass)?,
        count: device.ptr(op, out.count)?,
        rows: rows.rows,
        len: rows.len,
        first: rows.first,
        draft_rows: to_u32(op, "draft_rows", residual.map_or(0, |r| r.draft_key.len()))?,
        logits: rows.logits,
        pad: 0,
    };
    let kernels = device.kernels(
        KernelFile::ShardWalk,
        Instance::float(kind.dtype, kind.dtype),
    );
    kernels.launch("shard_walk", (args.rows, 1, 1), ROW_BLOCK, &args)
}
