//! The ops: validation (the shared `validate_*` of backend-api, first, exactly as the CPU
//! reference), then the launch of the op's kernels with window pointers and sizes. Zero-row calls
//! validate and launch nothing (except where an output has entries even then: the prefix sums of
//! `build_output_layout` and `accept_logprobs`).

use specula_backend_api::ops::*;
use specula_backend_api::{
    Buffer, Capabilities, DType, Device, DeviceId, DeviceInfo, Op, Result, Strategy,
};
use tracing::debug_span;

use crate::args::*;
use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::kernels::{Instance, KernelFile};
use crate::launch::{self, BATCH_BLOCK, ROW_BLOCK, SELECT_BLOCK};

/// A size as a `u32` kernel argument, or an error naming it.
fn to_u32(op: Op, what: &'static str, value: usize) -> Result<u32> {
    u32::try_from(value).map_err(|_| CudaError::TooLarge { what }.into_api(op.name()))
}

/// A grid dimension x of `value` blocks.
fn grid_x(op: Op, value: usize) -> Result<u32> {
    if value > launch::MAX_GRID_X {
        return Err(CudaError::TooLarge { what: "grid" }.into_api(op.name()));
    }
    to_u32(op, "grid", value)
}

fn flag(b: bool) -> u32 {
    u32::from(b)
}

impl CudaDevice {
    fn vec_ok(&self, op: Op, buffer: &Buffer, vocab: usize) -> Result<u32> {
        let ptr = self.ptr(op, buffer)?;
        Ok(flag(launch::vector_loads_ok(
            ptr,
            buffer.dtype().size_bytes(),
            vocab,
        )))
    }
}

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        self.info_ref()
    }

    fn id(&self) -> DeviceId {
        self.id_value()
    }

    fn capabilities(&self) -> &Capabilities {
        self.capabilities_ref()
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer> {
        self.alloc_zeroed_impl(dtype, len)
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<Buffer> {
        self.upload_bytes_impl(dtype, bytes)
    }

    fn write_bytes(&self, dst: &mut Buffer, bytes: &[u8]) -> Result<()> {
        self.write_bytes_impl(dst, bytes)
    }

    fn download_bytes(&self, src: &Buffer) -> Result<Vec<u8>> {
        self.download_bytes_impl(src)
    }

    fn synchronize(&self) -> Result<()> {
        self.synchronize_impl()
    }

    fn build_output_layout(
        &self,
        lens: &SlotLens<'_>,
        out: &mut LayoutOutputs<'_>,
        params: &LayoutParams<'_>,
    ) -> Result<()> {
        let capacity = validate_build_output_layout(self.id(), lens, out, params)?;
        let op = Op::BuildOutputLayout;
        let dims = &params.dims;
        let _span = debug_span!(
            "build_output_layout",
            backend = "cuda",
            max_bsz = dims.max_bsz
        )
        .entered();
        let args = LayoutArgs {
            this_time: self.ptr(op, lens.seq_lens_this_time)?,
            encoder: self.ptr(op, lens.seq_lens_encoder)?,
            seq_lens_output: self.ptr(op, out.seq_lens_output)?,
            cu_in: self.ptr(op, out.cu_seqlens_q)?,
            cu_out: self.ptr(op, out.cu_seqlens_q_output)?,
            batch_id: self.ptr(op, out.batch_id_per_token_output)?,
            capacity: capacity as u64,
            max_step_tokens: dims.max_step_tokens as u64,
            max_bsz: to_u32(op, "max_bsz", dims.max_bsz)?,
            real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
        };
        let f = self.function(
            KernelFile::BuildOutputLayout,
            Instance::integer(DType::I32),
            "build_output_layout",
        )?;
        self.launch(op, &f, (1, 1, 1), BATCH_BLOCK, &args)
    }

    fn gather_next_token(
        &self,
        inputs: &GatherInputs<'_>,
        out: &mut Buffer,
        params: &GatherParams<'_>,
    ) -> Result<()> {
        let rows = validate_gather_next_token(self.id(), inputs, out, params)?;
        let op = Op::GatherNextToken;
        let _span = debug_span!(
            "gather_next_token",
            backend = "cuda",
            rows,
            hidden = params.hidden
        )
        .entered();
        if rows == 0 {
            return Ok(());
        }
        let row_bytes = (params.hidden * inputs.hidden_states.dtype().size_bytes()) as u64;
        let src = self.ptr(op, inputs.hidden_states)?;
        let dst = self.ptr(op, out)?;
        let args = GatherArgs {
            src,
            dst,
            cu_seqlens_q: self.ptr(op, inputs.cu_seqlens_q)?,
            this_time: self.ptr(op, inputs.lens.seq_lens_this_time)?,
            encoder: self.ptr(op, inputs.lens.seq_lens_encoder)?,
            cu_out: self.ptr(op, inputs.layout.cu_seqlens_q_output)?,
            batch_id: self.ptr(op, inputs.layout.batch_id_per_token_output)?,
            row_bytes,
            token_num: params.token_num as u64,
            max_step_tokens: params.dims.max_step_tokens as u64,
            out_rows: grid_x(op, rows)?,
            real_bsz: to_u32(op, "real_bsz", params.dims.real_bsz)?,
            speculative: flag(params.is_speculative),
            unit: launch::copy_unit(src, dst, row_bytes),
        };
        let f = self.function(
            KernelFile::GatherNextToken,
            Instance::integer(DType::U8),
            "gather_next_token",
        )?;
        self.launch(op, &f, (args.out_rows, 1, 1), BATCH_BLOCK, &args)
    }

    fn build_sampling_params(
        &self,
        inputs: &SamplingParamsInputs<'_>,
        out: &mut RowSamplingParams<'_>,
        params: &SamplingParamsParams<'_>,
    ) -> Result<()> {
        let rows = validate_build_sampling_params(self.id(), inputs, out, params)?;
        let op = Op::BuildSamplingParams;
        let _span = debug_span!("build_sampling_params", backend = "cuda", rows).entered();
        if rows == 0 {
            return Ok(());
        }
        let args = SamplingParamsArgs {
            slot_top_p: self.ptr(op, inputs.slots.top_p)?,
            slot_top_k: self.ptr(op, inputs.slots.top_k)?,
            slot_temperature: self.ptr(op, inputs.slots.temperature)?,
            slot_seed: self.ptr(op, inputs.slots.infer_seed)?,
            this_time: self.ptr(op, inputs.lens.seq_lens_this_time)?,
            encoder: self.ptr(op, inputs.lens.seq_lens_encoder)?,
            cu_out: self.ptr(op, inputs.layout.cu_seqlens_q_output)?,
            batch_id: self.ptr(op, inputs.layout.batch_id_per_token_output)?,
            top_p: self.ptr(op, out.top_p)?,
            top_k: self.ptr(op, out.top_k)?,
            temperature: self.ptr(op, out.temperature)?,
            seed: self.ptr(op, out.seed)?,
            rows: rows as u64,
            max_step_tokens: params.dims.max_step_tokens as u64,
            real_bsz: to_u32(op, "real_bsz", params.dims.real_bsz)?,
            pad: 0,
        };
        let f = self.function(
            KernelFile::BuildSamplingParams,
            Instance::integer(DType::I32),
            "build_sampling_params",
        )?;
        let blocks = grid_x(op, launch::blocks_for(rows, BATCH_BLOCK) as usize)?;
        self.launch(op, &f, (blocks, 1, 1), BATCH_BLOCK, &args)
    }

    fn argmax(&self, input: &Buffer, out: &mut Buffer, shape: &RowShape) -> Result<()> {
        let dtype = validate_argmax(self.id(), input, out, shape)?;
        let op = Op::Argmax;
        let _span = debug_span!(
            "argmax",
            backend = "cuda",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        if shape.rows == 0 {
            return Ok(());
        }
        let args = ArgmaxArgs {
            input: self.ptr(op, input)?,
            out: self.ptr(op, out)?,
            rows: grid_x(op, shape.rows)?,
            vocab: to_u32(op, "vocab", shape.vocab)?,
            vec: self.vec_ok(op, input, shape.vocab)?,
            pad: 0,
        };
        let f = self.function(KernelFile::Argmax, Instance::float(dtype, dtype), "argmax")?;
        self.launch(op, &f, (args.rows, 1, 1), ROW_BLOCK, &args)
    }

    fn softmax(
        &self,
        logits: &Buffer,
        temperature: &Buffer,
        probs: &mut Buffer,
        params: &SoftmaxParams<'_>,
    ) -> Result<()> {
        let dtype = validate_softmax(self.id(), logits, temperature, probs, params)?;
        let op = Op::Softmax;
        let shape = &params.shape;
        let _span = debug_span!(
            "softmax",
            backend = "cuda",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        if shape.rows == 0 {
            return Ok(());
        }
        let args = SoftmaxArgs {
            logits: self.ptr(op, logits)?,
            temperature: self.ptr(op, temperature)?,
            probs: self.ptr(op, probs)?,
            rows: grid_x(op, shape.rows)?,
            vocab: to_u32(op, "vocab", shape.vocab)?,
            vec: self.vec_ok(op, logits, shape.vocab)?,
            pad: 0,
        };
        let f = self.function(
            KernelFile::Softmax,
            Instance::float(dtype, dtype),
            "softmax",
        )?;
        self.launch(op, &f, (args.rows, 1, 1), ROW_BLOCK, &args)
    }

    fn top_k_top_p_sample(
        &self,
        inputs: &SampleInputs<'_>,
        tokens: &mut Buffer,
        params: &SampleParams<'_>,
    ) -> Result<()> {
        let dtype = validate_top_k_top_p_sample(self.id(), inputs, tokens, params)?;
        let op = Op::TopKTopPSample;
        let shape = &params.shape;
        let _span = debug_span!(
            "top_k_top_p_sample",
            backend = "cuda",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        if shape.rows == 0 {
            return Ok(());
        }
        let instance = Instance::float(dtype, dtype);
        let mut args = SampleArgs {
            probs: self.ptr(op, inputs.probs)?,
            top_k: self.ptr(op, inputs.top_k)?,
            top_p: self.ptr(op, inputs.top_p)?,
            seed: self.ptr(op, inputs.seed)?,
            tokens: self.ptr(op, tokens)?,
            scratch: 0,
            scratch_stride: 0,
            rows: grid_x(op, shape.rows)?,
            vocab: to_u32(op, "vocab", shape.vocab)?,
            vec: self.vec_ok(op, inputs.probs, shape.vocab)?,
            splits: 1,
        };
        let splits = if self.cooperative {
            launch::sample_splits(shape.rows, shape.vocab, self.multiprocessors)
        } else {
            1
        };
        if splits > 1 {
            // A few rows of a large vocabulary: several cooperating blocks per row.
            let stride = launch::split_row_scratch_bytes(splits);
            let scratch = self.scratch(op, stride * shape.rows as u64)?;
            args.scratch = self.scratch_ptr(&scratch);
            args.scratch_stride = stride;
            args.splits = splits;
            let f = self.function(
                KernelFile::TopKTopPSample,
                instance,
                "top_k_top_p_sample_split",
            )?;
            if self.launch_cooperative(op, &f, (splits, args.rows, 1), SELECT_BLOCK, &args)? {
                return Ok(());
            }
            // The grid does not fit at once (the device is shared): one block per row.
            args.splits = 1;
        }
        let f = self.function(KernelFile::TopKTopPSample, instance, "top_k_top_p_sample")?;
        self.launch(op, &f, (args.rows, 1, 1), SELECT_BLOCK, &args)
    }

    fn top_p_candidates(
        &self,
        inputs: &CandidatesInputs<'_>,
        out: &mut CandidatesOutputs<'_>,
        params: &CandidatesParams<'_>,
    ) -> Result<()> {
        let dtype = validate_top_p_candidates(self.id(), inputs, out, params)?;
        let op = Op::TopPCandidates;
        let shape = &params.shape;
        let _span = debug_span!(
            "top_p_candidates",
            backend = "cuda",
            rows = shape.rows,
            vocab = shape.vocab,
            candidates = params.candidates
        )
        .entered();
        if shape.rows == 0 {
            return Ok(());
        }
        let args = CandidatesArgs {
            probs: self.ptr(op, inputs.probs)?,
            top_p: self.ptr(op, inputs.top_p)?,
            batch_id: self.opt_ptr(op, inputs.batch_id_per_token_output)?,
            ids: self.ptr(op, out.ids)?,
            scores: self.ptr(op, out.scores)?,
            lens: self.ptr(op, out.lens)?,
            rows: grid_x(op, shape.rows)?,
            vocab: to_u32(op, "vocab", shape.vocab)?,
            candidates: to_u32(op, "candidates", params.candidates)?,
            vec: self.vec_ok(op, inputs.probs, shape.vocab)?,
        };
        let f = self.function(
            KernelFile::TopPCandidates,
            Instance::float(dtype, dtype),
            "top_p_candidates",
        )?;
        self.launch(op, &f, (args.rows, 1, 1), SELECT_BLOCK, &args)
    }

    fn verify_draft_tokens(
        &self,
        inputs: &VerifyInputs<'_>,
        out: &mut VerifyOutputs<'_>,
        params: &VerifyParams<'_>,
    ) -> Result<()> {
        let float_dtypes = validate_verify_draft_tokens(self.id(), inputs, out, params)?;
        let op = Op::VerifyDraftTokens;
        let dims = &params.dims;
        let strategy = inputs.strategy.strategy();
        let _span = debug_span!(
            "verify_draft_tokens",
            backend = "cuda",
            strategy = strategy.name(),
            max_bsz = dims.max_bsz,
            rows = params.rows
        )
        .entered();
        if dims.max_bsz == 0 {
            return Ok(());
        }
        let state = &inputs.state;
        let s = dims.max_step_tokens;
        let mut args = VerifyArgs {
            draft_tokens: self.ptr(op, inputs.draft_tokens)?,
            this_time: self.ptr(op, inputs.lens.seq_lens_this_time)?,
            encoder: self.ptr(op, inputs.lens.seq_lens_encoder)?,
            cu_out: self.ptr(op, inputs.cu_seqlens_q_output)?,
            stop_flags: self.ptr(op, state.stop_flags)?,
            is_block_step: self.ptr(op, state.is_block_step)?,
            reasoning: self.ptr(op, state.reasoning_status)?,
            step_idx: self.ptr(op, state.step_idx)?,
            max_dec_len: self.ptr(op, state.max_dec_len)?,
            end_tokens: self.ptr(op, state.end_tokens)?,
            seeds: self.ptr(op, inputs.seeds)?,
            accept_tokens: self.ptr(op, out.accept_tokens)?,
            accept_num: self.ptr(op, out.accept_num)?,
            rows: params.rows as u64,
            max_step_tokens: s as u64,
            n_end: state.end_tokens.len() as u64,
            max_bsz: to_u32(op, "max_bsz", dims.max_bsz)?,
            real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
            vocab: to_u32(op, "vocab", params.vocab)?,
            accept_all: flag(params.accept_all && !params.reject_all),
            reject_all: flag(params.reject_all),
            ..VerifyArgs::default()
        };
        match inputs.strategy {
            StrategyInputs::Greedy { target_tokens }
            | StrategyInputs::TargetMatch { target_tokens } => {
                args.target_tokens = self.ptr(op, target_tokens)?;
                args.strategy = if strategy == Strategy::Greedy {
                    launch::STRATEGY_GREEDY
                } else {
                    launch::STRATEGY_TARGET_MATCH
                };
            }
            StrategyInputs::TopP {
                candidate_ids,
                candidate_scores,
                candidate_lens,
                candidates,
            } => {
                args.cand_ids = self.ptr(op, candidate_ids)?;
                args.cand_scores = self.ptr(op, candidate_scores)?;
                args.cand_lens = self.ptr(op, candidate_lens)?;
                args.candidates = candidates as u64;
                args.strategy = launch::STRATEGY_TOPP;
            }
            StrategyInputs::Rejection {
                target_probs,
                draft_probs,
                top_k,
                top_p,
            } => {
                let (target, draft) = float_dtypes.unwrap_or((DType::F32, DType::F32));
                let draft_rows = dims.max_bsz * (s - 1);
                args.target_probs = self.ptr(op, target_probs)?;
                args.draft_probs = self.ptr(op, draft_probs)?;
                args.top_k = self.ptr(op, top_k)?;
                args.top_p = self.ptr(op, top_p)?;
                args.draft_rows = draft_rows as u64;
                args.strategy = launch::STRATEGY_REJECTION;
                args.vec_target = self.vec_ok(op, target_probs, params.vocab)?;
                args.vec_draft = self.vec_ok(op, draft_probs, params.vocab)?;
                let scratch_bytes = TARGET_STATS_BYTES * params.rows as u64 + 8 * draft_rows as u64;
                let scratch = self.scratch(op, scratch_bytes)?;
                args.stats = self.scratch_ptr(&scratch);
                let instance = Instance::float(target, draft);
                let prepare_blocks = params.rows + draft_rows;
                if prepare_blocks > 0 {
                    let f = self.function(
                        KernelFile::VerifyDraftTokens,
                        instance,
                        "verify_draft_tokens_rejection_prepare",
                    )?;
                    self.launch(
                        op,
                        &f,
                        (grid_x(op, prepare_blocks)?, 1, 1),
                        SELECT_BLOCK,
                        &args,
                    )?;
                }
                let f = self.function(
                    KernelFile::VerifyDraftTokens,
                    instance,
                    "verify_draft_tokens_rejection",
                )?;
                return self.launch(op, &f, (args.max_bsz, 1, 1), SELECT_BLOCK, &args);
            }
        }
        let f = self.function(
            KernelFile::VerifyDraftTokens,
            Instance::float(DType::F32, DType::F32),
            "verify_draft_tokens",
        )?;
        let blocks = launch::blocks_for(dims.max_bsz, BATCH_BLOCK);
        self.launch(op, &f, (blocks, 1, 1), BATCH_BLOCK, &args)
    }

    fn update_state(
        &self,
        inputs: &UpdateStateInputs<'_>,
        state: &mut DecodeState<'_>,
        params: &UpdateStateParams,
    ) -> Result<()> {
        validate_update_state(self.id(), inputs, state, params)?;
        let op = Op::UpdateState;
        let dims = &params.dims;
        let _span = debug_span!("update_state", backend = "cuda", max_bsz = dims.max_bsz).entered();
        if dims.real_bsz == 0 {
            return Ok(());
        }
        let args = UpdateStateArgs {
            accept_tokens: self.ptr(op, inputs.accept_tokens)?,
            is_block_step: self.ptr(op, inputs.is_block_step)?,
            prompt_lens: self.ptr(op, inputs.prompt_lens)?,
            max_dec_len: self.ptr(op, inputs.max_dec_len)?,
            end_tokens: self.ptr(op, inputs.end_tokens)?,
            accept_num: self.ptr(op, state.accept_num)?,
            stop_flags: self.ptr(op, state.stop_flags)?,
            token_ids_all: self.ptr(op, state.token_ids_all)?,
            step_idx: self.ptr(op, state.step_idx)?,
            infer_seed: self.ptr(op, state.infer_seed)?,
            draft_tokens: self.ptr(op, state.draft_tokens)?,
            encoder: self.ptr(op, state.seq_lens_encoder)?,
            decoder: self.ptr(op, state.seq_lens_decoder)?,
            max_model_len: params.max_model_len as u64,
            max_step_tokens: dims.max_step_tokens as u64,
            n_end: inputs.end_tokens.len() as u64,
            real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
            pad: 0,
        };
        let f = self.function(
            KernelFile::UpdateState,
            Instance::integer(DType::I32),
            "update_state",
        )?;
        let blocks = launch::blocks_for(dims.real_bsz, BATCH_BLOCK);
        self.launch(op, &f, (blocks, 1, 1), BATCH_BLOCK, &args)
    }

    fn ngram_match(
        &self,
        inputs: &NgramInputs<'_>,
        out: &mut NgramOutputs<'_>,
        params: &NgramParams,
    ) -> Result<()> {
        validate_ngram_match(self.id(), inputs, out, params)?;
        let op = Op::NgramMatch;
        let dims = &params.dims;
        let _span = debug_span!("ngram_match", backend = "cuda", max_bsz = dims.max_bsz).entered();
        if dims.real_bsz == 0 {
            return Ok(());
        }
        let scratch = self.scratch(op, 16 * dims.real_bsz as u64)?;
        // n-gram sizes beyond u32 behave like u32::MAX: no history is that long.
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let args = NgramArgs {
            token_ids_all: self.ptr(op, inputs.token_ids_all)?,
            prompt_lens: self.ptr(op, inputs.prompt_lens)?,
            step_idx: self.ptr(op, inputs.step_idx)?,
            draft_token_num: self.ptr(op, inputs.draft_token_num)?,
            encoder: self.ptr(op, inputs.seq_lens_encoder)?,
            max_dec_len: self.ptr(op, inputs.max_dec_len)?,
            draft_tokens: self.ptr(op, out.draft_tokens)?,
            this_time: self.ptr(op, out.seq_lens_this_time)?,
            proposals: self.scratch_ptr(&scratch),
            max_model_len: params.max_model_len as u64,
            max_step_tokens: dims.max_step_tokens as u64,
            threshold: params.threshold as u64,
            real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
            min_ngram: clamp(params.min_ngram_size),
            max_ngram: clamp(params.max_ngram_size),
            pad: 0,
        };
        let instance = Instance::integer(DType::I32);
        let propose = self.function(KernelFile::NgramMatch, instance, "ngram_match_propose")?;
        self.launch(op, &propose, (args.real_bsz, 1, 1), BATCH_BLOCK, &args)?;
        let grant = self.function(KernelFile::NgramMatch, instance, "ngram_match")?;
        self.launch(op, &grant, (1, 1, 1), BATCH_BLOCK, &args)
    }

    fn accept_logprobs(
        &self,
        inputs: &LogprobsInputs<'_>,
        out: &mut LogprobsOutputs<'_>,
        params: &LogprobsParams<'_>,
    ) -> Result<()> {
        let dtype = validate_accept_logprobs(self.id(), inputs, out, params)?;
        let op = Op::AcceptLogprobs;
        let dims = &params.dims;
        let _span = debug_span!(
            "accept_logprobs",
            backend = "cuda",
            rows = params.shape.rows,
            top_k = params.top_k
        )
        .entered();
        let entries = dims.max_bsz * dims.max_step_tokens;
        let scratch = self.scratch(op, 4 * (2 * entries as u64 + 1))?;
        let args = LogprobsArgs {
            logits: self.ptr(op, inputs.logits)?,
            temperature: self.ptr(op, inputs.temperature)?,
            accept_tokens: self.ptr(op, inputs.accept_tokens)?,
            accept_num: self.ptr(op, inputs.accept_num)?,
            encoder: self.ptr(op, inputs.seq_lens_encoder)?,
            cu_out: self.ptr(op, inputs.cu_seqlens_q_output)?,
            cu_accept: self.ptr(op, out.cu_accept)?,
            token_ids: self.ptr(op, out.token_ids)?,
            logprobs: self.ptr(op, out.logprobs)?,
            ranks: self.ptr(op, out.ranks)?,
            top_ids: self.ptr(op, out.top_ids)?,
            top_logprobs: self.ptr(op, out.top_logprobs)?,
            entries: self.scratch_ptr(&scratch),
            rows: params.shape.rows as u64,
            max_step_tokens: dims.max_step_tokens as u64,
            max_bsz: to_u32(op, "max_bsz", dims.max_bsz)?,
            real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
            vocab: to_u32(op, "vocab", params.shape.vocab)?,
            top_k: to_u32(op, "top_k", params.top_k)?,
            vec: self.vec_ok(op, inputs.logits, params.shape.vocab)?,
            pad: 0,
        };
        let instance = Instance::float(dtype, dtype);
        // The prefix sum has max_bsz + 1 entries even for an empty batch.
        let pack = self.function(KernelFile::AcceptLogprobs, instance, "accept_logprobs_pack")?;
        self.launch(op, &pack, (1, 1, 1), BATCH_BLOCK, &args)?;
        if entries == 0 {
            return Ok(());
        }
        let score = self.function(KernelFile::AcceptLogprobs, instance, "accept_logprobs")?;
        self.launch(
            op,
            &score,
            (grid_x(op, entries)?, 1, 1),
            SELECT_BLOCK,
            &args,
        )
    }
}
