//! `process_logits` (`docs/semantics.md` §5.12, §4c): masks, logit bias, penalties and min_p on
//! every output row from the row's own history, and each row's fallback token, one block per row
//! of the call's row block (`kernels/process_logits.cu`: output row `i` is scores row
//! `first + i`), on probability rows or logits rows (f32, f16 or bf16 in, f32 out). The rows hold
//! the whole vocabulary, or one rank's slice of sharded rows ([`ProcessParams::slice`],
//! `docs/semantics.md` §4d): the kernel reads every table by global id.
//!
//! [`ProcessParams::slice`]: specula_backend_api::ops::ProcessParams::slice

use specula_backend_api::ops::ProcessLogitsCall;
use specula_backend_api::{Op, Result};

use super::{flag, grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile};
use crate::launch::ROW_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/process_logits.cu`.
    pub(crate) struct ProcessArgs {
        // [first + rows, width] logits or probabilities
        scores: u64 as "const typename SPECULA_T::raw*",
        temperature: u64 as "const float*",    // [first + rows] (logits rows only)
        cu_out: u64 as "const i32*",           // [real_bsz + 1] first output row of each slot
        batch_id: u64 as "const i32*",         // [first + rows] slot of each output row
        token_ids_all: u64 as "const i32*",    // [max_bsz, max_model_len]
        prompt_lens: u64 as "const i32*",      // [max_bsz]
        step_idx: u64 as "const i32*",         // [max_bsz]
        draft_tokens: u64 as "const i32*",     // [max_bsz, S]
        token_counts: u64 as "const i32*",     // [max_bsz, vocab]
        prompt_mask: u64 as "const u32*",      // [max_bsz, words]
        penalties: u64 as "const float*",      // [max_bsz, SPECULA_PENALTY_FIELDS]
        min_tokens: u64 as "const i32*",       // [max_bsz]
        end_tokens: u64 as "const i32*",       // [n_end]
        bias_offsets: u64 as "const i32*",     // [max_bsz + 1]
        bias_ids: u64 as "const i32*",         // [n_bias]
        bias_values: u64 as "const float*",    // [n_bias]
        bad_word_offsets: u64 as "const i32*", // [max_bsz + 1]
        bad_words: u64 as "const i32*",        // [n_bad_words]
        allowed: u64 as "const u32*",          // [max_bsz, words] or null
        bitmask: u64 as "const u32*",          // [first + rows, words] or null
        processed: u64 as "float*",            // [rows, width]: row i is scores row first + i
        fallback: u64 as "i32*",               // [rows]
        max_model_len: u64, max_step_tokens: u64, n_end: u64, n_bias: u64, n_bad_words: u64,
        // the block's first scores row: every per-row input is read at first + i
        first: u64,
        rows: u32,                             // the block's rows (one CUDA block each)
        vocab: u32,                            // the tables' vocabulary
        real_bsz: u32,
        logits: u32,                           // the rows are logits at `temperature`
        // the rows hold the ids [slice_first, slice_first + width) (§4d)
        slice_first: u32, width: u32,
    }
}

/// What `kernels/process_logits.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["process_logits"],
    Instances::Float,
    &[ArgsStruct::of::<ProcessArgs>()],
);

/// Launches `process_logits` over the rows of the call's block.
pub(crate) fn run(device: &CudaDevice, mut call: ProcessLogitsCall<'_, '_>) -> Result<()> {
    let op = Op::ProcessLogits;
    let (inputs, out, params, &kind) = call.parts();
    let (h, s) = (&inputs.history, &inputs.slots);
    let shape = &params.shape;
    let dims = &params.dims;
    let block = params.row_block();
    let ids = params.ids();
    let args = ProcessArgs {
        scores: device.ptr(op, inputs.scores.matrix())?,
        temperature: device.opt_ptr(op, inputs.scores.temperature())?,
        cu_out: device.ptr(op, inputs.layout.cu_seqlens_q_output)?,
        batch_id: device.ptr(op, inputs.layout.batch_id_per_token_output)?,
        token_ids_all: device.ptr(op, h.token_ids_all)?,
        prompt_lens: device.ptr(op, h.prompt_lens)?,
        step_idx: device.ptr(op, h.step_idx)?,
        draft_tokens: device.ptr(op, h.draft_tokens)?,
        token_counts: device.ptr(op, h.token_counts)?,
        prompt_mask: device.ptr(op, h.prompt_mask)?,
        penalties: device.ptr(op, s.penalties)?,
        min_tokens: device.ptr(op, s.min_tokens)?,
        end_tokens: device.ptr(op, s.end_tokens)?,
        bias_offsets: device.ptr(op, s.bias_offsets)?,
        bias_ids: device.ptr(op, s.bias_ids)?,
        bias_values: device.ptr(op, s.bias_values)?,
        bad_word_offsets: device.ptr(op, s.bad_word_offsets)?,
        bad_words: device.ptr(op, s.bad_words)?,
        allowed: device.opt_ptr(op, s.allowed)?,
        bitmask: device.opt_ptr(op, inputs.bitmask)?,
        processed: device.ptr(op, out.processed)?,
        fallback: device.ptr(op, out.fallback)?,
        max_model_len: params.max_model_len as u64,
        max_step_tokens: dims.max_step_tokens as u64,
        n_end: s.end_tokens.len() as u64,
        n_bias: s.bias_ids.len() as u64,
        n_bad_words: s.bad_words.len() as u64,
        first: block.first as u64,
        rows: grid_x(op, block.rows)?,
        vocab: to_u32(op, "vocab", shape.vocab)?,
        real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
        logits: flag(kind.logits),
        slice_first: to_u32(op, "slice first", ids.first)?,
        width: to_u32(op, "slice len", ids.len)?,
    };
    let kernels = device.kernels(
        KernelFile::ProcessLogits,
        Instance::float(kind.dtype, kind.dtype),
    );
    kernels.launch("process_logits", (args.rows, 1, 1), ROW_BLOCK, &args)
}
