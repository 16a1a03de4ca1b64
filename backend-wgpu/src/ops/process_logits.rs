//! `process_logits` (`shaders/process_logits.wgsl`, `docs/semantics.md` §4c, §5.12): one workgroup
//! per row of the block, one dispatch per row chunk of the `processed` matrix (f32, so its chunks
//! also fit the input's bindings, whose elements are at most as wide). Output row `i` is the
//! processing of scores row `first + i` of the block. The rows hold the whole vocabulary, or one
//! rank's slice of sharded rows ([`ProcessParams::slice`], `docs/semantics.md` §4d): the
//! kernel reads every table by global id.
//!
//! [`ProcessParams::slice`]: specula_backend_api::ops::ProcessParams::slice

use specula_backend_api::ops::process_logits::mask_words;
use specula_backend_api::ops::{ProcessLogitsCall, RowShape};
use specula_backend_api::{Op, Result};

use super::{row_chunk_dispatches, u};
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, RowHead};

/// The storage buffers the kernel binds (the adapter must allow as many per stage for the device
/// to offer logits processing).
pub(crate) const STORAGE_BUFFERS: u32 = 22;

specula_backend_api::kernel_args! {
    /// `process_logits_<dtype>`, after its [`RowHead`]: output rows `row0 ..` of the chunk bound at
    /// `processed`, which are scores rows `first + row0 ..` of the chunk bound at `scores` (logits
    /// with their per-row `temperature` when `logits` is 1; every per-row input is read at the
    /// scores row), the ids the rows hold (`slice_first ..`, the head's `vocab` of them, of the
    /// tables' `table_vocab`), the shape, the lengths of the lists, whether `allowed` and
    /// `bitmask` are given, and the offset of every buffer.
    pub(crate) struct ProcessLogitsArgs {
        first: u32,
        slice_first: u32,
        table_vocab: u32,
        real_bsz: u32,
        step_tokens: u32,
        max_model_len: u32,
        words: u32,
        logits: u32,
        end_count: u32,
        bias_len: u32,
        bad_words_len: u32,
        has_allowed: u32,
        has_bitmask: u32,
        scores_off: u32,
        temperature_off: u32,
        cu_out_off: u32,
        batch_id_off: u32,
        token_ids_off: u32,
        prompt_lens_off: u32,
        step_idx_off: u32,
        draft_off: u32,
        counts_off: u32,
        prompt_mask_off: u32,
        penalties_off: u32,
        min_tokens_off: u32,
        end_tokens_off: u32,
        bias_offsets_off: u32,
        bias_ids_off: u32,
        bias_values_off: u32,
        bad_offsets_off: u32,
        bad_words_off: u32,
        allowed_off: u32,
        bitmask_off: u32,
        processed_off: u32,
        fallback_off: u32,
    }
}

/// `process_logits_<dtype>`.
const PROCESS: Entry<ProcessLogitsArgs, RowHead> = Entry::new(Kernel::ProcessLogits, None, 0);

/// The facts of `shaders/process_logits.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::rows(&[], &[PROCESS.args()]);

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: ProcessLogitsCall<'_, '_>) -> Result<()> {
    let op = Op::ProcessLogits;
    let (inputs, out, params, &kind) = call.parts();
    let shape = &params.shape;
    let block = params.row_block();
    let ids = params.ids();
    let dims = &params.dims;
    let (h, s) = (&inputs.history, &inputs.slots);
    let processed: &specula_backend_api::Buffer = out.processed;
    let fallback: &specula_backend_api::Buffer = out.fallback;
    let dispatches = row_chunk_dispatches(
        device,
        op,
        (&PROCESS, kind.dtype),
        processed,
        &RowShape {
            rows: block.rows,
            vocab: ids.len,
        },
        |b, chunk| {
            let scores_rows = (block.first + chunk.0, block.first + chunk.1);
            Ok(ProcessLogitsArgs {
                first: u(block.first),
                slice_first: u(ids.first),
                table_vocab: u(shape.vocab),
                real_bsz: u(dims.real_bsz),
                step_tokens: u(dims.max_step_tokens),
                max_model_len: u(params.max_model_len),
                words: u(mask_words(shape.vocab)),
                logits: u32::from(kind.logits),
                end_count: u(s.end_tokens.len()),
                bias_len: u(s.bias_ids.len()),
                bad_words_len: u(s.bad_words.len()),
                has_allowed: u32::from(s.allowed.is_some()),
                has_bitmask: u32::from(inputs.bitmask.is_some()),
                scores_off: b.rows(1, inputs.scores.matrix(), ids.len, scores_rows)?,
                // Probability rows read no temperature: `penalties` stands in (read-only).
                temperature_off: b.buffer(2, inputs.scores.temperature().unwrap_or(s.penalties))?,
                cu_out_off: b.buffer(3, inputs.layout.cu_seqlens_q_output)?,
                batch_id_off: b.buffer(4, inputs.layout.batch_id_per_token_output)?,
                token_ids_off: b.buffer(5, h.token_ids_all)?,
                prompt_lens_off: b.buffer(6, h.prompt_lens)?,
                step_idx_off: b.buffer(7, h.step_idx)?,
                draft_off: b.buffer(8, h.draft_tokens)?,
                counts_off: b.buffer(9, h.token_counts)?,
                prompt_mask_off: b.buffer(10, h.prompt_mask)?,
                penalties_off: b.buffer(11, s.penalties)?,
                min_tokens_off: b.buffer(12, s.min_tokens)?,
                end_tokens_off: b.buffer(13, s.end_tokens)?,
                bias_offsets_off: b.buffer(14, s.bias_offsets)?,
                bias_ids_off: b.buffer(15, s.bias_ids)?,
                bias_values_off: b.buffer(16, s.bias_values)?,
                bad_offsets_off: b.buffer(17, s.bad_word_offsets)?,
                bad_words_off: b.buffer(18, s.bad_words)?,
                // Absent masks: `prompt_mask` stands in (read-only, never read).
                allowed_off: b.buffer(19, s.allowed.unwrap_or(h.prompt_mask))?,
                bitmask_off: b.buffer(20, inputs.bitmask.unwrap_or(h.prompt_mask))?,
                processed_off: b.rows(21, processed, ids.len, chunk)?,
                fallback_off: b.buffer(22, fallback)?,
            })
        },
    )?;
    device.gpu.run(op, dispatches)
}
