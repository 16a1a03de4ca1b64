//! The device buffers of a decoder: the persistent per-slot state and the per-step scratch, both
//! allocated once and reused across steps.

use specula_backend_api::ops::{LogprobsBuffers, OutputLayout, RowBlock, SlotLens};
use specula_backend_api::{Buffer, Device, DeviceExt, Element, Strategy, WriteAt};

use crate::config::{Request, SamplerConfig};
use crate::error::Result;
use crate::seeds;

/// Per-slot state that lives on the device across steps (`[max_bsz]` unless noted).
#[derive(Debug)]
pub(crate) struct SlotBuffers {
    /// `[max_bsz, max_model_len]` i32: prompt then generated tokens.
    pub token_ids_all: Buffer,
    pub prompt_lens: Buffer,
    pub step_idx: Buffer,
    /// u64.
    pub infer_seed: Buffer,
    /// `[max_bsz, S]` i32: the last accepted token, then the drafts.
    pub draft_tokens: Buffer,
    pub seq_lens_this_time: Buffer,
    pub seq_lens_encoder: Buffer,
    pub seq_lens_decoder: Buffer,
    /// u8.
    pub stop_flags: Buffer,
    /// u8, always 0 (zeroed at allocation, written by no op): this decoder does not schedule
    /// KV-cache blocks.
    pub is_block_step: Buffer,
    /// i32, always 0 (zeroed at allocation, written by no op): reasoning sections are not
    /// tracked.
    pub reasoning_status: Buffer,
    pub max_dec_len: Buffer,
    pub draft_token_num: Buffer,
    /// f32.
    pub top_p: Buffer,
    pub top_k: Buffer,
    /// f32.
    pub temperature: Buffer,
    /// `[E]` i32.
    pub end_tokens: Buffer,
    /// Logits processing (`docs/semantics.md` §4c), from the first request or step that uses it.
    pub processing: Option<crate::processing::Processing>,
}

impl SlotBuffers {
    pub fn new(device: &dyn Device, config: &SamplerConfig) -> Result<Self> {
        let n = config.max_bsz;
        let s = config.max_step_tokens;
        Ok(SlotBuffers {
            token_ids_all: device.alloc::<i32>(n * config.max_model_len)?,
            prompt_lens: device.alloc::<i32>(n)?,
            step_idx: device.alloc::<i32>(n)?,
            infer_seed: device.alloc::<u64>(n)?,
            draft_tokens: device.upload(&vec![-1i32; n * s])?,
            seq_lens_this_time: device.alloc::<i32>(n)?,
            seq_lens_encoder: device.alloc::<i32>(n)?,
            seq_lens_decoder: device.alloc::<i32>(n)?,
            // Empty slots are stopped, so no op ever touches them.
            stop_flags: device.upload(&vec![1u8; n])?,
            is_block_step: device.alloc::<u8>(n)?,
            reasoning_status: device.alloc::<i32>(n)?,
            max_dec_len: device.alloc::<i32>(n)?,
            draft_token_num: device.alloc::<i32>(n)?,
            top_p: device.upload(&vec![1.0f32; n])?,
            top_k: device.alloc::<i32>(n)?,
            temperature: device.upload(&vec![1.0f32; n])?,
            end_tokens: device.upload(&config.end_tokens)?,
            processing: None,
        })
    }

    /// The slot lengths of the step, as the ops read them.
    pub fn lens(&self) -> SlotLens<'_> {
        SlotLens {
            seq_lens_this_time: &self.seq_lens_this_time,
            seq_lens_encoder: &self.seq_lens_encoder,
        }
    }

    /// Writes a newly inserted request's state into `slot`, in one batched write: its prompt
    /// and lengths (a prefill of the whole prompt comes next), its seed, limits and sampling
    /// parameters, and (when logits processing is on) its processing rows. The stop flag is
    /// cleared last: the slot is live from then on.
    ///
    /// Not written: `is_block_step` and `reasoning_status`, zeroed at allocation and written by
    /// no op, and `seq_lens_this_time`, which `propose` writes whole before any op reads it.
    pub fn load_request(
        &mut self,
        device: &dyn Device,
        config: &SamplerConfig,
        slot: usize,
        request: &Request,
    ) -> Result<()> {
        let s = config.max_step_tokens;
        let prompt_len = [as_i32(request.prompt.len())];
        let drafts = request.max_draft_tokens.unwrap_or(s - 1).min(s - 1);
        let seed = [seeds::request_seed(request.seed)];
        let no_drafts = vec![-1i32; s];
        let max_dec_len = [config.device_max_dec_len(request.max_dec_len)];
        let drafts = [as_i32(drafts)];
        let (top_p, top_k) = ([request.top_p], [as_i32(request.top_k)]);
        let temperature = [request.temperature];
        let rows = self
            .processing
            .as_mut()
            .map(|p| p.prepare(slot, request, &[]));
        let mut writes = vec![
            WriteAt::new(
                &mut self.token_ids_all,
                slot * config.max_model_len,
                &request.prompt,
            ),
            WriteAt::new(&mut self.prompt_lens, slot, &prompt_len),
            WriteAt::new(&mut self.step_idx, slot, &[0i32]),
            WriteAt::new(&mut self.infer_seed, slot, &seed),
            WriteAt::new(&mut self.draft_tokens, slot * s, &no_drafts),
            WriteAt::new(&mut self.seq_lens_encoder, slot, &prompt_len),
            WriteAt::new(&mut self.seq_lens_decoder, slot, &[0i32]),
            WriteAt::new(&mut self.max_dec_len, slot, &max_dec_len),
            WriteAt::new(&mut self.draft_token_num, slot, &drafts),
            WriteAt::new(&mut self.top_p, slot, &top_p),
            WriteAt::new(&mut self.top_k, slot, &top_k),
            WriteAt::new(&mut self.temperature, slot, &temperature),
        ];
        if let (Some(p), Some(rows)) = (self.processing.as_mut(), &rows) {
            writes.extend(p.writes(rows));
        }
        // Last: the slot is live from here on.
        writes.push(WriteAt::new(&mut self.stop_flags, slot, &[0u8]));
        device.write_many(&mut writes)?;
        Ok(())
    }

    /// Retires `slot` (one batched write): a stopped slot is never touched by any op, and a zero
    /// encoder length keeps a request removed before its prefill out of the proposer's budget.
    pub fn clear_slot(&mut self, device: &dyn Device, slot: usize) -> Result<()> {
        device.write_many(&mut [
            WriteAt::new(&mut self.stop_flags, slot, &[1u8]),
            WriteAt::new(&mut self.seq_lens_encoder, slot, &[0i32]),
        ])?;
        Ok(())
    }
}

/// A host length as the ops' i32, saturating at `i32::MAX`.
fn as_i32(value: usize) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// Candidate outputs of `top_p_candidates` (TOPP only).
#[derive(Debug)]
pub(crate) struct CandidateBuffers {
    /// `[rows, C]` i32.
    pub ids: Buffer,
    /// `[rows, C]` f32.
    pub scores: Buffer,
    /// `[rows]` i32.
    pub lens: Buffer,
}

/// Outputs of `accept_logprobs` (only when log-probabilities are configured).
#[derive(Debug)]
pub(crate) struct LogprobBuffers {
    pub top_k: usize,
    pub out: LogprobsBuffers,
}

/// Buffers written and read within one step. Row buffers have `max_bsz · S` rows and are
/// narrowed with [`Buffer::set_window`] to the rows of the step.
#[derive(Debug)]
pub(crate) struct Scratch {
    pub seq_lens_output: Buffer,
    /// `[max_bsz + 1]`, windowed to `real_bsz + 1`.
    pub cu_seqlens_q: Buffer,
    /// `[max_bsz + 1]`, windowed to `real_bsz + 1`.
    pub cu_seqlens_q_output: Buffer,
    /// `[max_bsz · S]`, windowed to `real_bsz · S`.
    pub batch_id_per_token_output: Buffer,
    /// Per-row sampling parameters (f32, i32, f32, u64).
    pub row_top_p: Buffer,
    pub row_top_k: Buffer,
    pub row_temperature: Buffer,
    pub row_seed: Buffer,
    /// `[rows, V]` f32: the target's softmax, for REJECTION given target logits and draft
    /// probabilities only (every other step samples from the logits); allocated on the first
    /// such step.
    pub probs: Option<Buffer>,
    /// `[rows]` i32: argmax or sampled token per row.
    pub target_tokens: Buffer,
    pub candidates: Option<CandidateBuffers>,
    /// `[max_bsz, S]` i32.
    pub accept_tokens: Buffer,
    pub accept_num: Buffer,
    pub logprobs: Option<LogprobBuffers>,
    /// Logits processing's outputs (from the first step that processes).
    pub processed: Option<ProcessedBuffers>,
    /// `[max_bsz · (S − 1)]` i32: REJECTION's index of compact draft rows
    /// (`docs/semantics.md` §5.8.1), from the first step given compact rows.
    pub draft_index: Option<Buffer>,
    /// Its host copy, rebuilt each such step (capacity kept).
    pub draft_index_host: Vec<i32>,
}

/// The outputs of `process_logits` and the `top_k = 1` row of GREEDY targets under it.
#[derive(Debug)]
pub(crate) struct ProcessedBuffers {
    /// `[rows, V]` f32 processed rows (`None` on a device that samples processed rows itself,
    /// `Capabilities::fused_processing`, under a strategy that only samples them).
    pub rows: Option<Buffer>,
    /// `[rows]` i32: the token of a row that weighs nothing.
    pub fallback: Buffer,
    /// `[rows]` i32 ones: GREEDY's target is a `top_k = 1` sample with the fallback.
    pub ones: Buffer,
}

impl ProcessedBuffers {
    /// Buffers for `rows` rows of `vocab` (no processed rows unless `with_rows`).
    pub fn new(
        device: &dyn Device,
        (rows, vocab): (usize, usize),
        with_rows: bool,
    ) -> Result<Self> {
        Ok(ProcessedBuffers {
            rows: match with_rows {
                true => Some(device.alloc::<f32>(rows * vocab)?),
                false => None,
            },
            fallback: device.alloc::<i32>(rows)?,
            ones: device.upload(&vec![1i32; rows])?,
        })
    }

    /// Narrows the buffers to their first `rows` rows (the rows `process_logits` writes).
    pub fn window_rows(&mut self, rows: usize, vocab: usize) -> Result<()> {
        if let Some(processed) = self.rows.as_mut() {
            window(processed, rows * vocab)?;
        }
        window(&mut self.fallback, rows)?;
        window(&mut self.ones, rows)
    }
}

impl Scratch {
    pub fn new(device: &dyn Device, config: &SamplerConfig) -> Result<Self> {
        let n = config.max_bsz;
        let rows = n * config.max_step_tokens;
        let candidates = if config.strategy == Strategy::TopP {
            Some(CandidateBuffers {
                ids: device.alloc::<i32>(rows * config.candidates)?,
                scores: device.alloc::<f32>(rows * config.candidates)?,
                lens: device.alloc::<i32>(rows)?,
            })
        } else {
            None
        };
        let logprobs = match config.logprobs {
            Some(k) => Some(LogprobBuffers {
                top_k: k,
                out: LogprobsBuffers::alloc(device, n, rows, k)?,
            }),
            None => None,
        };
        Ok(Scratch {
            seq_lens_output: device.alloc::<i32>(n)?,
            cu_seqlens_q: device.alloc::<i32>(n + 1)?,
            cu_seqlens_q_output: device.alloc::<i32>(n + 1)?,
            batch_id_per_token_output: device.alloc::<i32>(rows)?,
            row_top_p: device.alloc::<f32>(rows)?,
            row_top_k: device.alloc::<i32>(rows)?,
            row_temperature: device.alloc::<f32>(rows)?,
            row_seed: device.alloc::<u64>(rows)?,
            probs: None,
            target_tokens: device.alloc::<i32>(rows)?,
            candidates,
            accept_tokens: device.alloc::<i32>(rows)?,
            accept_num: device.alloc::<i32>(n)?,
            logprobs,
            processed: None,
            draft_index: None,
            draft_index_host: Vec::new(),
        })
    }

    /// The output layout `build_output_layout` wrote.
    pub fn layout(&self) -> OutputLayout<'_> {
        OutputLayout {
            cu_seqlens_q_output: &self.cu_seqlens_q_output,
            batch_id_per_token_output: &self.batch_id_per_token_output,
        }
    }

    /// Narrows every per-row buffer to its first `rows` rows.
    pub fn window_rows(&mut self, rows: usize, vocab: usize, candidates: usize) -> Result<()> {
        window(&mut self.row_top_p, rows)?;
        window(&mut self.row_top_k, rows)?;
        window(&mut self.row_temperature, rows)?;
        window(&mut self.row_seed, rows)?;
        window(&mut self.target_tokens, rows)?;
        if let Some(probs) = &mut self.probs {
            window(probs, rows * vocab)?;
        }
        if let Some(c) = &mut self.candidates {
            window(&mut c.ids, rows * candidates)?;
            window(&mut c.scores, rows * candidates)?;
            window(&mut c.lens, rows)?;
        }
        Ok(())
    }
}

impl Scratch {
    /// Narrows every per-row buffer but the processed rows (which `process_logits` writes from
    /// their first row for each block) to the rows of `block`.
    pub fn window_block(&mut self, block: RowBlock, candidates: usize) -> Result<()> {
        let (first, rows) = (block.first, block.rows);
        for buffer in [
            &mut self.row_top_p,
            &mut self.row_top_k,
            &mut self.row_temperature,
            &mut self.row_seed,
            &mut self.target_tokens,
        ] {
            buffer.set_window(first, rows)?;
        }
        if let Some(c) = &mut self.candidates {
            c.ids.set_window(first * candidates, rows * candidates)?;
            c.scores.set_window(first * candidates, rows * candidates)?;
            c.lens.set_window(first, rows)?;
        }
        Ok(())
    }
}

/// Restricts `buffer` to its first `len` elements.
pub(crate) fn window(buffer: &mut Buffer, len: usize) -> Result<()> {
    buffer.set_window(0, len)?;
    Ok(())
}

/// Writes `data` at element `offset` of `buffer` (whose window is then restored to the whole
/// allocation).
pub(crate) fn write_at<T: Element>(
    device: &dyn Device,
    buffer: &mut Buffer,
    offset: usize,
    data: &[T],
) -> Result<()> {
    buffer.set_window(offset, data.len())?;
    let written = device.write(buffer, data);
    buffer.reset_window();
    Ok(written?)
}
