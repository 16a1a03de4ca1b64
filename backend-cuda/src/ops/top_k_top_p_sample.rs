//! `top_k_top_p_sample` (`docs/semantics.md` §5.6): exact top-k/top-p sampling with per-row seeds
//! (`kernels/top_k_top_p_sample.cu`). One block per row, or, for a few rows of a large vocabulary
//! on a device that launches cooperatively, several cooperating blocks per row. Probability rows,
//! or logits rows with their per-row temperatures (`docs/semantics.md` §4b).

use specula_backend_api::ops::TopKTopPSampleCall;
use specula_backend_api::{Op, Result};

use super::{flag, grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile, Library};
use crate::launch::{self, SELECT_BLOCK};

cuda_args! {
    /// The argument block of every entry point of `kernels/top_k_top_p_sample.cu`.
    pub(crate) struct SampleArgs {
        probs: u64 as "const typename SPECULA_T::raw*", // [rows, vocab] probabilities or logits
        temperature: u64 as "const float*",             // [rows] (logits rows only)
        top_k: u64 as "const i32*",                     // [rows]
        top_p: u64 as "const float*",                   // [rows]
        seed: u64 as "const u64*",                      // [rows]
        // [rows] or null: the token of a row of weight 0
        fallback: u64 as "const i32*",
        tokens: u64 as "i32*",                          // [rows]
        scratch: u64 as "unsigned char*",               // split rows: [rows][stride], any content
        // split rows: [rows][2] barrier words (select.cuh)
        sync: u64 as "u64*",
        scratch_stride: u64, rows: u32, vocab: u32,
        vec: u32,                                       // rows are aligned for 4-element loads
        splits: u32,                                    // blocks per row (split kernel only)
        logits: u32,                                    // the rows are logits at `temperature`
        pad: u32,
    }
}

/// What `kernels/top_k_top_p_sample.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["top_k_top_p_sample", "top_k_top_p_sample_split"],
    Instances::Float,
    &[ArgsStruct::of::<SampleArgs>()],
)
.on(&[Library::Select]);

/// Launches `top_k_top_p_sample` over the call's rows.
pub(crate) fn run(device: &CudaDevice, mut call: TopKTopPSampleCall<'_>) -> Result<()> {
    let op = Op::TopKTopPSample;
    let (inputs, tokens, params, &kind) = call.parts();
    let dtype = kind.dtype;
    let shape = &params.shape;
    let kernels = device.kernels(KernelFile::TopKTopPSample, Instance::float(dtype, dtype));
    let mut args = SampleArgs {
        probs: device.ptr(op, inputs.scores.matrix())?,
        temperature: device.opt_ptr(op, inputs.scores.temperature())?,
        top_k: device.ptr(op, inputs.top_k)?,
        top_p: device.ptr(op, inputs.top_p)?,
        seed: device.ptr(op, inputs.seed)?,
        fallback: device.opt_ptr(op, inputs.fallback)?,
        tokens: device.ptr(op, tokens)?,
        scratch: 0,
        sync: 0,
        scratch_stride: 0,
        rows: grid_x(op, shape.rows)?,
        vocab: to_u32(op, "vocab", shape.vocab)?,
        vec: device.vec_ok(op, inputs.scores.matrix(), shape.vocab)?,
        splits: 1,
        logits: flag(kind.logits),
        pad: 0,
    };
    // A captured step launches one block per row (the same tokens): a cooperative launch whose
    // grid may not fit at replay time has no fallback inside a graph.
    let splits = if device.cooperative && !device.driver.is_capturing() {
        launch::sample_splits(shape.rows, shape.vocab, device.multiprocessors)
    } else {
        1
    };
    if splits > 1 {
        // A few rows of a large vocabulary: several cooperating blocks per row.
        let stride = launch::split_row_scratch_bytes(splits);
        let mut scratch = device.scratch(op, stride * shape.rows as u64)?;
        args.scratch = scratch.ptr();
        args.sync = scratch.grid_sync(op)?;
        args.scratch_stride = stride;
        args.splits = splits;
        let grid = (splits, args.rows, 1);
        if kernels.launch_cooperative("top_k_top_p_sample_split", grid, SELECT_BLOCK, &args)? {
            return Ok(());
        }
        // The grid does not fit at once (the device is shared): one block per row.
        args.splits = 1;
    }
    kernels.launch("top_k_top_p_sample", (args.rows, 1, 1), SELECT_BLOCK, &args)
}
