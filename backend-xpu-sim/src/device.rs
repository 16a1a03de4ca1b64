//! `XpuSimDevice`: the `Device` implementation over the OpenCL runtime.

use specula_backend_api::ops::*;
use specula_backend_api::{
    BackendKind, Buffer, Capabilities, DType, Device, DeviceId, DeviceInfo, Error, Op, Result,
};
use tracing::debug_span;

use crate::error::XpuSimError;
use crate::launch::LaunchConfig;
use crate::runtime::{Args, ClStorage, ProgramKey, Runtime, Source, elem_type, float_code};

/// An OpenCL device running the XPU-style kernels.
pub struct XpuSimDevice {
    id: DeviceId,
    info: DeviceInfo,
    capabilities: Capabilities,
    runtime: Runtime,
}

impl std::fmt::Debug for XpuSimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XpuSimDevice")
            .field("id", &self.id.0)
            .field("info", &self.info)
            .field("launch", &self.runtime.launch)
            .finish_non_exhaustive()
    }
}

fn check_size(dtype: DType, bytes: &[u8]) -> Result<usize> {
    if !bytes.len().is_multiple_of(dtype.size_bytes()) {
        return Err(Error::invalid(
            Op::Memory,
            "bytes",
            format!("a multiple of {} ({dtype})", dtype.size_bytes()),
            bytes.len(),
        ));
    }
    Ok(bytes.len() / dtype.size_bytes())
}

fn storage_mut(buffer: &mut Buffer) -> Result<&mut ClStorage> {
    buffer
        .storage_mut::<ClStorage>()
        .ok_or_else(|| XpuSimError::ForeignStorage.into_execution("buffer access"))
}

fn storage(buffer: &Buffer) -> Result<&ClStorage> {
    buffer
        .storage::<ClStorage>()
        .ok_or_else(|| XpuSimError::ForeignStorage.into_execution("buffer access"))
}

fn key(source: Source, defines: &[(&'static str, &str)]) -> ProgramKey {
    ProgramKey {
        source,
        defines: defines.iter().map(|&(k, v)| (k, v.to_owned())).collect(),
    }
}

impl XpuSimDevice {
    /// Opens OpenCL device `ordinal` (counted over every platform and device type, CPU devices
    /// included) with the launch shape `launch`.
    pub fn with_launch(ordinal: usize, launch: LaunchConfig) -> Result<Self> {
        let runtime = Runtime::open(ordinal, launch)?;
        Ok(XpuSimDevice {
            id: DeviceId::next(),
            info: DeviceInfo {
                kind: BackendKind::XpuSim,
                ordinal,
                name: runtime.name.clone(),
                driver: runtime.driver.clone(),
            },
            capabilities: Capabilities {
                float_dtypes: DType::FLOATS.to_vec(),
                max_buffer_bytes: Some(runtime.max_alloc),
            },
            runtime,
        })
    }

    /// Opens OpenCL device `ordinal` with the launch shape of `SPECULA_XPU_SIM_LAUNCH` (default
    /// 8x64).
    pub fn new(ordinal: usize) -> Result<Self> {
        let launch = LaunchConfig::from_env().map_err(|e| Error::Unavailable {
            backend: BackendKind::XpuSim,
            reason: e.to_string(),
        })?;
        Self::with_launch(ordinal, launch)
    }

    /// The launch shape every kernel uses.
    pub fn launch_config(&self) -> LaunchConfig {
        self.runtime.launch
    }

    fn scratch_i32(&self, len: usize) -> Result<ClStorage> {
        self.runtime.alloc(len.saturating_mul(4))
    }
}

impl Device for XpuSimDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn id(&self) -> DeviceId {
        self.id
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or(Error::OutOfMemory {
                backend: BackendKind::XpuSim,
                requested_bytes: usize::MAX,
            })?;
        let mut storage = self.runtime.alloc(bytes)?;
        self.runtime.zero(&mut storage, 0, bytes)?;
        Ok(Buffer::from_storage(dtype, len, self.id, Box::new(storage)))
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<Buffer> {
        let len = check_size(dtype, bytes)?;
        let mut storage = self.runtime.alloc(bytes.len())?;
        self.runtime.write(&mut storage, 0, bytes)?;
        Ok(Buffer::from_storage(dtype, len, self.id, Box::new(storage)))
    }

    fn write_bytes(&self, dst: &mut Buffer, bytes: &[u8]) -> Result<()> {
        let supplied = check_size(dst.dtype(), bytes)?;
        Check::new(Op::Memory, self.id).exact("dst", dst, dst.dtype(), dst.len())?;
        if supplied != dst.len() {
            return Err(Error::ShapeMismatch {
                op: Op::Memory,
                arg: "bytes",
                expected: dst.len(),
                actual: supplied,
            });
        }
        let offset = dst.offset() * dst.dtype().size_bytes();
        self.runtime.write(storage_mut(dst)?, offset, bytes)
    }

    fn download_bytes(&self, src: &Buffer) -> Result<Vec<u8>> {
        Check::new(Op::Memory, self.id).exact("src", src, src.dtype(), src.len())?;
        let mut out = vec![0u8; src.size_bytes()];
        let offset = src.offset() * src.dtype().size_bytes();
        self.runtime.read(storage(src)?, offset, &mut out)?;
        Ok(out)
    }

    fn synchronize(&self) -> Result<()> {
        self.runtime.finish()
    }

    fn build_output_layout(
        &self,
        lens: &SlotLens<'_>,
        out: &mut LayoutOutputs<'_>,
        params: &LayoutParams<'_>,
    ) -> Result<()> {
        let cap = validate_build_output_layout(self.id, lens, out, params)?;
        let dims = &params.dims;
        let _span = debug_span!(
            "build_output_layout",
            backend = "xpu-sim",
            max_bsz = dims.max_bsz
        )
        .entered();
        let mut args = Args::new();
        args.buf(lens.seq_lens_this_time)?
            .buf(lens.seq_lens_encoder)?
            .buf(out.seq_lens_output)?
            .buf(out.cu_seqlens_q)?
            .buf(out.cu_seqlens_q_output)?
            .buf(out.batch_id_per_token_output)?
            .u32("max_bsz", dims.max_bsz)?
            .u32("real_bsz", dims.real_bsz)?
            .u32("max_step_tokens", dims.max_step_tokens)?
            .u32("rows", cap)?;
        self.runtime.launch(
            &key(Source::Layout, &[]),
            &Op::BuildOutputLayout.entry_point(DType::I32),
            &args,
        )
    }

    fn gather_next_token(
        &self,
        inputs: &GatherInputs<'_>,
        out: &mut Buffer,
        params: &GatherParams<'_>,
    ) -> Result<()> {
        let rows = validate_gather_next_token(self.id, inputs, out, params)?;
        let _span = debug_span!(
            "gather_next_token",
            backend = "xpu-sim",
            rows,
            hidden = params.hidden
        )
        .entered();
        if rows == 0 {
            return Ok(());
        }
        let dtype = inputs.hidden_states.dtype();
        let entry = Op::GatherNextToken.entry_point(dtype);
        let mut args = Args::new();
        args.buf(inputs.hidden_states)?
            .buf(inputs.cu_seqlens_q)?
            .buf(inputs.lens.seq_lens_this_time)?
            .buf(inputs.lens.seq_lens_encoder)?
            .buf(inputs.layout.cu_seqlens_q_output)?
            .buf(inputs.layout.batch_id_per_token_output)?
            .buf(out)?
            .u64(params.token_num as u64)
            .u64(params.hidden as u64)
            .u32("real_bsz", params.dims.real_bsz)?
            .u32("max_step_tokens", params.dims.max_step_tokens)?
            .u32("rows", rows)?
            .u32("is_speculative", usize::from(params.is_speculative))?;
        self.runtime.launch(
            &key(
                Source::Gather,
                &[("ENTRY", &entry), ("ELEM", elem_type(dtype))],
            ),
            &entry,
            &args,
        )
    }

    fn build_sampling_params(
        &self,
        inputs: &SamplingParamsInputs<'_>,
        out: &mut RowSamplingParams<'_>,
        params: &SamplingParamsParams<'_>,
    ) -> Result<()> {
        let rows = validate_build_sampling_params(self.id, inputs, out, params)?;
        let _span = debug_span!("build_sampling_params", backend = "xpu-sim", rows).entered();
        if rows == 0 {
            return Ok(());
        }
        let mut args = Args::new();
        args.buf(inputs.slots.top_p)?
            .buf(inputs.slots.top_k)?
            .buf(inputs.slots.temperature)?
            .buf(inputs.slots.infer_seed)?
            .buf(inputs.lens.seq_lens_this_time)?
            .buf(inputs.lens.seq_lens_encoder)?
            .buf(inputs.layout.cu_seqlens_q_output)?
            .buf(inputs.layout.batch_id_per_token_output)?
            .buf(out.top_p)?
            .buf(out.top_k)?
            .buf(out.temperature)?
            .buf(out.seed)?
            .u32("real_bsz", params.dims.real_bsz)?
            .u32("max_step_tokens", params.dims.max_step_tokens)?
            .u32("rows", rows)?;
        self.runtime.launch(
            &key(Source::Layout, &[]),
            &Op::BuildSamplingParams.entry_point(DType::I32),
            &args,
        )
    }

    fn argmax(&self, input: &Buffer, out: &mut Buffer, shape: &RowShape) -> Result<()> {
        let dtype = validate_argmax(self.id, input, out, shape)?;
        let _span = debug_span!(
            "argmax",
            backend = "xpu-sim",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        if shape.rows == 0 {
            return Ok(());
        }
        let entry = Op::Argmax.entry_point(dtype);
        let mut args = Args::new();
        args.buf(input)?
            .buf(out)?
            .u32("rows", shape.rows)?
            .u32("vocab", shape.vocab)?;
        self.runtime.launch(
            &key(
                Source::Argmax,
                &[("ENTRY", &entry), ("T_DTYPE", float_code(dtype))],
            ),
            &entry,
            &args,
        )
    }

    fn softmax(
        &self,
        logits: &Buffer,
        temperature: &Buffer,
        probs: &mut Buffer,
        params: &SoftmaxParams<'_>,
    ) -> Result<()> {
        let dtype = validate_softmax(self.id, logits, temperature, probs, params)?;
        let shape = &params.shape;
        let _span = debug_span!(
            "softmax",
            backend = "xpu-sim",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        if shape.rows == 0 {
            return Ok(());
        }
        let entry = Op::Softmax.entry_point(dtype);
        let mut args = Args::new();
        args.buf(logits)?
            .buf(temperature)?
            .buf(probs)?
            .u32("rows", shape.rows)?
            .u32("vocab", shape.vocab)?;
        self.runtime.launch(
            &key(
                Source::Softmax,
                &[("ENTRY", &entry), ("T_DTYPE", float_code(dtype))],
            ),
            &entry,
            &args,
        )
    }

    fn top_k_top_p_sample(
        &self,
        inputs: &SampleInputs<'_>,
        tokens: &mut Buffer,
        params: &SampleParams<'_>,
    ) -> Result<()> {
        let dtype = validate_top_k_top_p_sample(self.id, inputs, tokens, params)?;
        let shape = &params.shape;
        let _span = debug_span!(
            "top_k_top_p_sample",
            backend = "xpu-sim",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        if shape.rows == 0 {
            return Ok(());
        }
        let entry = Op::TopKTopPSample.entry_point(dtype);
        let mut args = Args::new();
        args.buf(inputs.probs)?
            .buf(inputs.top_k)?
            .buf(inputs.top_p)?
            .buf(inputs.seed)?
            .buf(tokens)?
            .u32("rows", shape.rows)?
            .u32("vocab", shape.vocab)?;
        self.runtime.launch(
            &key(
                Source::Sample,
                &[("ENTRY", &entry), ("T_DTYPE", float_code(dtype))],
            ),
            &entry,
            &args,
        )
    }

    fn top_p_candidates(
        &self,
        inputs: &CandidatesInputs<'_>,
        out: &mut CandidatesOutputs<'_>,
        params: &CandidatesParams<'_>,
    ) -> Result<()> {
        let dtype = validate_top_p_candidates(self.id, inputs, out, params)?;
        let shape = &params.shape;
        let _span = debug_span!(
            "top_p_candidates",
            backend = "xpu-sim",
            rows = shape.rows,
            vocab = shape.vocab,
            candidates = params.candidates
        )
        .entered();
        if shape.rows == 0 {
            return Ok(());
        }
        let entry = Op::TopPCandidates.entry_point(dtype);
        let mut args = Args::new();
        args.buf(inputs.probs)?.buf(inputs.top_p)?;
        match inputs.batch_id_per_token_output {
            Some(batch_id) => args.buf(batch_id)?.u32("has_batch_id", 1)?,
            None => args
                .storage(self.runtime.placeholder())
                .u32("has_batch_id", 0)?,
        };
        args.buf(out.ids)?
            .buf(out.scores)?
            .buf(out.lens)?
            .u32("rows", shape.rows)?
            .u32("vocab", shape.vocab)?
            .u32("candidates", params.candidates)?;
        self.runtime.launch(
            &key(
                Source::Candidates,
                &[("ENTRY", &entry), ("T_DTYPE", float_code(dtype))],
            ),
            &entry,
            &args,
        )
    }

    fn verify_draft_tokens(
        &self,
        inputs: &VerifyInputs<'_>,
        out: &mut VerifyOutputs<'_>,
        params: &VerifyParams<'_>,
    ) -> Result<()> {
        let dtypes = validate_verify_draft_tokens(self.id, inputs, out, params)?;
        let strategy = inputs.strategy.strategy();
        let _span = debug_span!(
            "verify_draft_tokens",
            backend = "xpu-sim",
            strategy = strategy.name(),
            max_bsz = params.dims.max_bsz,
            rows = params.rows
        )
        .entered();
        let dims = &params.dims;
        if dims.max_bsz == 0 {
            return Ok(());
        }
        let (target_dtype, draft_dtype) = dtypes.unwrap_or((DType::F32, DType::F32));
        let strategy_code = match strategy {
            specula_backend_api::Strategy::Greedy => "0",
            specula_backend_api::Strategy::TargetMatch => "1",
            specula_backend_api::Strategy::TopP => "2",
            specula_backend_api::Strategy::Rejection => "3",
        };
        let entry = Op::VerifyDraftTokens.entry_point(target_dtype);
        let placeholder = self.runtime.placeholder();
        let state = &inputs.state;
        let mut args = Args::new();
        args.buf(inputs.draft_tokens)?
            .buf(inputs.lens.seq_lens_this_time)?
            .buf(inputs.lens.seq_lens_encoder)?
            .buf(inputs.cu_seqlens_q_output)?
            .buf(state.stop_flags)?
            .buf(state.is_block_step)?
            .buf(state.reasoning_status)?
            .buf(state.step_idx)?
            .buf(state.max_dec_len)?
            .buf(state.end_tokens)?
            .buf(inputs.seeds)?;
        let mut candidates = 0;
        match inputs.strategy {
            StrategyInputs::Greedy { target_tokens }
            | StrategyInputs::TargetMatch { target_tokens } => {
                args.buf(target_tokens)?;
                for _ in 0..7 {
                    args.storage(placeholder);
                }
            }
            StrategyInputs::TopP {
                candidate_ids,
                candidate_scores,
                candidate_lens,
                candidates: c,
            } => {
                candidates = c;
                args.storage(placeholder)
                    .buf(candidate_ids)?
                    .buf(candidate_scores)?
                    .buf(candidate_lens)?;
                for _ in 0..4 {
                    args.storage(placeholder);
                }
            }
            StrategyInputs::Rejection {
                target_probs,
                draft_probs,
                top_k,
                top_p,
            } => {
                for _ in 0..4 {
                    args.storage(placeholder);
                }
                args.buf(target_probs)?
                    .buf(draft_probs)?
                    .buf(top_k)?
                    .buf(top_p)?;
            }
        }
        args.buf(out.accept_tokens)?
            .buf(out.accept_num)?
            .u32("max_bsz", dims.max_bsz)?
            .u32("real_bsz", dims.real_bsz)?
            .u32("max_step_tokens", dims.max_step_tokens)?
            .u32("rows", params.rows)?
            .u32("vocab", params.vocab)?
            .u32("end_tokens", state.end_tokens.len())?
            .u32("candidates", candidates)?
            .u32("accept_all", usize::from(params.accept_all))?
            .u32("reject_all", usize::from(params.reject_all))?;
        self.runtime.launch(
            &key(
                Source::Verify,
                &[
                    ("ENTRY", &entry),
                    ("STRATEGY", strategy_code),
                    ("T_DTYPE", float_code(target_dtype)),
                    ("D_DTYPE", float_code(draft_dtype)),
                ],
            ),
            &entry,
            &args,
        )
    }

    fn update_state(
        &self,
        inputs: &UpdateStateInputs<'_>,
        state: &mut DecodeState<'_>,
        params: &UpdateStateParams,
    ) -> Result<()> {
        validate_update_state(self.id, inputs, state, params)?;
        let dims = &params.dims;
        let _span =
            debug_span!("update_state", backend = "xpu-sim", max_bsz = dims.max_bsz).entered();
        if dims.real_bsz == 0 {
            return Ok(());
        }
        let mut args = Args::new();
        args.buf(inputs.accept_tokens)?
            .buf(inputs.is_block_step)?
            .buf(inputs.prompt_lens)?
            .buf(inputs.max_dec_len)?
            .buf(inputs.end_tokens)?
            .buf(state.accept_num)?
            .buf(state.stop_flags)?
            .buf(state.token_ids_all)?
            .buf(state.step_idx)?
            .buf(state.infer_seed)?
            .buf(state.draft_tokens)?
            .buf(state.seq_lens_encoder)?
            .buf(state.seq_lens_decoder)?
            .u32("real_bsz", dims.real_bsz)?
            .u32("max_step_tokens", dims.max_step_tokens)?
            .u64(params.max_model_len as u64)
            .u32("end_tokens", inputs.end_tokens.len())?;
        self.runtime.launch(
            &key(Source::UpdateState, &[]),
            &Op::UpdateState.entry_point(DType::I32),
            &args,
        )
    }

    fn ngram_match(
        &self,
        inputs: &NgramInputs<'_>,
        out: &mut NgramOutputs<'_>,
        params: &NgramParams,
    ) -> Result<()> {
        validate_ngram_match(self.id, inputs, out, params)?;
        let dims = &params.dims;
        let _span =
            debug_span!("ngram_match", backend = "xpu-sim", max_bsz = dims.max_bsz).entered();
        if dims.real_bsz == 0 {
            return Ok(());
        }
        let entry = Op::NgramMatch.entry_point(DType::I32);
        let program = key(Source::Ngram, &[]);
        let proposal = self.scratch_i32(dims.real_bsz.saturating_mul(3))?;
        let mut search = Args::new();
        search
            .buf(inputs.token_ids_all)?
            .buf(inputs.prompt_lens)?
            .buf(inputs.step_idx)?
            .buf(inputs.draft_token_num)?
            .buf(inputs.seq_lens_encoder)?
            .buf(inputs.max_dec_len)?
            .buf(out.seq_lens_this_time)?
            .storage(&proposal)
            .u32("real_bsz", dims.real_bsz)?
            .u32("max_step_tokens", dims.max_step_tokens)?
            .u64(params.max_model_len as u64)
            .u32("min_ngram_size", params.min_ngram_size)?
            .u64(params.max_ngram_size as u64);
        self.runtime.launch(&program, &entry, &search)?;
        let mut budget = Args::new();
        budget
            .buf(inputs.token_ids_all)?
            .buf(inputs.seq_lens_encoder)?
            .storage(&proposal)
            .buf(out.draft_tokens)?
            .buf(out.seq_lens_this_time)?
            .u32("real_bsz", dims.real_bsz)?
            .u32("max_step_tokens", dims.max_step_tokens)?
            .u64(params.max_model_len as u64)
            .u64(params.threshold as u64);
        self.runtime
            .launch(&program, &format!("{entry}_budget"), &budget)
    }

    fn accept_logprobs(
        &self,
        inputs: &LogprobsInputs<'_>,
        out: &mut LogprobsOutputs<'_>,
        params: &LogprobsParams<'_>,
    ) -> Result<()> {
        let dtype = validate_accept_logprobs(self.id, inputs, out, params)?;
        let dims = &params.dims;
        let _span = debug_span!(
            "accept_logprobs",
            backend = "xpu-sim",
            rows = params.shape.rows,
            top_k = params.top_k
        )
        .entered();
        let entries = dims.max_bsz.saturating_mul(dims.max_step_tokens);
        let entry = Op::AcceptLogprobs.entry_point(dtype);
        let program = key(
            Source::Logprobs,
            &[("ENTRY", &entry), ("T_DTYPE", float_code(dtype))],
        );
        let entry_row = self.scratch_i32(entries)?;
        let mut pack = Args::new();
        pack.buf(inputs.accept_tokens)?
            .buf(inputs.accept_num)?
            .buf(inputs.seq_lens_encoder)?
            .buf(inputs.cu_seqlens_q_output)?
            .buf(out.cu_accept)?
            .buf(out.token_ids)?
            .storage(&entry_row)
            .u32("max_bsz", dims.max_bsz)?
            .u32("real_bsz", dims.real_bsz)?
            .u32("max_step_tokens", dims.max_step_tokens)?
            .u32("rows", params.shape.rows)?;
        self.runtime
            .launch(&program, "accept_logprobs_pack", &pack)?;
        if entries == 0 {
            return Ok(());
        }
        let mut score = Args::new();
        score
            .buf(inputs.logits)?
            .buf(inputs.temperature)?
            .buf(out.token_ids)?
            .storage(&entry_row)
            .buf(out.logprobs)?
            .buf(out.ranks)?
            .buf(out.top_ids)?
            .buf(out.top_logprobs)?
            .u32("entries", entries)?
            .u32("vocab", params.shape.vocab)?
            .u32("top_k", params.top_k)?;
        self.runtime.launch(&program, &entry, &score)
    }
}
