//! `shard_walk` (`docs/semantics.md` §5.16): the kept (or REJECTION's residual) mass of each row
//! of a slice and the walk from an offset, one block per row (`kernels/shard_walk.cu`).

use specula_backend_api::ops::shard_walk::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::RowPointers;
use super::to_u32;
use crate::args::ShardWalkArgs;
use crate::device::CudaDevice;
use crate::kernels::{Instance, KernelFile};
use crate::launch::ROW_BLOCK;

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
