//! The `Device` trait a runner calls, its one implementation for every [`Backend`], and typed
//! helpers over it.

use tracing::debug_span;

use crate::backend::{Alloc, AnyCall, Backend, Download, Upload, Write};
use crate::ops::{self, *};
use crate::transfer::{MemoryStats, PendingDownload, WriteAt};
use crate::{
    BorrowedInput, Buffer, Capabilities, DType, DeviceId, DeviceInfo, Element, Error, Op, Result,
    WarmUp,
};
use crate::{fallback, host};

/// One opened device of one backend: memory plus every op of the contract.
///
/// The trait is object-safe (`Arc<dyn Device>` works) and synchronous with enqueue semantics: an op
/// validates its arguments on the host and returns an error before launching anything; faults while
/// executing surface at the next [`Device::synchronize`] or download. Outputs are caller-allocated
/// `&mut` buffers, so they can be reused across steps. Typed helpers are in [`DeviceExt`].
///
/// Every device is a [`Backend`], and every `Backend` is a `Device` through one blanket
/// implementation that overrides nothing: the methods below are the validating front of every
/// backend, written once. Each checks the arguments (`docs/semantics.md` §6), opens a `specula_op`
/// tracing span (fields `op`, `backend`, `rows`, `width`) and skips the launch of an op with
/// nothing to do, then calls [`Backend::run`] with a validated call. A dtype a backend does not
/// support is [`Error::Unsupported`], predicted by [`Device::capabilities`]. The sections the op
/// methods cite (§5.1 … §5.17) are those of `docs/semantics.md`.
pub trait Device: Backend {
    /// What this device is.
    fn info(&self) -> &DeviceInfo {
        &self.desc().info
    }
    /// The id every buffer of this device carries.
    fn id(&self) -> DeviceId {
        self.desc().id
    }
    /// What this device supports.
    fn capabilities(&self) -> &Capabilities {
        &self.desc().capabilities
    }

    /// Allocates `len` zeroed elements of `dtype`.
    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer> {
        self.run_alloc_zeroed(Alloc::checked(self.desc(), dtype, len)?)
    }
    /// Allocates a buffer holding `bytes` (a whole number of `dtype` elements). Blocks until copied.
    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<Buffer> {
        let len = whole_elements(dtype, bytes)?;
        let alloc = Alloc::checked(self.desc(), dtype, len)?;
        self.desc().counters().uploaded();
        self.run_upload(Upload::new(alloc, bytes))
    }
    /// Overwrites the window of `dst` with `bytes` (exactly its size). Blocks until copied.
    fn write_bytes(&self, dst: &mut Buffer, bytes: &[u8]) -> Result<()> {
        check_write(self.desc(), dst, None, bytes)?;
        self.desc().counters().wrote();
        self.run_write(Write::new(dst, bytes))
    }
    /// Overwrites several windows, in order, with one batched write ([`MemoryStats::writes`]
    /// counts it once): each [`WriteAt`] puts its bytes at an element offset of its buffer's
    /// window. Every write is validated (owning device, whole elements, inside the window) before
    /// any is made. The buffers' windows are as they were afterwards. Blocks until copied.
    fn write_many(&self, writes: &mut [WriteAt<'_, '_>]) -> Result<()> {
        for w in writes.iter() {
            check_write(self.desc(), w.dst, Some(w.offset), w.bytes)?;
        }
        if writes.is_empty() {
            return Ok(());
        }
        self.desc().counters().wrote();
        let windows: Vec<(usize, usize)> = writes
            .iter()
            .map(|w| (w.dst.offset(), w.dst.len()))
            .collect();
        let narrowed = writes.iter_mut().try_for_each(|w| {
            let len = w.bytes.len() / w.dst.dtype().size_bytes();
            w.dst.set_window(w.dst.offset() + w.offset, len)
        });
        let written = narrowed.and_then(|()| {
            let batch = writes
                .iter_mut()
                .map(|w| Write::new(&mut *w.dst, w.bytes))
                .collect();
            self.run_write_many(batch)
        });
        for (w, &(offset, len)) in writes.iter_mut().zip(&windows) {
            // The window was valid before: restoring it cannot fail.
            w.dst.set_window(offset, len)?;
        }
        written
    }
    /// Copies the window of `src` to the host. Blocks until the device has finished writing it.
    fn download_bytes(&self, src: &Buffer) -> Result<Vec<u8>> {
        Check::new(Op::Memory, self.desc()).exact("src", src, src.dtype(), src.len())?;
        self.desc().counters().waited();
        self.run_download(Download::new(src))
    }
    /// Starts copying the windows of `srcs` to the host behind every op enqueued so far and
    /// returns without waiting where the backend allows (wgpu, xpu-sim, cuda; the CPU backend has
    /// already copied). [`PendingDownload::wait`] then blocks once for all of them: one
    /// [`MemoryStats::blocking_waits`] however many buffers. Each buffer is validated like a
    /// download (owning device).
    fn start_download(&self, srcs: &[&Buffer]) -> Result<PendingDownload> {
        let check = Check::new(Op::Memory, self.desc());
        for src in srcs {
            check.exact("src", src, src.dtype(), src.len())?;
        }
        let downloads: Vec<Download<'_>> = srcs.iter().map(|src| Download::new(src)).collect();
        let sizes = srcs.iter().map(|src| src.size_bytes()).collect();
        let pending = self.run_start_download(&downloads)?;
        Ok(pending.validated(sizes, self.desc().counters().clone()))
    }
    /// Waits for every enqueued op; reports execution faults.
    fn synchronize(&self) -> Result<()> {
        self.desc().counters().waited();
        self.run_synchronize()
    }
    /// How many blocking waits, writes and uploads this device has been asked for since it was
    /// opened (see [`MemoryStats`]), and, on a backend that counts them, the driver calls it made
    /// ([`MemoryStats::driver`]); [`MemoryStats::since`] gives those of a span of calls.
    fn memory_stats(&self) -> MemoryStats {
        let desc = self.desc();
        desc.counters()
            .snapshot(desc.driver_counters().map(|c| c.as_ref()))
    }

    /// Builds every kernel the device would otherwise build at the first call that needs it
    /// (WGSL pipelines, OpenCL programs, NVRTC modules), for every op it runs and every dtype it
    /// supports, so that no later op call pays a compile: [`Device::warm_up_for`] with
    /// [`WarmUp::all`]. Call it once after opening the device; it is idempotent, and a device
    /// without compiled kernels (CPU, reference) returns `Ok(())` at once. A kernel that fails to
    /// build is [`Error::KernelBuild`] naming the op's kernel.
    fn warm_up(&self) -> Result<()> {
        self.warm_up_for(&WarmUp::all())
    }

    /// Builds the kernels of `plan` only: its ops (those this device runs) for score rows of its
    /// float dtypes (those this device supports). A runner that knows its decoding mode and its
    /// logits dtype builds what its steps launch and nothing else (on a software adapter a full
    /// warm-up costs more than it saves). Idempotent; errors as [`Device::warm_up`]. Opens a
    /// `specula_warm_up` span.
    fn warm_up_for(&self, plan: &WarmUp) -> Result<()> {
        let desc = self.desc();
        let _span = debug_span!(
            "specula_warm_up",
            backend = desc.info.kind.name(),
            ops = plan.ops().len(),
            dtypes = plan.dtypes().len()
        )
        .entered();
        self.run_warm_up(&plan.for_device(&desc.capabilities))
    }

    /// Computes the output layout (§5.1): rows per slot, the input and output prefix sums and the
    /// slot of each output row.
    fn build_output_layout(
        &self,
        lens: &SlotLens<'_>,
        out: &mut LayoutOutputs<'_>,
        params: &LayoutParams<'_>,
    ) -> Result<()> {
        let call = ops::build_output_layout::validate(self.desc(), lens, out, params)?;
        front(self, AnyCall::BuildOutputLayout(call))
    }

    /// Gathers the hidden-state row each output row predicts from (§5.2). Bit-exact copy.
    fn gather_next_token(
        &self,
        inputs: &GatherInputs<'_>,
        out: &mut Buffer,
        params: &GatherParams<'_>,
    ) -> Result<()> {
        let call = ops::gather_next_token::validate(self.desc(), inputs, out, params)?;
        front(self, AnyCall::GatherNextToken(call))
    }

    /// Expands per-slot `top_p`, `top_k`, temperature and `infer_seed` into per-output-row arrays
    /// with the seed rule (§5.3).
    fn build_sampling_params(
        &self,
        inputs: &SamplingParamsInputs<'_>,
        out: &mut RowSamplingParams<'_>,
        params: &SamplingParamsParams<'_>,
    ) -> Result<()> {
        let call = ops::build_sampling_params::validate(self.desc(), inputs, out, params)?;
        front(self, AnyCall::BuildSamplingParams(call))
    }

    /// Per-row argmax (§5.4): NaN below every number, −0 equal to +0, ties to the lowest id.
    fn argmax(&self, input: &Buffer, out: &mut Buffer, shape: &RowShape) -> Result<()> {
        let call = ops::argmax::validate(self.desc(), input, out, shape)?;
        front(self, AnyCall::Argmax(call))
    }

    /// `probs = softmax(logits / temperature)` per row, f32 output (§5.5).
    fn softmax(
        &self,
        logits: &Buffer,
        temperature: &Buffer,
        probs: &mut Buffer,
        params: &SoftmaxParams<'_>,
    ) -> Result<()> {
        let inputs = SoftmaxInputs {
            logits,
            temperature,
        };
        let call = ops::softmax::validate(self.desc(), inputs, probs, params)?;
        front(self, AnyCall::Softmax(call))
    }

    /// Exact top-k/top-p sampling with per-row seeds (§5.6).
    fn top_k_top_p_sample(
        &self,
        inputs: &SampleInputs<'_>,
        tokens: &mut Buffer,
        params: &SampleParams<'_>,
    ) -> Result<()> {
        let call = ops::top_k_top_p_sample::validate(self.desc(), inputs, tokens, params)?;
        front(self, AnyCall::TopKTopPSample(call))
    }

    /// [`Device::top_k_top_p_sample`] of the rows `process_logits` makes of `inputs.scores`
    /// with `processing` (§5.12), each row yielding its fallback when its total weight is 0:
    /// exactly the composition `process_logits` of every row, then `top_k_top_p_sample` with
    /// its `fallback` output. `inputs.fallback` must be `None`. A device with
    /// [`Capabilities::fused_processing`] applies the processing as its sampling pass reads
    /// the scores; any other runs the composition through scratch buffers it allocates.
    fn top_k_top_p_sample_processed(
        &self,
        inputs: &SampleInputs<'_>,
        processing: &RowProcessing<'_>,
        tokens: &mut Buffer,
        params: &SampleParams<'_>,
    ) -> Result<()> {
        let call = ops::top_k_top_p_sample_processed::validate(
            self.desc(),
            (inputs, processing),
            tokens,
            params,
        )?;
        front(self, AnyCall::TopKTopPSampleProcessed(call))
    }

    /// The first `C` tokens in rank order and the top-p prefix length (§5.7).
    fn top_p_candidates(
        &self,
        inputs: &CandidatesInputs<'_>,
        out: &mut CandidatesOutputs<'_>,
        params: &CandidatesParams<'_>,
    ) -> Result<()> {
        let call = ops::top_p_candidates::validate(self.desc(), inputs, out, params)?;
        front(self, AnyCall::TopPCandidates(call))
    }

    /// Verifies draft tokens and emits the correction or bonus token (§5.8).
    fn verify_draft_tokens(
        &self,
        inputs: &VerifyInputs<'_>,
        out: &mut VerifyOutputs<'_>,
        params: &VerifyParams<'_>,
    ) -> Result<()> {
        let call = ops::verify_draft_tokens::validate(self.desc(), inputs, out, params)?;
        front(self, AnyCall::VerifyDraftTokens(call))
    }

    /// Appends the emitted tokens and advances the per-slot state (§5.9).
    fn update_state(
        &self,
        inputs: &UpdateStateInputs<'_>,
        state: &mut DecodeState<'_>,
        params: &UpdateStateParams,
    ) -> Result<()> {
        let call = ops::update_state::validate(self.desc(), inputs, state, params)?;
        front(self, AnyCall::UpdateState(call))
    }

    /// Proposes drafts by n-gram lookup in the prompt and the generated history (§5.10).
    fn ngram_match(
        &self,
        inputs: &NgramInputs<'_>,
        out: &mut NgramOutputs<'_>,
        params: &NgramParams,
    ) -> Result<()> {
        let call = ops::ngram_match::validate(self.desc(), inputs, out, params)?;
        front(self, AnyCall::NgramMatch(call))
    }

    /// Log-probabilities, ranks and top-K of the accepted tokens (§5.11).
    fn accept_logprobs(
        &self,
        inputs: &LogprobsInputs<'_>,
        out: &mut LogprobsOutputs<'_>,
        params: &LogprobsParams<'_>,
    ) -> Result<()> {
        let call = ops::accept_logprobs::validate(self.desc(), inputs, out, params)?;
        front(self, AnyCall::AcceptLogprobs(call))
    }

    /// Applies the per-request sampling parameters to each row from its own history (§5.12):
    /// masks, logit bias, penalties and min_p.
    fn process_logits(
        &self,
        inputs: &ProcessInputs<'_>,
        out: &mut ProcessOutputs<'_>,
        params: &ProcessParams<'_>,
    ) -> Result<()> {
        let call = ops::process_logits::validate(self.desc(), inputs, out, params)?;
        front(self, AnyCall::ProcessLogits(call))
    }

    /// Sharded rows (§5.13): per row, the largest rank key of the slice's tokens in
    /// `params.order`, or with `inputs.ids` the key of that token (0 when the slice does not
    /// hold it).
    fn shard_key(
        &self,
        inputs: &ShardKeyInputs<'_>,
        keys: &mut Buffer,
        params: &ShardKeyParams,
    ) -> Result<()> {
        let call = ops::shard_key::validate(self.desc(), inputs, keys, params)?;
        front(self, AnyCall::ShardKey(call))
    }

    /// Sharded rows (§5.14): per row, the slice's first `K` tokens in `params.order` as
    /// `(key, weight)` records, `[rows, K, 2]` u64, `(0, 0)` after them.
    fn shard_records(
        &self,
        inputs: &ShardRows<'_>,
        records: &mut Buffer,
        params: &ShardRecordsParams,
    ) -> Result<()> {
        let call = ops::shard_records::validate(self.desc(), inputs, records, params)?;
        front(self, AnyCall::ShardRecords(call))
    }

    /// Sharded rows (§5.15): per row, the count and mass of the slice's surviving tokens per
    /// value of the next 8 key bits within the row's prefix.
    fn shard_histogram(
        &self,
        inputs: &ShardHistogramInputs<'_>,
        out: &mut ShardHistogramOutputs<'_>,
        params: &ShardHistogramParams,
    ) -> Result<()> {
        let call = ops::shard_histogram::validate(self.desc(), inputs, out, params)?;
        front(self, AnyCall::ShardHistogram(call))
    }

    /// Sharded rows (§5.16): per row, the slice's kept (or residual) mass and count, and the
    /// token where a walk in ascending id order from the row's offset ends.
    fn shard_walk(
        &self,
        inputs: &ShardWalkInputs<'_>,
        out: &mut ShardWalkOutputs<'_>,
        params: &ShardWalkParams,
    ) -> Result<()> {
        let call = ops::shard_walk::validate(self.desc(), inputs, out, params)?;
        front(self, AnyCall::ShardWalk(call))
    }

    /// Sharded rows (§5.17): per row, the slice's `Σ exp((l − m) / T)` under the whole row's
    /// maximum `m` (float).
    fn shard_exp_sum(
        &self,
        inputs: &ShardExpSumInputs<'_>,
        sums: &mut Buffer,
        params: &ShardExpSumParams,
    ) -> Result<()> {
        let call = ops::shard_exp_sum::validate(self.desc(), inputs, sums, params)?;
        front(self, AnyCall::ShardExpSum(call))
    }
}

/// Runs a validated call: the span, the zero-row rule, then the backend (or, for a gated entry
/// of the op table on a device without its capability, the entry's fallback).
fn front<'c, 'o: 'c, B: Backend + ?Sized>(backend: &B, call: AnyCall<'c, 'o>) -> Result<()> {
    let (rows, width) = call.extent();
    let _span = debug_span!(
        "specula_op",
        op = call.name(),
        backend = backend.desc().info.kind.name(),
        rows,
        width
    )
    .entered();
    if call.launches_nothing() {
        return Ok(());
    }
    fallback::run(backend, call)
}

/// The one implementation: every [`Backend`] is a [`Device`], with the front above.
impl<B: Backend + ?Sized> Device for B {}

/// `bytes` fit at element `offset` of `dst`'s window: `dst` belongs to the device and the bytes
/// are whole elements of its dtype ending inside the window (`None`: exactly the whole window).
fn check_write(
    desc: &crate::call::DeviceDesc,
    dst: &Buffer,
    offset: Option<usize>,
    bytes: &[u8],
) -> Result<()> {
    let supplied = whole_elements(dst.dtype(), bytes)?;
    Check::new(Op::Memory, desc).exact("dst", dst, dst.dtype(), dst.len())?;
    let room = dst.len().saturating_sub(offset.unwrap_or(0));
    let fits = match offset {
        None => supplied == dst.len(),
        Some(offset) => offset <= dst.len() && supplied <= room,
    };
    if !fits {
        let expected = room;
        return Err(Error::ShapeMismatch {
            op: Op::Memory,
            arg: "bytes",
            expected,
            actual: supplied,
        });
    }
    Ok(())
}

/// The element count of `bytes` as `dtype` elements, or an error when they are not whole.
fn whole_elements(dtype: DType, bytes: &[u8]) -> Result<usize> {
    let size = dtype.size_bytes();
    if !bytes.len().is_multiple_of(size) {
        return Err(Error::invalid(
            Op::Memory,
            "bytes",
            format!("a multiple of {size} ({dtype})"),
            bytes.len(),
        ));
    }
    Ok(bytes.len() / size)
}

/// Typed helpers over any [`Device`]; kept out of the trait so it stays object-safe.
pub trait DeviceExt: Device {
    /// Uploads a typed slice.
    fn upload<T: Element>(&self, data: &[T]) -> Result<Buffer> {
        self.upload_bytes(T::DTYPE, bytemuck::cast_slice(data))
    }

    /// A host slice as an input buffer of this device, borrowed for the life of the returned
    /// [`BorrowedInput`], which dereferences to `&Buffer` (an input of any op or of
    /// `Decoder::finish`, never an output).
    ///
    /// On a host-memory device ([`Backend::host_memory`]: the CPU backend, the reference device)
    /// the buffer is the slice itself: no copy, and [`BorrowedInput::is_lent`] is `true`. On any other
    /// device (wgpu, xpu-sim, CUDA) the slice is uploaded, exactly as [`DeviceExt::upload`] does,
    /// and the copy is freed when the `BorrowedInput` drops. Either way the buffer carries `T`'s dtype,
    /// the slice's length and this device's id, and ops validate it like any other buffer.
    fn borrow_host<'a, T: Element>(&self, data: &'a [T]) -> Result<BorrowedInput<'a>> {
        let alloc = Alloc::checked(self.desc(), T::DTYPE, data.len())?;
        if self.host_memory() {
            Ok(host::lend(self.desc(), alloc, data))
        } else {
            Ok(BorrowedInput::new(self.upload(data)?, false))
        }
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
