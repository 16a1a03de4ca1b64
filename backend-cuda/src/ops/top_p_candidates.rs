//! `top_p_candidates` (`docs/semantics.md` §5.7): the first `C` tokens in rank order and the top-p prefix
//! length, one block per row (`kernels/top_p_candidates.cu`), on probability rows or on logits
//! rows with their per-row temperatures (`docs/semantics.md` §4b).

use specula_backend_api::ops::TopPCandidatesCall;
use specula_backend_api::{Op, Result};

use super::{flag, grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile, Library};
use crate::launch::SELECT_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/top_p_candidates.cu`.
    pub(crate) struct CandidatesArgs {
        probs: u64 as "const typename SPECULA_T::raw*", // [rows, vocab] probabilities or logits
        temperature: u64 as "const float*",             // [rows] (logits rows only)
        top_p: u64 as "const float*",                   // [rows]
        batch_id: u64 as "const i32*",                  // [rows] or null
        // [rows] or null: the token of a row of weight 0
        fallback: u64 as "const i32*",
        ids: u64 as "i32*",                             // [rows, C]
        scores: u64 as "float*",                        // [rows, C]
        lens: u64 as "i32*",                            // [rows]
        rows: u32, vocab: u32, candidates: u32, vec: u32,
        logits: u32,                                    // the rows are logits at `temperature`
        pad: u32,
    }
}

/// What `kernels/top_p_candidates.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["top_p_candidates"],
    Instances::Float,
    &[ArgsStruct::of::<CandidatesArgs>()],
)
.on(&[Library::Select]);

/// Launches `top_p_candidates` over the call's rows.
pub(crate) fn run(device: &CudaDevice, mut call: TopPCandidatesCall<'_, '_>) -> Result<()> {
    let op = Op::TopPCandidates;
    let (inputs, out, params, &kind) = call.parts();
    let dtype = kind.dtype;
    let shape = &params.shape;
    let args = CandidatesArgs {
        probs: device.ptr(op, inputs.scores.matrix())?,
        temperature: device.opt_ptr(op, inputs.scores.temperature())?,
        top_p: device.ptr(op, inputs.top_p)?,
        batch_id: device.opt_ptr(op, inputs.batch_id_per_token_output)?,
        fallback: device.opt_ptr(op, inputs.fallback)?,
        ids: device.ptr(op, out.ids)?,
        scores: device.ptr(op, out.scores)?,
        lens: device.ptr(op, out.lens)?,
        rows: grid_x(op, shape.rows)?,
        vocab: to_u32(op, "vocab", shape.vocab)?,
        candidates: to_u32(op, "candidates", params.candidates)?,
        vec: device.vec_ok(op, inputs.scores.matrix(), shape.vocab)?,
        logits: flag(kind.logits),
        pad: 0,
    };
    let kernels = device.kernels(KernelFile::TopPCandidates, Instance::float(dtype, dtype));
    kernels.launch("top_p_candidates", (args.rows, 1, 1), SELECT_BLOCK, &args)
}
