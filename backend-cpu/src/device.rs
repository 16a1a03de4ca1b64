//! `CpuDevice`: the `Device` implementation.

use specula_backend_api::ops::*;
use specula_backend_api::{
    BackendKind, Buffer, Capabilities, DType, Device, DeviceId, DeviceInfo, Error, Op, Result,
};
use tracing::debug_span;

use crate::ops;
use crate::storage::{self, CpuStorage};

/// The CPU reference device. Ops run on its own `rayon` pool.
#[derive(Debug)]
pub struct CpuDevice {
    id: DeviceId,
    info: DeviceInfo,
    capabilities: Capabilities,
    pool: rayon::ThreadPool,
}

impl CpuDevice {
    /// Opens the CPU device with one thread per available core.
    pub fn new() -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_threads(threads)
    }

    /// Opens the CPU device with `threads` worker threads (at least 1).
    pub fn with_threads(threads: usize) -> Result<Self> {
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("specula-cpu-{i}"))
            .build()
            .map_err(|e| Error::Unavailable {
                backend: BackendKind::Cpu,
                reason: format!("cannot start the thread pool: {e}"),
            })?;
        Ok(CpuDevice {
            id: DeviceId::next(),
            info: DeviceInfo {
                kind: BackendKind::Cpu,
                ordinal: 0,
                name: format!("cpu ({threads} threads)"),
                driver: "rayon".to_owned(),
            },
            capabilities: Capabilities {
                float_dtypes: DType::FLOATS.to_vec(),
                max_buffer_bytes: None,
            },
            pool,
        })
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// One streaming read of a buffer's window on this device's threads: a wrapping sum of its
    /// 8-byte words (and trailing bytes). Benchmarks compare every op with this memory floor,
    /// measured on the same buffer, threads and cache state.
    pub fn read_floor(&self, buffer: &Buffer) -> Result<u64> {
        use rayon::prelude::*;
        Check::new(Op::Memory, self.id).exact("buffer", buffer, buffer.dtype(), buffer.len())?;
        let bytes = storage::bytes(buffer)?;
        Ok(self.run(|| {
            bytes
                .par_chunks(1 << 16)
                .map(|chunk| {
                    let (words, tail) = chunk.split_at(chunk.len() / 8 * 8);
                    let words: &[u64] = bytemuck::cast_slice(words);
                    let sum = words.iter().fold(0u64, |a, &w| a.wrapping_add(w));
                    tail.iter().fold(sum, |a, &b| a.wrapping_add(u64::from(b)))
                })
                .reduce(|| 0, u64::wrapping_add)
        }))
    }

    /// A parallel copy between two windows of the same size on this device's threads: the memcpy
    /// reference of benchmarks.
    pub fn copy_floor(&self, src: &Buffer, dst: &mut Buffer) -> Result<()> {
        use rayon::prelude::*;
        let check = Check::new(Op::Memory, self.id);
        check.exact("src", src, src.dtype(), src.len())?;
        check.exact("dst", dst, src.dtype(), src.len())?;
        let from = storage::bytes(src)?;
        let to = storage::bytes_mut(dst)?;
        self.run(|| {
            to.par_chunks_mut(1 << 16)
                .zip(from.par_chunks(1 << 16))
                .for_each(|(t, f)| t.copy_from_slice(f))
        });
        Ok(())
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
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

impl Device for CpuDevice {
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
                backend: BackendKind::Cpu,
                requested_bytes: usize::MAX,
            })?;
        let storage = CpuStorage::zeroed(bytes);
        Ok(Buffer::from_storage(dtype, len, self.id, Box::new(storage)))
    }

    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<Buffer> {
        let len = check_size(dtype, bytes)?;
        let mut buffer = self.alloc_zeroed(dtype, len)?;
        storage::bytes_mut(&mut buffer)?.copy_from_slice(bytes);
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
        storage::bytes_mut(dst)?.copy_from_slice(bytes);
        Ok(())
    }

    fn download_bytes(&self, src: &Buffer) -> Result<Vec<u8>> {
        Check::new(Op::Memory, self.id).exact("src", src, src.dtype(), src.len())?;
        Ok(storage::bytes(src)?.to_vec())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
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
            backend = "cpu",
            max_bsz = params.dims.max_bsz
        )
        .entered();
        ops::layout::build_output_layout(lens, out, params)
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
            backend = "cpu",
            rows,
            hidden = params.hidden
        )
        .entered();
        self.run(|| ops::gather::gather_next_token(inputs, out, params))
    }

    fn build_sampling_params(
        &self,
        inputs: &SamplingParamsInputs<'_>,
        out: &mut RowSamplingParams<'_>,
        params: &SamplingParamsParams<'_>,
    ) -> Result<()> {
        let rows = validate_build_sampling_params(self.id, inputs, out, params)?;
        let _span = debug_span!("build_sampling_params", backend = "cpu", rows).entered();
        ops::layout::build_sampling_params(inputs, out, params)
    }

    fn argmax(&self, input: &Buffer, out: &mut Buffer, shape: &RowShape) -> Result<()> {
        let dtype = validate_argmax(self.id, input, out, shape)?;
        let _span = debug_span!(
            "argmax",
            backend = "cpu",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        self.run(|| ops::argmax::argmax(dtype, input, out, shape))
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
            backend = "cpu",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        self.run(|| ops::softmax::softmax(dtype, logits, temperature, probs, shape))
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
            backend = "cpu",
            rows = shape.rows,
            vocab = shape.vocab
        )
        .entered();
        self.run(|| ops::sample::top_k_top_p_sample(dtype, inputs, tokens, shape))
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
            backend = "cpu",
            rows = shape.rows,
            vocab = shape.vocab,
            candidates = params.candidates
        )
        .entered();
        self.run(|| ops::candidates::top_p_candidates(dtype, inputs, out, params))
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
            backend = "cpu",
            strategy = inputs.strategy.strategy().name(),
            max_bsz = params.dims.max_bsz,
            rows = params.rows
        )
        .entered();
        self.run(|| ops::verify::verify_draft_tokens(dtypes, inputs, out, params))
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
            backend = "cpu",
            max_bsz = params.dims.max_bsz
        )
        .entered();
        ops::state::update_state(inputs, state, params)
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
            backend = "cpu",
            max_bsz = params.dims.max_bsz
        )
        .entered();
        self.run(|| ops::ngram::ngram_match(inputs, out, params))
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
            backend = "cpu",
            rows = params.shape.rows,
            top_k = params.top_k
        )
        .entered();
        self.run(|| ops::logprobs::accept_logprobs(dtype, inputs, out, params))
    }
}
