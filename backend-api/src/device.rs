//! The `Device` trait every backend implements, and typed helpers over it.

use std::fmt::Debug;

use crate::ops::*;
use crate::{Buffer, Capabilities, DType, DeviceId, DeviceInfo, Element, Error, Op, Result};

/// One opened device of one backend: memory plus every op of the contract.
///
/// The trait is object-safe (`Arc<dyn Device>` works) and synchronous with enqueue semantics: an op
/// validates its arguments on the host and returns an error before launching anything; faults while
/// executing surface at the next [`Device::synchronize`] or download. Outputs are caller-allocated
/// `&mut` buffers, so they can be reused across steps. Typed helpers are in [`DeviceExt`].
///
/// Every op is a required method, so a backend cannot silently omit one; a dtype a backend does not
/// support is [`Error::Unsupported`], predicted by [`Device::capabilities`]. The semantics of each
/// op are in the contract and the project's `docs/semantics.md`.
pub trait Device: Send + Sync + Debug {
    /// What this device is.
    fn info(&self) -> &DeviceInfo;
    /// The id every buffer of this device carries.
    fn id(&self) -> DeviceId;
    /// What this device supports.
    fn capabilities(&self) -> &Capabilities;

    /// Allocates `len` zeroed elements of `dtype`.
    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer>;
    /// Allocates a buffer holding `bytes` (a whole number of `dtype` elements). Blocks until copied.
    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<Buffer>;
    /// Overwrites the window of `dst` with `bytes` (exactly its size). Blocks until copied.
    fn write_bytes(&self, dst: &mut Buffer, bytes: &[u8]) -> Result<()>;
    /// Copies the window of `src` to the host. Blocks until the device has finished writing it.
    fn download_bytes(&self, src: &Buffer) -> Result<Vec<u8>>;
    /// Waits for every enqueued op; reports execution faults.
    fn synchronize(&self) -> Result<()>;

    /// Computes the output layout of §1: rows per slot, the input and output prefix sums and the
    /// slot of each output row.
    fn build_output_layout(
        &self,
        lens: &SlotLens<'_>,
        out: &mut LayoutOutputs<'_>,
        params: &LayoutParams<'_>,
    ) -> Result<()>;

    /// Gathers the hidden-state row each output row predicts from (§4.1). Bit-exact copy.
    fn gather_next_token(
        &self,
        inputs: &GatherInputs<'_>,
        out: &mut Buffer,
        params: &GatherParams<'_>,
    ) -> Result<()>;

    /// Expands per-slot `top_p`, `top_k`, temperature and `infer_seed` into per-output-row arrays
    /// with the seed rule of §2.
    fn build_sampling_params(
        &self,
        inputs: &SamplingParamsInputs<'_>,
        out: &mut RowSamplingParams<'_>,
        params: &SamplingParamsParams<'_>,
    ) -> Result<()>;

    /// Per-row argmax (§4.2): NaN below every number, −0 equal to +0, ties to the lowest id.
    fn argmax(&self, input: &Buffer, out: &mut Buffer, shape: &RowShape) -> Result<()>;

    /// `probs = softmax(logits / temperature)` per row, f32 output (§4.9).
    fn softmax(
        &self,
        logits: &Buffer,
        temperature: &Buffer,
        probs: &mut Buffer,
        params: &SoftmaxParams<'_>,
    ) -> Result<()>;

    /// Exact top-k/top-p sampling with per-row seeds (§4.3).
    fn top_k_top_p_sample(
        &self,
        inputs: &SampleInputs<'_>,
        tokens: &mut Buffer,
        params: &SampleParams<'_>,
    ) -> Result<()>;

    /// The first `C` tokens in rank order and the top-p prefix length (§4.4).
    fn top_p_candidates(
        &self,
        inputs: &CandidatesInputs<'_>,
        out: &mut CandidatesOutputs<'_>,
        params: &CandidatesParams<'_>,
    ) -> Result<()>;

    /// Verifies draft tokens and emits the correction or bonus token (§4.5).
    fn verify_draft_tokens(
        &self,
        inputs: &VerifyInputs<'_>,
        out: &mut VerifyOutputs<'_>,
        params: &VerifyParams<'_>,
    ) -> Result<()>;

    /// Appends the emitted tokens and advances the per-slot state (§4.6).
    fn update_state(
        &self,
        inputs: &UpdateStateInputs<'_>,
        state: &mut DecodeState<'_>,
        params: &UpdateStateParams,
    ) -> Result<()>;

    /// Proposes drafts by n-gram lookup in the prompt and the generated history (§4.7).
    fn ngram_match(
        &self,
        inputs: &NgramInputs<'_>,
        out: &mut NgramOutputs<'_>,
        params: &NgramParams,
    ) -> Result<()>;

    /// Log-probabilities, ranks and top-K of the accepted tokens (§4.8).
    fn accept_logprobs(
        &self,
        inputs: &LogprobsInputs<'_>,
        out: &mut LogprobsOutputs<'_>,
        params: &LogprobsParams<'_>,
    ) -> Result<()>;
}

/// Typed helpers over any [`Device`]; kept out of the trait so it stays object-safe.
pub trait DeviceExt: Device {
    /// Uploads a typed slice.
    fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer> {
        self.upload_bytes(T::DTYPE, bytemuck::cast_slice(data))
    }

    /// Overwrites a buffer's window with a typed slice.
    fn write<T: Element>(&self, dst: &mut Buffer, data: &[T]) -> Result<()> {
        check_dtype(dst, T::DTYPE)?;
        self.write_bytes(dst, bytemuck::cast_slice(data))
    }

    /// Allocates `len` zeroed elements of `T`.
    fn alloc<T: Element>(&self, len: usize) -> Result<Buffer> {
        self.alloc_zeroed(T::DTYPE, len)
    }

    /// Downloads a buffer's window as a typed vector.
    fn download<T: Element>(&self, src: &Buffer) -> Result<Vec<T>> {
        check_dtype(src, T::DTYPE)?;
        let bytes = self.download_bytes(src)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}

impl<D: Device + ?Sized> DeviceExt for D {}

fn check_dtype(buffer: &Buffer, dtype: DType) -> Result<()> {
    if buffer.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            op: Op::Memory,
            arg: "buffer",
            expected: dtype.name().to_owned(),
            actual: buffer.dtype(),
        });
    }
    Ok(())
}
