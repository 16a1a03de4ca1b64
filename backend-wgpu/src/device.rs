//! `WgpuDevice`: the `Device` implementation over one wgpu adapter.

use std::collections::HashMap;
use std::sync::Mutex;

use specula_backend_api::ops::*;
use specula_backend_api::{
    BackendKind, Buffer, Capabilities, DType, Device, DeviceId, DeviceInfo, Error, Op, Result,
};
use tracing::debug_span;

use crate::gpu::{Gpu, WgpuStorage, storage_of};
use crate::ops;

/// One opened wgpu adapter (Vulkan, Metal, DX12, or GL with compute).
#[derive(Debug)]
pub struct WgpuDevice {
    id: DeviceId,
    info: DeviceInfo,
    capabilities: Capabilities,
    pub(crate) gpu: Gpu,
    scratch: Mutex<HashMap<&'static str, std::sync::Arc<WgpuStorage>>>,
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

impl WgpuDevice {
    pub(crate) fn new(gpu: Gpu, ordinal: usize, name: String, driver: String) -> Self {
        let max_buffer_bytes = Some(gpu.limits.max_buffer_size);
        WgpuDevice {
            id: DeviceId::next(),
            info: DeviceInfo {
                kind: BackendKind::Wgpu,
                ordinal,
                name,
                driver,
            },
            capabilities: Capabilities {
                // f16 and bf16 are widened exactly from their bit patterns with u32 arithmetic, so
                // they need no optional feature (SHADER_F16) and keep subnormals.
                float_dtypes: DType::FLOATS.to_vec(),
                max_buffer_bytes,
            },
            gpu,
            scratch: Mutex::new(HashMap::new()),
        }
    }

    /// A reusable internal buffer of at least `bytes` bytes for one purpose (grown on demand).
    pub(crate) fn scratch(
        &self,
        name: &'static str,
        bytes: u64,
    ) -> Result<std::sync::Arc<WgpuStorage>> {
        let mut map = self
            .scratch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(s) = map.get(name)
            && s.bytes >= bytes
        {
            return Ok(s.clone());
        }
        let size = bytes.max(256).next_power_of_two();
        let storage = std::sync::Arc::new(self.gpu.create_storage(size, name)?);
        map.insert(name, storage.clone());
        Ok(storage)
    }
}

impl Device for WgpuDevice {
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
                backend: BackendKind::Wgpu,
                requested_bytes: usize::MAX,
            })?;
        // wgpu zero-initialises new buffers.
        let storage = self.gpu.create_storage(bytes as u64, "specula buffer")?;
        Ok(Buffer::from_storage(dtype, len, self.id, Box::new(storage)))
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<Buffer> {
        let len = check_size(dtype, bytes)?;
        let buffer = self.alloc_zeroed(dtype, len)?;
        let storage = storage_of(&buffer)?;
        let whole = bytes.len() / 4 * 4;
        self.gpu.write_aligned(storage, 0, &bytes[..whole])?;
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.gpu.write_aligned(storage, whole as u64, &tail)?;
        }
        Ok(buffer)
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
        if bytes.is_empty() {
            return Ok(());
        }
        let start = (dst.offset() * dst.dtype().size_bytes()) as u64;
        let storage = storage_of(dst)?;
        if start.is_multiple_of(4) && bytes.len().is_multiple_of(4) {
            return self.gpu.write_aligned(storage, start, bytes);
        }
        // An unaligned window: read the covering words, patch them, write them back.
        let from = start / 4 * 4;
        let to = (start + bytes.len() as u64).div_ceil(4) * 4;
        let mut words = self.gpu.read(storage, from, to - from)?;
        let skip = (start - from) as usize;
        words[skip..skip + bytes.len()].copy_from_slice(bytes);
        self.gpu.write_aligned(storage, from, &words)
    }

    fn download_bytes(&self, src: &Buffer) -> Result<Vec<u8>> {
        Check::new(Op::Memory, self.id).exact("src", src, src.dtype(), src.len())?;
        let size = src.dtype().size_bytes() as u64;
        self.gpu.read(
            storage_of(src)?,
            src.offset() as u64 * size,
            src.len() as u64 * size,
        )
    }

    fn synchronize(&self) -> Result<()> {
        self.gpu.wait("synchronize")
    }

    fn build_output_layout(
        &self,
        lens: &SlotLens<'_>,
        out: &mut LayoutOutputs<'_>,
        params: &LayoutParams<'_>,
    ) -> Result<()> {
        validate_build_output_layout(self.id, lens, out, params)?;
        let _span = debug_span!(
            "build_output_layout",
            backend = "wgpu",
            max_bsz = params.dims.max_bsz
        )
        .entered();
        ops::layout::build_output_layout(self, lens, out, params)
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
            backend = "wgpu",
            rows,
            hidden = params.hidden
        )
        .entered();
        ops::layout::gather_next_token(self, inputs, out, params, rows)
    }

    fn build_sampling_params(
        &self,
        inputs: &SamplingParamsInputs<'_>,
        out: &mut RowSamplingParams<'_>,
        params: &SamplingParamsParams<'_>,
    ) -> Result<()> {
        let rows = validate_build_sampling_params(self.id, inputs, out, params)?;
        let _span = debug_span!("build_sampling_params", backend = "wgpu", rows).entered();
        ops::layout::build_sampling_params(self, inputs, out, params, rows)
    }

    fn argmax(&self, input: &Buffer, out: &mut Buffer, shape: &RowShape) -> Result<()> {
        let dtype = validate_argmax(self.id, input, out, shape)?;
        let _span = debug_span!(
            "argmax",
            backend = "wgpu",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        ops::rows::argmax(self, dtype, input, out, shape)
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
            backend = "wgpu",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        ops::rows::softmax(self, dtype, logits, temperature, probs, shape)
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
            backend = "wgpu",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        ops::rows::top_k_top_p_sample(self, dtype, inputs, tokens, shape)
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
            backend = "wgpu",
            rows = shape.rows,
            vocab = shape.vocab,
            candidates = params.candidates
        )
        .entered();
        ops::rows::top_p_candidates(self, dtype, inputs, out, params)
    }

    fn verify_draft_tokens(
        &self,
        inputs: &VerifyInputs<'_>,
        out: &mut VerifyOutputs<'_>,
        params: &VerifyParams<'_>,
    ) -> Result<()> {
        let dtypes = validate_verify_draft_tokens(self.id, inputs, out, params)?;
        let _span = debug_span!(
            "verify_draft_tokens",
            backend = "wgpu",
            strategy = inputs.strategy.strategy().name(),
            max_bsz = params.dims.max_bsz,
            rows = params.rows
        )
        .entered();
        ops::verify::verify_draft_tokens(self, dtypes, inputs, out, params)
    }

    fn update_state(
        &self,
        inputs: &UpdateStateInputs<'_>,
        state: &mut DecodeState<'_>,
        params: &UpdateStateParams,
    ) -> Result<()> {
        validate_update_state(self.id, inputs, state, params)?;
        let _span = debug_span!(
            "update_state",
            backend = "wgpu",
            max_bsz = params.dims.max_bsz
        )
        .entered();
        ops::state::update_state(self, inputs, state, params)
    }

    fn ngram_match(
        &self,
        inputs: &NgramInputs<'_>,
        out: &mut NgramOutputs<'_>,
        params: &NgramParams,
    ) -> Result<()> {
        validate_ngram_match(self.id, inputs, out, params)?;
        let _span = debug_span!(
            "ngram_match",
            backend = "wgpu",
            max_bsz = params.dims.max_bsz
        )
        .entered();
        ops::state::ngram_match(self, inputs, out, params)
    }

    fn accept_logprobs(
        &self,
        inputs: &LogprobsInputs<'_>,
        out: &mut LogprobsOutputs<'_>,
        params: &LogprobsParams<'_>,
    ) -> Result<()> {
        let dtype = validate_accept_logprobs(self.id, inputs, out, params)?;
        let _span = debug_span!(
            "accept_logprobs",
            backend = "wgpu",
            rows = params.shape.rows,
            top_k = params.top_k
        )
        .entered();
        ops::logprobs::accept_logprobs(self, dtype, inputs, out, params)
    }
}
