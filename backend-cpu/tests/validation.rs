//! Host-side validation of every op (contract §5): each bad-input class gives the exact typed
//! error, naming the op and the argument.
//!
//! Every op has a small case builder that owns valid buffers for one fixed batch; a test breaks
//! exactly one thing and checks the error. `baseline_arguments_pass_validation` proves that the
//! unbroken cases pass the shared `validate_*` functions, and the `valid_arguments_are_accepted`
//! module runs each unbroken case through the op itself.

use std::fmt::Debug;

use specula_backend_api::DType::{BF16, F16, F32, I32, U32, U64};
use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, DType, Device, DeviceExt, Element, Error, Op, Result};
use specula_backend_cpu::CpuDevice;

// ---------------------------------------------------------------------------------------------
// The batch every case uses.
//
// slot 0: decode, 3 tokens (last accepted + 2 drafts) -> 3 output rows
// slot 1: prefill, 5 prompt tokens                     -> 1 output row
// slot 2: empty                                        -> 0 rows
// slot 3: beyond real_bsz                              -> nothing
// ---------------------------------------------------------------------------------------------

const MAX_BSZ: usize = 4;
const REAL_BSZ: usize = 3;
const S: usize = 3;
const V: usize = 8;
const H: usize = 2;
const C: usize = 4;
const K: usize = 2;
const MAX_MODEL_LEN: usize = 16;
const THIS_TIME: [i32; MAX_BSZ] = [3, 5, 0, 0];
const ENCODER: [i32; MAX_BSZ] = [0, 5, 0, 0];
/// Packed input tokens: 3 + 5.
const TOKEN_NUM: usize = 8;
/// Output rows: 3 + 1.
const T_OUT: usize = 4;
/// Output-row capacity: `real_bsz · S`.
const CAP: usize = REAL_BSZ * S;
const CU_SEQLENS_Q: [i32; REAL_BSZ + 1] = [0, 3, 8, 8];
const CU_SEQLENS_Q_OUTPUT: [i32; REAL_BSZ + 1] = [0, 3, 4, 4];
const BATCH_ID: [i32; CAP] = [0, 0, 0, 1, -1, -1, -1, -1, -1];
const END_TOKENS: [i32; 2] = [7, 6];

fn dims() -> BatchDims {
    BatchDims {
        max_bsz: MAX_BSZ,
        real_bsz: REAL_BSZ,
        max_step_tokens: S,
    }
}

fn device() -> CpuDevice {
    CpuDevice::with_threads(1).expect("the CPU device always opens")
}

fn up<T: Element>(dev: &CpuDevice, data: &[T]) -> Buffer {
    dev.upload(data).expect("upload")
}

fn zeros<T: Element>(dev: &CpuDevice, len: usize) -> Buffer {
    dev.alloc::<T>(len).expect("alloc")
}

/// `rows` probability rows of width `vocab`, each a rotation of one distribution.
fn prob_rows(rows: usize, vocab: usize) -> Vec<f32> {
    const BASE: [f32; 8] = [0.05, 0.10, 0.30, 0.20, 0.15, 0.10, 0.05, 0.05];
    (0..rows * vocab)
        .map(|i| BASE[(i % vocab + i / vocab) % BASE.len()] / (vocab as f32 / 8.0))
        .collect()
}

fn logit_rows(rows: usize, vocab: usize) -> Vec<f32> {
    prob_rows(rows, vocab).iter().map(|p| p.ln()).collect()
}

// ---------------------------------------------------------------------------------------------
// Error assertions: the variant, its `op` and `arg`, and a Display message naming both.
// ---------------------------------------------------------------------------------------------

#[track_caller]
fn error_of<T: Debug>(result: Result<T>, op: Op, arg: &str) -> Error {
    let err = match result {
        Ok(value) => panic!("{op}: expected an error for `{arg}`, got Ok({value:?})"),
        Err(err) => err,
    };
    let message = err.to_string();
    assert!(
        message.contains(op.name()),
        "message `{message}` does not name op {op}"
    );
    assert!(
        message.contains(arg),
        "message `{message}` does not name argument `{arg}`"
    );
    err
}

/// Asserts `InvalidArgument { op, arg }`; returns `(expected, actual)`.
#[track_caller]
fn assert_invalid<T: Debug>(result: Result<T>, op: Op, arg: &str) -> (String, String) {
    match error_of(result, op, arg) {
        Error::InvalidArgument {
            op: o,
            arg: a,
            expected,
            actual,
        } if o == op && a == arg => (expected, actual),
        other => panic!("expected InvalidArgument {{ op: {op}, arg: {arg} }}, got {other:?}"),
    }
}

/// Asserts `ShapeMismatch { op, arg, expected, actual }`.
#[track_caller]
fn assert_shape<T: Debug>(result: Result<T>, op: Op, arg: &str, expected: usize, actual: usize) {
    match error_of(result, op, arg) {
        Error::ShapeMismatch {
            op: o,
            arg: a,
            expected: e,
            actual: x,
        } if o == op && a == arg => {
            assert_eq!((e, x), (expected, actual), "{op} {arg}: (expected, actual)");
        }
        other => panic!("expected ShapeMismatch {{ op: {op}, arg: {arg} }}, got {other:?}"),
    }
}

/// Asserts `DTypeMismatch { op, arg, expected, actual }`.
#[track_caller]
fn assert_dtype<T: Debug>(result: Result<T>, op: Op, arg: &str, expected: &str, actual: DType) {
    match error_of(result, op, arg) {
        Error::DTypeMismatch {
            op: o,
            arg: a,
            expected: e,
            actual: x,
        } if o == op && a == arg => {
            assert_eq!(
                (e.as_str(), x),
                (expected, actual),
                "{op} {arg}: (expected, actual)"
            );
        }
        other => panic!("expected DTypeMismatch {{ op: {op}, arg: {arg} }}, got {other:?}"),
    }
}

/// Asserts `DeviceMismatch { op, arg }` between the op's device and the buffer's.
#[track_caller]
fn assert_device<T: Debug>(
    result: Result<T>,
    op: Op,
    arg: &str,
    dev: &CpuDevice,
    other: &CpuDevice,
) {
    match error_of(result, op, arg) {
        Error::DeviceMismatch {
            op: o,
            arg: a,
            expected,
            actual,
        } if o == op && a == arg => {
            assert_eq!((expected, actual), (dev.id().0, other.id().0));
        }
        other => panic!("expected DeviceMismatch {{ op: {op}, arg: {arg} }}, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared pieces of the batch ops.
// ---------------------------------------------------------------------------------------------

/// `seq_lens_this_time` and `seq_lens_encoder` on the device.
struct Lens {
    this_time: Buffer,
    encoder: Buffer,
}

impl Lens {
    fn new(dev: &CpuDevice) -> Self {
        Lens {
            this_time: up(dev, &THIS_TIME),
            encoder: up(dev, &ENCODER),
        }
    }

    fn get(&self) -> SlotLens<'_> {
        SlotLens {
            seq_lens_this_time: &self.this_time,
            seq_lens_encoder: &self.encoder,
        }
    }
}

/// Host copies of the slot lengths (given by default).
struct Host {
    this_time: Vec<i32>,
    encoder: Vec<i32>,
    given: bool,
}

impl Host {
    fn new() -> Self {
        Host {
            this_time: THIS_TIME.to_vec(),
            encoder: ENCODER.to_vec(),
            given: true,
        }
    }

    fn get(&self) -> Option<HostSlotLens<'_>> {
        self.given.then_some(HostSlotLens {
            seq_lens_this_time: &self.this_time,
            seq_lens_encoder: &self.encoder,
        })
    }
}

/// The output layout `build_output_layout` would write for the batch.
struct Layout {
    cu_seqlens_q_output: Buffer,
    batch_id: Buffer,
}

impl Layout {
    fn new(dev: &CpuDevice) -> Self {
        Layout {
            cu_seqlens_q_output: up(dev, &CU_SEQLENS_Q_OUTPUT),
            batch_id: up(dev, &BATCH_ID),
        }
    }

    fn get(&self) -> OutputLayout<'_> {
        OutputLayout {
            cu_seqlens_q_output: &self.cu_seqlens_q_output,
            batch_id_per_token_output: &self.batch_id,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Case builders, one per op. `with_args` assembles the op's argument structs from the owned
// buffers; `run` calls the op, `validate` only the shared validation.
// ---------------------------------------------------------------------------------------------

struct LayoutCase {
    lens: Lens,
    seq_lens_output: Buffer,
    cu_seqlens_q: Buffer,
    cu_seqlens_q_output: Buffer,
    batch_id: Buffer,
    dims: BatchDims,
    host: Host,
}

impl LayoutCase {
    fn new(dev: &CpuDevice) -> Self {
        LayoutCase {
            lens: Lens::new(dev),
            seq_lens_output: zeros::<i32>(dev, MAX_BSZ),
            cu_seqlens_q: zeros::<i32>(dev, REAL_BSZ + 1),
            cu_seqlens_q_output: zeros::<i32>(dev, REAL_BSZ + 1),
            batch_id: zeros::<i32>(dev, CAP),
            dims: dims(),
            host: Host::new(),
        }
    }

    fn with_args<R>(
        &mut self,
        f: impl FnOnce(&SlotLens<'_>, &mut LayoutOutputs<'_>, &LayoutParams<'_>) -> R,
    ) -> R {
        let mut out = LayoutOutputs {
            seq_lens_output: &mut self.seq_lens_output,
            cu_seqlens_q: &mut self.cu_seqlens_q,
            cu_seqlens_q_output: &mut self.cu_seqlens_q_output,
            batch_id_per_token_output: &mut self.batch_id,
        };
        let params = LayoutParams {
            dims: self.dims,
            host: self.host.get(),
        };
        f(&self.lens.get(), &mut out, &params)
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|l, o, p| dev.build_output_layout(l, o, p))
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|l, o, p| validate_build_output_layout(dev.id(), l, o, p).map(drop))
    }
}

struct GatherCase {
    hidden_states: Buffer,
    cu_seqlens_q: Buffer,
    lens: Lens,
    layout: Layout,
    out: Buffer,
    dims: BatchDims,
    token_num: usize,
    hidden: usize,
    is_speculative: bool,
    host: Host,
}

impl GatherCase {
    fn new(dev: &CpuDevice) -> Self {
        let hidden: Vec<f32> = (0..TOKEN_NUM * H).map(|i| i as f32).collect();
        GatherCase {
            hidden_states: up(dev, &hidden),
            cu_seqlens_q: up(dev, &CU_SEQLENS_Q),
            lens: Lens::new(dev),
            layout: Layout::new(dev),
            out: zeros::<f32>(dev, CAP * H),
            dims: dims(),
            token_num: TOKEN_NUM,
            hidden: H,
            is_speculative: true,
            host: Host::new(),
        }
    }

    fn non_speculative(dev: &CpuDevice) -> Self {
        let mut case = GatherCase::new(dev);
        case.is_speculative = false;
        case.out = zeros::<f32>(dev, MAX_BSZ * H);
        case
    }

    fn with_args<R>(
        &mut self,
        f: impl FnOnce(&GatherInputs<'_>, &mut Buffer, &GatherParams<'_>) -> R,
    ) -> R {
        let inputs = GatherInputs {
            hidden_states: &self.hidden_states,
            cu_seqlens_q: &self.cu_seqlens_q,
            lens: self.lens.get(),
            layout: self.layout.get(),
        };
        let params = GatherParams {
            dims: self.dims,
            token_num: self.token_num,
            hidden: self.hidden,
            is_speculative: self.is_speculative,
            host: self.host.get(),
        };
        f(&inputs, &mut self.out, &params)
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| dev.gather_next_token(i, o, p))
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| validate_gather_next_token(dev.id(), i, o, p).map(drop))
    }
}

struct SamplingParamsCase {
    top_p: Buffer,
    top_k: Buffer,
    temperature: Buffer,
    infer_seed: Buffer,
    lens: Lens,
    layout: Layout,
    out_top_p: Buffer,
    out_top_k: Buffer,
    out_temperature: Buffer,
    out_seed: Buffer,
    dims: BatchDims,
    host: Host,
    host_top_p: Option<Vec<f32>>,
    host_temperature: Option<Vec<f32>>,
}

impl SamplingParamsCase {
    fn new(dev: &CpuDevice) -> Self {
        let top_p = [0.9f32, 0.8, 0.7, 1.0];
        let temperature = [1.0f32, 0.7, 0.0, 1.0];
        SamplingParamsCase {
            top_p: up(dev, &top_p),
            top_k: up(dev, &[0i32, 2, 3, 4]),
            temperature: up(dev, &temperature),
            infer_seed: up(dev, &[100u64, 200, 300, 400]),
            lens: Lens::new(dev),
            layout: Layout::new(dev),
            out_top_p: zeros::<f32>(dev, CAP),
            out_top_k: zeros::<i32>(dev, CAP),
            out_temperature: zeros::<f32>(dev, CAP),
            out_seed: zeros::<u64>(dev, CAP),
            dims: dims(),
            host: Host::new(),
            host_top_p: Some(top_p.to_vec()),
            host_temperature: Some(temperature.to_vec()),
        }
    }

    fn with_args<R>(
        &mut self,
        f: impl FnOnce(
            &SamplingParamsInputs<'_>,
            &mut RowSamplingParams<'_>,
            &SamplingParamsParams<'_>,
        ) -> R,
    ) -> R {
        let inputs = SamplingParamsInputs {
            slots: SlotSamplingParams {
                top_p: &self.top_p,
                top_k: &self.top_k,
                temperature: &self.temperature,
                infer_seed: &self.infer_seed,
            },
            lens: self.lens.get(),
            layout: self.layout.get(),
        };
        let mut out = RowSamplingParams {
            top_p: &mut self.out_top_p,
            top_k: &mut self.out_top_k,
            temperature: &mut self.out_temperature,
            seed: &mut self.out_seed,
        };
        let params = SamplingParamsParams {
            dims: self.dims,
            host: self.host.get(),
            host_top_p: self.host_top_p.as_deref(),
            host_temperature: self.host_temperature.as_deref(),
        };
        f(&inputs, &mut out, &params)
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| dev.build_sampling_params(i, o, p))
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| validate_build_sampling_params(dev.id(), i, o, p).map(drop))
    }
}

struct ArgmaxCase {
    input: Buffer,
    out: Buffer,
    shape: RowShape,
}

impl ArgmaxCase {
    fn new(dev: &CpuDevice) -> Self {
        ArgmaxCase {
            input: up(dev, &logit_rows(T_OUT, V)),
            out: zeros::<i32>(dev, T_OUT),
            shape: RowShape {
                rows: T_OUT,
                vocab: V,
            },
        }
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        dev.argmax(&self.input, &mut self.out, &self.shape)
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        validate_argmax(dev.id(), &self.input, &self.out, &self.shape).map(drop)
    }
}

struct SoftmaxCase {
    logits: Buffer,
    temperature: Buffer,
    probs: Buffer,
    shape: RowShape,
    host_temperature: Option<Vec<f32>>,
}

impl SoftmaxCase {
    fn new(dev: &CpuDevice) -> Self {
        let temperature = [1.0f32, 0.5, 0.0, 2.0];
        SoftmaxCase {
            logits: up(dev, &logit_rows(T_OUT, V)),
            temperature: up(dev, &temperature),
            probs: zeros::<f32>(dev, T_OUT * V),
            shape: RowShape {
                rows: T_OUT,
                vocab: V,
            },
            host_temperature: Some(temperature.to_vec()),
        }
    }

    fn params(&self) -> SoftmaxParams<'_> {
        SoftmaxParams {
            shape: self.shape,
            host_temperature: self.host_temperature.as_deref(),
        }
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        let params = SoftmaxParams {
            shape: self.shape,
            host_temperature: self.host_temperature.as_deref(),
        };
        dev.softmax(&self.logits, &self.temperature, &mut self.probs, &params)
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        validate_softmax(
            dev.id(),
            &self.logits,
            &self.temperature,
            &self.probs,
            &self.params(),
        )
        .map(drop)
    }
}

struct SampleCase {
    probs: Buffer,
    top_k: Buffer,
    top_p: Buffer,
    seed: Buffer,
    tokens: Buffer,
    shape: RowShape,
    host_top_p: Option<Vec<f32>>,
}

impl SampleCase {
    fn new(dev: &CpuDevice) -> Self {
        let top_p = [0.9f32, 1.0, 0.5, 0.99];
        SampleCase {
            probs: up(dev, &prob_rows(T_OUT, V)),
            top_k: up(dev, &[0i32, 3, 1, 8]),
            top_p: up(dev, &top_p),
            seed: up(dev, &[100u64, 104, 108, 200]),
            tokens: zeros::<i32>(dev, T_OUT),
            shape: RowShape {
                rows: T_OUT,
                vocab: V,
            },
            host_top_p: Some(top_p.to_vec()),
        }
    }

    fn with_args<R>(
        &mut self,
        f: impl FnOnce(&SampleInputs<'_>, &mut Buffer, &SampleParams<'_>) -> R,
    ) -> R {
        let inputs = SampleInputs {
            probs: &self.probs,
            top_k: &self.top_k,
            top_p: &self.top_p,
            seed: &self.seed,
        };
        let params = SampleParams {
            shape: self.shape,
            host_top_p: self.host_top_p.as_deref(),
        };
        f(&inputs, &mut self.tokens, &params)
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| dev.top_k_top_p_sample(i, o, p))
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| validate_top_k_top_p_sample(dev.id(), i, o, p).map(drop))
    }
}

/// `top_p_candidates` over the padded capacity (`CAP` rows, padding marked by `batch_id`).
struct CandidatesCase {
    probs: Buffer,
    top_p: Buffer,
    batch_id: Option<Buffer>,
    ids: Buffer,
    scores: Buffer,
    lens: Buffer,
    shape: RowShape,
    candidates: usize,
    host_top_p: Option<Vec<f32>>,
}

impl CandidatesCase {
    fn new(dev: &CpuDevice) -> Self {
        let top_p = [0.9f32, 0.9, 0.9, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0];
        CandidatesCase {
            probs: up(dev, &prob_rows(CAP, V)),
            top_p: up(dev, &top_p),
            batch_id: Some(up(dev, &BATCH_ID)),
            ids: zeros::<i32>(dev, CAP * C),
            scores: zeros::<f32>(dev, CAP * C),
            lens: zeros::<i32>(dev, CAP),
            shape: RowShape {
                rows: CAP,
                vocab: V,
            },
            candidates: C,
            host_top_p: Some(top_p.to_vec()),
        }
    }

    /// Resizes the outputs for `candidates` per row.
    fn with_candidates(mut self, dev: &CpuDevice, candidates: usize) -> Self {
        self.candidates = candidates;
        self.ids = zeros::<i32>(dev, CAP * candidates);
        self.scores = zeros::<f32>(dev, CAP * candidates);
        self
    }

    fn with_args<R>(
        &mut self,
        f: impl FnOnce(&CandidatesInputs<'_>, &mut CandidatesOutputs<'_>, &CandidatesParams<'_>) -> R,
    ) -> R {
        let inputs = CandidatesInputs {
            probs: &self.probs,
            top_p: &self.top_p,
            batch_id_per_token_output: self.batch_id.as_ref(),
        };
        let mut out = CandidatesOutputs {
            ids: &mut self.ids,
            scores: &mut self.scores,
            lens: &mut self.lens,
        };
        let params = CandidatesParams {
            shape: self.shape,
            candidates: self.candidates,
            host_top_p: self.host_top_p.as_deref(),
        };
        f(&inputs, &mut out, &params)
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| dev.top_p_candidates(i, o, p))
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| validate_top_p_candidates(dev.id(), i, o, p).map(drop))
    }
}

/// The owned buffers of one verification strategy.
enum StrategyBufs {
    Greedy {
        target_tokens: Buffer,
    },
    TargetMatch {
        target_tokens: Buffer,
    },
    TopP {
        ids: Buffer,
        scores: Buffer,
        lens: Buffer,
        candidates: usize,
    },
    Rejection {
        target_probs: Buffer,
        draft_probs: Buffer,
        top_k: Buffer,
        top_p: Buffer,
    },
}

impl StrategyBufs {
    fn new(dev: &CpuDevice, strategy: Strategy, rows: usize) -> Self {
        match strategy {
            Strategy::Greedy => StrategyBufs::Greedy {
                target_tokens: up(dev, &target_tokens(rows)),
            },
            Strategy::TargetMatch => StrategyBufs::TargetMatch {
                target_tokens: up(dev, &target_tokens(rows)),
            },
            Strategy::TopP => StrategyBufs::top_p(dev, rows, C),
            Strategy::Rejection => StrategyBufs::rejection(dev, rows, MAX_BSZ * (S - 1), V),
        }
    }

    /// TOPP candidates: `rows × candidates`, lens `rows`.
    fn top_p(dev: &CpuDevice, rows: usize, candidates: usize) -> Self {
        let ids: Vec<i32> = (0..rows * candidates)
            .map(|i| ((i % candidates + i / candidates) % V) as i32)
            .collect();
        let scores: Vec<f32> = (0..rows * candidates)
            .map(|i| 0.4 / (1 + i % candidates) as f32)
            .collect();
        StrategyBufs::TopP {
            ids: up(dev, &ids),
            scores: up(dev, &scores),
            lens: up(dev, &vec![2i32.min(candidates as i32); rows]),
            candidates,
        }
    }

    /// REJECTION: target `rows × V`, draft `draft_rows × draft_vocab`.
    fn rejection(dev: &CpuDevice, rows: usize, draft_rows: usize, draft_vocab: usize) -> Self {
        StrategyBufs::Rejection {
            target_probs: up(dev, &prob_rows(rows, V)),
            draft_probs: up(dev, &prob_rows(draft_rows, draft_vocab)),
            top_k: up(dev, &vec![0i32; rows]),
            top_p: up(dev, &vec![1.0f32; rows]),
        }
    }

    fn inputs(&self) -> StrategyInputs<'_> {
        match self {
            StrategyBufs::Greedy { target_tokens } => StrategyInputs::Greedy { target_tokens },
            StrategyBufs::TargetMatch { target_tokens } => {
                StrategyInputs::TargetMatch { target_tokens }
            }
            StrategyBufs::TopP {
                ids,
                scores,
                lens,
                candidates,
            } => StrategyInputs::TopP {
                candidate_ids: ids,
                candidate_scores: scores,
                candidate_lens: lens,
                candidates: *candidates,
            },
            StrategyBufs::Rejection {
                target_probs,
                draft_probs,
                top_k,
                top_p,
            } => StrategyInputs::Rejection {
                target_probs,
                draft_probs,
                top_k,
                top_p,
            },
        }
    }
}

fn target_tokens(rows: usize) -> Vec<i32> {
    (0..rows).map(|r| [2, 3, 1, 4][r % 4]).collect()
}

struct VerifyCase {
    draft_tokens: Buffer,
    lens: Lens,
    cu_seqlens_q_output: Buffer,
    stop_flags: Buffer,
    is_block_step: Buffer,
    reasoning_status: Buffer,
    step_idx: Buffer,
    max_dec_len: Buffer,
    end_tokens: Buffer,
    seeds: Buffer,
    strategy: StrategyBufs,
    accept_tokens: Buffer,
    accept_num: Buffer,
    dims: BatchDims,
    rows: usize,
    vocab: usize,
    host: Host,
}

impl VerifyCase {
    fn new(dev: &CpuDevice, strategy: Strategy) -> Self {
        VerifyCase {
            draft_tokens: up(dev, &[5i32, 2, 3, 7, 0, 0, 0, 0, 0, 0, 0, 0]),
            lens: Lens::new(dev),
            cu_seqlens_q_output: up(dev, &CU_SEQLENS_Q_OUTPUT),
            stop_flags: zeros::<u8>(dev, MAX_BSZ),
            is_block_step: zeros::<u8>(dev, MAX_BSZ),
            reasoning_status: zeros::<i32>(dev, MAX_BSZ),
            step_idx: up(dev, &[4i32, 0, 0, 0]),
            max_dec_len: up(dev, &[100i32; MAX_BSZ]),
            end_tokens: up(dev, &END_TOKENS),
            seeds: up(dev, &[100u64, 104, 108, 200]),
            strategy: StrategyBufs::new(dev, strategy, T_OUT),
            accept_tokens: zeros::<i32>(dev, MAX_BSZ * S),
            accept_num: zeros::<i32>(dev, MAX_BSZ),
            dims: dims(),
            rows: T_OUT,
            vocab: V,
            host: Host::new(),
        }
    }

    fn with_args<R>(
        &mut self,
        f: impl FnOnce(&VerifyInputs<'_>, &mut VerifyOutputs<'_>, &VerifyParams<'_>) -> R,
    ) -> R {
        let inputs = VerifyInputs {
            draft_tokens: &self.draft_tokens,
            lens: self.lens.get(),
            cu_seqlens_q_output: &self.cu_seqlens_q_output,
            state: VerifySlotState {
                stop_flags: &self.stop_flags,
                is_block_step: &self.is_block_step,
                reasoning_status: &self.reasoning_status,
                step_idx: &self.step_idx,
                max_dec_len: &self.max_dec_len,
                end_tokens: &self.end_tokens,
            },
            seeds: &self.seeds,
            strategy: self.strategy.inputs(),
        };
        let mut out = VerifyOutputs {
            accept_tokens: &mut self.accept_tokens,
            accept_num: &mut self.accept_num,
        };
        let params = VerifyParams {
            dims: self.dims,
            rows: self.rows,
            vocab: self.vocab,
            accept_all: false,
            reject_all: false,
            host: self.host.get(),
        };
        f(&inputs, &mut out, &params)
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| dev.verify_draft_tokens(i, o, p))
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| validate_verify_draft_tokens(dev.id(), i, o, p).map(drop))
    }
}

struct UpdateCase {
    accept_tokens: Buffer,
    is_block_step: Buffer,
    prompt_lens: Buffer,
    max_dec_len: Buffer,
    end_tokens: Buffer,
    accept_num: Buffer,
    stop_flags: Buffer,
    token_ids_all: Buffer,
    step_idx: Buffer,
    infer_seed: Buffer,
    draft_tokens: Buffer,
    seq_lens_encoder: Buffer,
    seq_lens_decoder: Buffer,
    dims: BatchDims,
    max_model_len: usize,
}

impl UpdateCase {
    fn new(dev: &CpuDevice) -> Self {
        let mut token_ids_all = vec![-1i32; MAX_BSZ * MAX_MODEL_LEN];
        token_ids_all[..8].copy_from_slice(&[1, 2, 3, 4, 1, 2, 3, 4]);
        token_ids_all[MAX_MODEL_LEN..MAX_MODEL_LEN + 5].copy_from_slice(&[5, 4, 3, 2, 1]);
        UpdateCase {
            accept_tokens: up(dev, &[2i32, 3, -1, 4, -1, -1, -1, -1, -1, -1, -1, -1]),
            is_block_step: zeros::<u8>(dev, MAX_BSZ),
            prompt_lens: up(dev, &[4i32, 5, 0, 0]),
            max_dec_len: up(dev, &[100i32; MAX_BSZ]),
            end_tokens: up(dev, &END_TOKENS),
            accept_num: up(dev, &[2i32, 1, 0, 0]),
            stop_flags: zeros::<u8>(dev, MAX_BSZ),
            token_ids_all: up(dev, &token_ids_all),
            step_idx: up(dev, &[4i32, 0, 0, 0]),
            infer_seed: up(dev, &[100u64, 200, 300, 400]),
            draft_tokens: up(dev, &[5i32, 2, 3, 7, 0, 0, 0, 0, 0, 0, 0, 0]),
            seq_lens_encoder: up(dev, &ENCODER),
            seq_lens_decoder: up(dev, &[8i32, 0, 0, 0]),
            dims: dims(),
            max_model_len: MAX_MODEL_LEN,
        }
    }

    fn with_args<R>(
        &mut self,
        f: impl FnOnce(&UpdateStateInputs<'_>, &mut DecodeState<'_>, &UpdateStateParams) -> R,
    ) -> R {
        let inputs = UpdateStateInputs {
            accept_tokens: &self.accept_tokens,
            is_block_step: &self.is_block_step,
            prompt_lens: &self.prompt_lens,
            max_dec_len: &self.max_dec_len,
            end_tokens: &self.end_tokens,
        };
        let mut state = DecodeState {
            accept_num: &mut self.accept_num,
            stop_flags: &mut self.stop_flags,
            token_ids_all: &mut self.token_ids_all,
            step_idx: &mut self.step_idx,
            infer_seed: &mut self.infer_seed,
            draft_tokens: &mut self.draft_tokens,
            seq_lens_encoder: &mut self.seq_lens_encoder,
            seq_lens_decoder: &mut self.seq_lens_decoder,
        };
        let params = UpdateStateParams {
            dims: self.dims,
            max_model_len: self.max_model_len,
        };
        f(&inputs, &mut state, &params)
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, s, p| dev.update_state(i, s, p))
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, s, p| validate_update_state(dev.id(), i, s, p))
    }
}

struct NgramCase {
    token_ids_all: Buffer,
    prompt_lens: Buffer,
    step_idx: Buffer,
    draft_token_num: Buffer,
    seq_lens_encoder: Buffer,
    max_dec_len: Buffer,
    draft_tokens: Buffer,
    seq_lens_this_time: Buffer,
    params: NgramParams,
}

impl NgramCase {
    fn new(dev: &CpuDevice) -> Self {
        // Slot 0: the golden case of the contract (prompt [10..60], generated [10, 20, 30, 40]).
        let mut token_ids_all = vec![-1i32; MAX_BSZ * MAX_MODEL_LEN];
        token_ids_all[..10].copy_from_slice(&[10, 20, 30, 40, 50, 60, 10, 20, 30, 40]);
        NgramCase {
            token_ids_all: up(dev, &token_ids_all),
            prompt_lens: up(dev, &[6i32, 5, 0, 0]),
            step_idx: up(dev, &[4i32, 0, 0, 0]),
            draft_token_num: up(dev, &[2i32; MAX_BSZ]),
            seq_lens_encoder: up(dev, &ENCODER),
            max_dec_len: up(dev, &[10i32; MAX_BSZ]),
            draft_tokens: up(dev, &[40i32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            seq_lens_this_time: up(dev, &[1i32, 5, 0, 0]),
            params: NgramParams {
                dims: dims(),
                max_model_len: MAX_MODEL_LEN,
                max_ngram_size: 3,
                min_ngram_size: 1,
                threshold: 128,
            },
        }
    }

    fn with_args<R>(
        &mut self,
        f: impl FnOnce(&NgramInputs<'_>, &mut NgramOutputs<'_>, &NgramParams) -> R,
    ) -> R {
        let inputs = NgramInputs {
            token_ids_all: &self.token_ids_all,
            prompt_lens: &self.prompt_lens,
            step_idx: &self.step_idx,
            draft_token_num: &self.draft_token_num,
            seq_lens_encoder: &self.seq_lens_encoder,
            max_dec_len: &self.max_dec_len,
        };
        let mut out = NgramOutputs {
            draft_tokens: &mut self.draft_tokens,
            seq_lens_this_time: &mut self.seq_lens_this_time,
        };
        f(&inputs, &mut out, &self.params)
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| dev.ngram_match(i, o, p))
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| validate_ngram_match(dev.id(), i, o, p))
    }
}

struct LogprobsCase {
    logits: Buffer,
    temperature: Buffer,
    accept_tokens: Buffer,
    accept_num: Buffer,
    seq_lens_encoder: Buffer,
    cu_seqlens_q_output: Buffer,
    cu_accept: Buffer,
    token_ids: Buffer,
    logprobs: Buffer,
    ranks: Buffer,
    top_ids: Buffer,
    top_logprobs: Buffer,
    dims: BatchDims,
    shape: RowShape,
    top_k: usize,
    host_temperature: Option<Vec<f32>>,
}

impl LogprobsCase {
    fn new(dev: &CpuDevice) -> Self {
        let temperature = [1.0f32, 1.0, 0.5, 0.0];
        LogprobsCase {
            logits: up(dev, &logit_rows(T_OUT, V)),
            temperature: up(dev, &temperature),
            accept_tokens: up(dev, &[2i32, 3, -1, 4, -1, -1, -1, -1, -1, -1, -1, -1]),
            accept_num: up(dev, &[2i32, 1, 0, 0]),
            seq_lens_encoder: up(dev, &ENCODER),
            cu_seqlens_q_output: up(dev, &CU_SEQLENS_Q_OUTPUT),
            cu_accept: zeros::<i32>(dev, MAX_BSZ + 1),
            token_ids: zeros::<i32>(dev, MAX_BSZ * S),
            logprobs: zeros::<f32>(dev, MAX_BSZ * S),
            ranks: zeros::<i32>(dev, MAX_BSZ * S),
            top_ids: zeros::<i32>(dev, MAX_BSZ * S * K),
            top_logprobs: zeros::<f32>(dev, MAX_BSZ * S * K),
            dims: dims(),
            shape: RowShape {
                rows: T_OUT,
                vocab: V,
            },
            top_k: K,
            host_temperature: Some(temperature.to_vec()),
        }
    }

    /// Resizes the top-K outputs for `top_k` columns.
    fn with_top_k(mut self, dev: &CpuDevice, top_k: usize) -> Self {
        self.top_k = top_k;
        self.top_ids = zeros::<i32>(dev, MAX_BSZ * S * top_k);
        self.top_logprobs = zeros::<f32>(dev, MAX_BSZ * S * top_k);
        self
    }

    fn with_args<R>(
        &mut self,
        f: impl FnOnce(&LogprobsInputs<'_>, &mut LogprobsOutputs<'_>, &LogprobsParams<'_>) -> R,
    ) -> R {
        let inputs = LogprobsInputs {
            logits: &self.logits,
            temperature: &self.temperature,
            accept_tokens: &self.accept_tokens,
            accept_num: &self.accept_num,
            seq_lens_encoder: &self.seq_lens_encoder,
            cu_seqlens_q_output: &self.cu_seqlens_q_output,
        };
        let mut out = LogprobsOutputs {
            cu_accept: &mut self.cu_accept,
            token_ids: &mut self.token_ids,
            logprobs: &mut self.logprobs,
            ranks: &mut self.ranks,
            top_ids: &mut self.top_ids,
            top_logprobs: &mut self.top_logprobs,
        };
        let params = LogprobsParams {
            dims: self.dims,
            shape: self.shape,
            top_k: self.top_k,
            host_temperature: self.host_temperature.as_deref(),
        };
        f(&inputs, &mut out, &params)
    }

    fn run(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| dev.accept_logprobs(i, o, p))
    }

    fn validate(&mut self, dev: &CpuDevice) -> Result<()> {
        self.with_args(|i, o, p| validate_accept_logprobs(dev.id(), i, o, p).map(drop))
    }
}

// ---------------------------------------------------------------------------------------------
// The baselines are valid.
// ---------------------------------------------------------------------------------------------

#[test]
fn baseline_arguments_pass_validation() {
    let dev = device();
    LayoutCase::new(&dev).validate(&dev).unwrap();
    GatherCase::new(&dev).validate(&dev).unwrap();
    GatherCase::non_speculative(&dev).validate(&dev).unwrap();
    SamplingParamsCase::new(&dev).validate(&dev).unwrap();
    ArgmaxCase::new(&dev).validate(&dev).unwrap();
    SoftmaxCase::new(&dev).validate(&dev).unwrap();
    SampleCase::new(&dev).validate(&dev).unwrap();
    CandidatesCase::new(&dev).validate(&dev).unwrap();
    for strategy in Strategy::ALL {
        VerifyCase::new(&dev, strategy).validate(&dev).unwrap();
    }
    UpdateCase::new(&dev).validate(&dev).unwrap();
    NgramCase::new(&dev).validate(&dev).unwrap();
    LogprobsCase::new(&dev).validate(&dev).unwrap();
}

/// The unbroken cases run through each op. These pass once the op bodies are implemented.
mod valid_arguments_are_accepted {
    use super::*;

    #[test]
    fn build_output_layout() {
        let dev = device();
        LayoutCase::new(&dev).run(&dev).unwrap();
    }

    #[test]
    fn gather_next_token() {
        let dev = device();
        GatherCase::new(&dev).run(&dev).unwrap();
        GatherCase::non_speculative(&dev).run(&dev).unwrap();
    }

    #[test]
    fn build_sampling_params() {
        let dev = device();
        SamplingParamsCase::new(&dev).run(&dev).unwrap();
    }

    #[test]
    fn argmax() {
        let dev = device();
        ArgmaxCase::new(&dev).run(&dev).unwrap();
    }

    #[test]
    fn softmax() {
        let dev = device();
        SoftmaxCase::new(&dev).run(&dev).unwrap();
    }

    #[test]
    fn top_k_top_p_sample() {
        let dev = device();
        SampleCase::new(&dev).run(&dev).unwrap();
    }

    #[test]
    fn top_p_candidates() {
        let dev = device();
        CandidatesCase::new(&dev).run(&dev).unwrap();
    }

    #[test]
    fn verify_draft_tokens() {
        let dev = device();
        for strategy in Strategy::ALL {
            VerifyCase::new(&dev, strategy)
                .run(&dev)
                .unwrap_or_else(|e| panic!("{strategy}: {e}"));
        }
    }

    #[test]
    fn update_state() {
        let dev = device();
        UpdateCase::new(&dev).run(&dev).unwrap();
    }

    #[test]
    fn ngram_match() {
        let dev = device();
        NgramCase::new(&dev).run(&dev).unwrap();
    }

    #[test]
    fn accept_logprobs() {
        let dev = device();
        LogprobsCase::new(&dev).run(&dev).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Wrong dtype.
// ---------------------------------------------------------------------------------------------

#[test]
fn probs_as_i32_is_a_dtype_mismatch() {
    let dev = device();
    let mut case = SampleCase::new(&dev);
    case.probs = zeros::<i32>(&dev, T_OUT * V);
    assert_dtype(
        case.run(&dev),
        Op::TopKTopPSample,
        "probs",
        "f32|f16|bf16",
        I32,
    );

    let mut case = CandidatesCase::new(&dev);
    case.probs = zeros::<i32>(&dev, CAP * V);
    assert_dtype(
        case.run(&dev),
        Op::TopPCandidates,
        "probs",
        "f32|f16|bf16",
        I32,
    );

    let mut case = ArgmaxCase::new(&dev);
    case.input = zeros::<u32>(&dev, T_OUT * V);
    assert_dtype(case.run(&dev), Op::Argmax, "input", "f32|f16|bf16", U32);

    let mut case = SoftmaxCase::new(&dev);
    case.logits = zeros::<u64>(&dev, T_OUT * V);
    assert_dtype(case.run(&dev), Op::Softmax, "logits", "f32|f16|bf16", U64);

    let mut case = LogprobsCase::new(&dev);
    case.logits = zeros::<i32>(&dev, T_OUT * V);
    assert_dtype(
        case.run(&dev),
        Op::AcceptLogprobs,
        "logits",
        "f32|f16|bf16",
        I32,
    );
}

#[test]
fn seeds_as_u32_are_a_dtype_mismatch() {
    let dev = device();
    let mut case = SampleCase::new(&dev);
    case.seed = zeros::<u32>(&dev, T_OUT);
    assert_dtype(case.run(&dev), Op::TopKTopPSample, "seed", "u64", U32);

    let mut case = VerifyCase::new(&dev, Strategy::TargetMatch);
    case.seeds = zeros::<u32>(&dev, T_OUT);
    assert_dtype(case.run(&dev), Op::VerifyDraftTokens, "seeds", "u64", U32);

    let mut case = SamplingParamsCase::new(&dev);
    case.infer_seed = zeros::<i32>(&dev, MAX_BSZ);
    assert_dtype(
        case.run(&dev),
        Op::BuildSamplingParams,
        "infer_seed",
        "u64",
        I32,
    );

    let mut case = SamplingParamsCase::new(&dev);
    case.out_seed = zeros::<u32>(&dev, CAP);
    assert_dtype(
        case.run(&dev),
        Op::BuildSamplingParams,
        "out seed",
        "u64",
        U32,
    );

    let mut case = UpdateCase::new(&dev);
    case.infer_seed = zeros::<u32>(&dev, MAX_BSZ);
    assert_dtype(case.run(&dev), Op::UpdateState, "infer_seed", "u64", U32);
}

#[test]
fn float_where_i32_is_expected_is_a_dtype_mismatch() {
    let dev = device();
    let mut case = LayoutCase::new(&dev);
    case.lens.this_time = zeros::<f32>(&dev, MAX_BSZ);
    assert_dtype(
        case.run(&dev),
        Op::BuildOutputLayout,
        "seq_lens_this_time",
        "i32",
        F32,
    );

    let mut case = GatherCase::new(&dev);
    case.cu_seqlens_q = zeros::<f32>(&dev, REAL_BSZ + 1);
    assert_dtype(
        case.run(&dev),
        Op::GatherNextToken,
        "cu_seqlens_q",
        "i32",
        F32,
    );

    let mut case = ArgmaxCase::new(&dev);
    case.out = zeros::<f32>(&dev, T_OUT);
    assert_dtype(case.run(&dev), Op::Argmax, "out", "i32", F32);

    let mut case = SampleCase::new(&dev);
    case.top_k = zeros::<f32>(&dev, T_OUT);
    assert_dtype(case.run(&dev), Op::TopKTopPSample, "top_k", "i32", F32);

    let mut case = CandidatesCase::new(&dev);
    case.batch_id = Some(zeros::<f32>(&dev, CAP));
    assert_dtype(
        case.run(&dev),
        Op::TopPCandidates,
        "batch_id_per_token_output",
        "i32",
        F32,
    );

    for strategy in [Strategy::Greedy, Strategy::TargetMatch] {
        let mut case = VerifyCase::new(&dev, strategy);
        case.strategy = match strategy {
            Strategy::Greedy => StrategyBufs::Greedy {
                target_tokens: zeros::<f32>(&dev, T_OUT),
            },
            _ => StrategyBufs::TargetMatch {
                target_tokens: zeros::<f32>(&dev, T_OUT),
            },
        };
        assert_dtype(
            case.run(&dev),
            Op::VerifyDraftTokens,
            "target_tokens",
            "i32",
            F32,
        );
    }

    let mut case = VerifyCase::new(&dev, Strategy::TopP);
    if let StrategyBufs::TopP { lens, .. } = &mut case.strategy {
        *lens = zeros::<f32>(&dev, T_OUT);
    }
    assert_dtype(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "candidate_lens",
        "i32",
        F32,
    );

    let mut case = VerifyCase::new(&dev, Strategy::TargetMatch);
    case.draft_tokens = zeros::<f32>(&dev, MAX_BSZ * S);
    assert_dtype(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "draft_tokens",
        "i32",
        F32,
    );

    let mut case = UpdateCase::new(&dev);
    case.accept_tokens = zeros::<f32>(&dev, MAX_BSZ * S);
    assert_dtype(case.run(&dev), Op::UpdateState, "accept_tokens", "i32", F32);

    let mut case = NgramCase::new(&dev);
    case.prompt_lens = zeros::<f32>(&dev, MAX_BSZ);
    assert_dtype(case.run(&dev), Op::NgramMatch, "prompt_lens", "i32", F32);

    let mut case = LogprobsCase::new(&dev);
    case.accept_num = zeros::<half::bf16>(&dev, MAX_BSZ);
    assert_dtype(
        case.run(&dev),
        Op::AcceptLogprobs,
        "accept_num",
        "i32",
        BF16,
    );
}

#[test]
fn flags_must_be_u8_and_float_outputs_f32() {
    let dev = device();
    let mut case = VerifyCase::new(&dev, Strategy::Greedy);
    case.stop_flags = zeros::<i32>(&dev, MAX_BSZ);
    assert_dtype(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "stop_flags",
        "u8",
        I32,
    );

    let mut case = UpdateCase::new(&dev);
    case.is_block_step = zeros::<i32>(&dev, MAX_BSZ);
    assert_dtype(case.run(&dev), Op::UpdateState, "is_block_step", "u8", I32);

    // softmax writes f32 whatever the logits dtype.
    let mut case = SoftmaxCase::new(&dev);
    case.probs = zeros::<half::f16>(&dev, T_OUT * V);
    assert_dtype(case.run(&dev), Op::Softmax, "probs", "f32", F16);

    let mut case = SampleCase::new(&dev);
    case.top_p = zeros::<half::f16>(&dev, T_OUT);
    assert_dtype(case.run(&dev), Op::TopKTopPSample, "top_p", "f32", F16);

    let mut case = CandidatesCase::new(&dev);
    case.scores = zeros::<half::bf16>(&dev, CAP * C);
    assert_dtype(case.run(&dev), Op::TopPCandidates, "scores", "f32", BF16);
}

#[test]
fn gather_output_dtype_must_match_the_hidden_states() {
    let dev = device();
    let mut case = GatherCase::new(&dev);
    case.out = zeros::<half::f16>(&dev, CAP * H);
    assert_dtype(case.run(&dev), Op::GatherNextToken, "out", "f32", F16);
}

#[test]
fn rejection_probabilities_must_be_float() {
    let dev = device();
    let mut case = VerifyCase::new(&dev, Strategy::Rejection);
    if let StrategyBufs::Rejection { draft_probs, .. } = &mut case.strategy {
        *draft_probs = zeros::<i32>(&dev, MAX_BSZ * (S - 1) * V);
    }
    assert_dtype(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "draft_probs",
        "f32|f16|bf16",
        I32,
    );

    let mut case = VerifyCase::new(&dev, Strategy::Rejection);
    if let StrategyBufs::Rejection { top_p, .. } = &mut case.strategy {
        *top_p = zeros::<half::f16>(&dev, T_OUT);
    }
    assert_dtype(case.run(&dev), Op::VerifyDraftTokens, "top_p", "f32", F16);
}

#[test]
fn half_precision_inputs_pass_validation() {
    let dev = device();
    let mut case = SampleCase::new(&dev);
    case.probs = zeros::<half::f16>(&dev, T_OUT * V);
    case.validate(&dev).unwrap();
    case.probs = zeros::<half::bf16>(&dev, T_OUT * V);
    case.validate(&dev).unwrap();

    // Target and draft may differ in dtype (each f32, f16 or bf16).
    let mut case = VerifyCase::new(&dev, Strategy::Rejection);
    if let StrategyBufs::Rejection {
        target_probs,
        draft_probs,
        ..
    } = &mut case.strategy
    {
        *target_probs = zeros::<half::bf16>(&dev, T_OUT * V);
        *draft_probs = zeros::<half::f16>(&dev, MAX_BSZ * (S - 1) * V);
    }
    case.validate(&dev).unwrap();

    // gather copies bits: integer rows are fine, as long as out has the same dtype.
    let mut case = GatherCase::new(&dev);
    case.hidden_states = zeros::<u8>(&dev, TOKEN_NUM * H);
    case.out = zeros::<u8>(&dev, CAP * H);
    case.validate(&dev).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Wrong shape.
// ---------------------------------------------------------------------------------------------

#[test]
fn probs_too_short_is_a_shape_mismatch() {
    let dev = device();
    let mut case = SampleCase::new(&dev);
    case.probs = zeros::<f32>(&dev, T_OUT * V - 1);
    assert_shape(
        case.run(&dev),
        Op::TopKTopPSample,
        "probs",
        T_OUT * V,
        T_OUT * V - 1,
    );

    let mut case = CandidatesCase::new(&dev);
    case.probs = zeros::<f32>(&dev, (CAP - 1) * V);
    assert_shape(
        case.run(&dev),
        Op::TopPCandidates,
        "probs",
        CAP * V,
        (CAP - 1) * V,
    );

    let mut case = SoftmaxCase::new(&dev);
    case.temperature = zeros::<f32>(&dev, T_OUT + 1);
    assert_shape(case.run(&dev), Op::Softmax, "temperature", T_OUT, T_OUT + 1);

    let mut case = ArgmaxCase::new(&dev);
    case.out = zeros::<i32>(&dev, T_OUT - 1);
    assert_shape(case.run(&dev), Op::Argmax, "out", T_OUT, T_OUT - 1);
}

#[test]
fn accept_tokens_of_the_wrong_size_is_a_shape_mismatch() {
    let dev = device();
    let n = MAX_BSZ * S;
    let mut case = UpdateCase::new(&dev);
    case.accept_tokens = zeros::<i32>(&dev, n - 1);
    assert_shape(case.run(&dev), Op::UpdateState, "accept_tokens", n, n - 1);

    let mut case = VerifyCase::new(&dev, Strategy::Greedy);
    case.accept_tokens = zeros::<i32>(&dev, n + S);
    assert_shape(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "accept_tokens",
        n,
        n + S,
    );

    let mut case = LogprobsCase::new(&dev);
    case.accept_tokens = zeros::<i32>(&dev, MAX_BSZ);
    assert_shape(
        case.run(&dev),
        Op::AcceptLogprobs,
        "accept_tokens",
        n,
        MAX_BSZ,
    );
}

#[test]
fn batch_buffers_of_the_wrong_size_are_shape_mismatches() {
    let dev = device();
    let mut case = LayoutCase::new(&dev);
    case.cu_seqlens_q = zeros::<i32>(&dev, MAX_BSZ + 1);
    assert_shape(
        case.run(&dev),
        Op::BuildOutputLayout,
        "cu_seqlens_q",
        REAL_BSZ + 1,
        MAX_BSZ + 1,
    );

    let mut case = VerifyCase::new(&dev, Strategy::Greedy);
    case.cu_seqlens_q_output = zeros::<i32>(&dev, REAL_BSZ);
    assert_shape(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "cu_seqlens_q_output",
        REAL_BSZ + 1,
        REAL_BSZ,
    );

    let mut case = SamplingParamsCase::new(&dev);
    case.top_k = zeros::<i32>(&dev, REAL_BSZ);
    assert_shape(
        case.run(&dev),
        Op::BuildSamplingParams,
        "top_k",
        MAX_BSZ,
        REAL_BSZ,
    );

    let mut case = SamplingParamsCase::new(&dev);
    case.out_top_p = zeros::<f32>(&dev, T_OUT);
    assert_shape(
        case.run(&dev),
        Op::BuildSamplingParams,
        "out top_p",
        CAP,
        T_OUT,
    );

    let all = MAX_BSZ * MAX_MODEL_LEN;
    let mut case = NgramCase::new(&dev);
    case.token_ids_all = zeros::<i32>(&dev, all - 1);
    assert_shape(
        case.run(&dev),
        Op::NgramMatch,
        "token_ids_all",
        all,
        all - 1,
    );

    let mut case = UpdateCase::new(&dev);
    case.token_ids_all = zeros::<i32>(&dev, all + 1);
    assert_shape(
        case.run(&dev),
        Op::UpdateState,
        "token_ids_all",
        all,
        all + 1,
    );

    let mut case = NgramCase::new(&dev);
    case.seq_lens_this_time = zeros::<i32>(&dev, REAL_BSZ);
    assert_shape(
        case.run(&dev),
        Op::NgramMatch,
        "seq_lens_this_time",
        MAX_BSZ,
        REAL_BSZ,
    );
}

#[test]
fn output_row_capacity_below_real_bsz_times_s_is_too_small() {
    let dev = device();
    let mut case = LayoutCase::new(&dev);
    case.batch_id = zeros::<i32>(&dev, CAP - 1);
    assert_shape(
        case.run(&dev),
        Op::BuildOutputLayout,
        "batch_id_per_token_output",
        CAP,
        CAP - 1,
    );

    let mut case = GatherCase::new(&dev);
    case.layout.batch_id = zeros::<i32>(&dev, T_OUT);
    assert_shape(
        case.run(&dev),
        Op::GatherNextToken,
        "batch_id_per_token_output",
        CAP,
        T_OUT,
    );

    // A larger capacity (prefill rows beyond real_bsz · S) is accepted, and sizes the outputs.
    let mut case = LayoutCase::new(&dev);
    case.batch_id = zeros::<i32>(&dev, CAP + 2);
    case.validate(&dev).unwrap();
    let mut case = SamplingParamsCase::new(&dev);
    case.layout.batch_id = zeros::<i32>(&dev, CAP + 2);
    assert_shape(
        case.run(&dev),
        Op::BuildSamplingParams,
        "out top_p",
        CAP + 2,
        CAP,
    );
}

#[test]
fn gather_output_rows_depend_on_the_mode() {
    let dev = device();
    let mut case = GatherCase::new(&dev);
    case.out = zeros::<f32>(&dev, T_OUT * H);
    assert_shape(
        case.run(&dev),
        Op::GatherNextToken,
        "out",
        CAP * H,
        T_OUT * H,
    );

    let mut case = GatherCase::non_speculative(&dev);
    case.out = zeros::<f32>(&dev, CAP * H);
    assert_shape(
        case.run(&dev),
        Op::GatherNextToken,
        "out",
        MAX_BSZ * H,
        CAP * H,
    );

    let mut case = GatherCase::new(&dev);
    case.hidden_states = zeros::<f32>(&dev, TOKEN_NUM * H + 1);
    assert_shape(
        case.run(&dev),
        Op::GatherNextToken,
        "hidden_states",
        TOKEN_NUM * H,
        TOKEN_NUM * H + 1,
    );
}

#[test]
fn top_k_outputs_must_match_k() {
    let dev = device();
    let n = MAX_BSZ * S;
    let mut case = LogprobsCase::new(&dev);
    case.top_ids = zeros::<i32>(&dev, n * (K + 1));
    assert_shape(
        case.run(&dev),
        Op::AcceptLogprobs,
        "top_ids",
        n * K,
        n * (K + 1),
    );

    // K = 0: no top-K work, empty buffers.
    let mut case = LogprobsCase::new(&dev).with_top_k(&dev, 0);
    case.validate(&dev).unwrap();
    case.top_logprobs = zeros::<f32>(&dev, n);
    assert_shape(case.run(&dev), Op::AcceptLogprobs, "top_logprobs", 0, n);
}

#[test]
fn candidate_outputs_must_match_c() {
    let dev = device();
    let mut case = CandidatesCase::new(&dev);
    case.ids = zeros::<i32>(&dev, CAP * (C - 1));
    assert_shape(
        case.run(&dev),
        Op::TopPCandidates,
        "ids",
        CAP * C,
        CAP * (C - 1),
    );

    let mut case = VerifyCase::new(&dev, Strategy::TopP);
    case.strategy = StrategyBufs::top_p(&dev, T_OUT, C);
    if let StrategyBufs::TopP { candidates, .. } = &mut case.strategy {
        *candidates = C + 1;
    }
    assert_shape(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "candidate_ids",
        T_OUT * (C + 1),
        T_OUT * C,
    );
}

#[test]
fn host_copies_of_the_wrong_length_are_shape_mismatches() {
    let dev = device();
    let mut case = SampleCase::new(&dev);
    case.host_top_p = Some(vec![0.5; T_OUT - 1]);
    assert_shape(
        case.run(&dev),
        Op::TopKTopPSample,
        "host top_p",
        T_OUT,
        T_OUT - 1,
    );

    // build_sampling_params' host copies are per slot.
    let mut case = SamplingParamsCase::new(&dev);
    case.host_top_p = Some(vec![0.5; CAP]);
    assert_shape(
        case.run(&dev),
        Op::BuildSamplingParams,
        "host top_p",
        MAX_BSZ,
        CAP,
    );

    let mut case = SamplingParamsCase::new(&dev);
    case.host_temperature = Some(vec![1.0; REAL_BSZ]);
    assert_shape(
        case.run(&dev),
        Op::BuildSamplingParams,
        "host temperature",
        MAX_BSZ,
        REAL_BSZ,
    );

    let mut case = SoftmaxCase::new(&dev);
    case.host_temperature = Some(vec![]);
    assert_shape(case.run(&dev), Op::Softmax, "host temperature", T_OUT, 0);

    let mut case = LayoutCase::new(&dev);
    case.host.this_time.truncate(REAL_BSZ - 1);
    assert_shape(
        case.run(&dev),
        Op::BuildOutputLayout,
        "host seq_lens_this_time",
        REAL_BSZ,
        REAL_BSZ - 1,
    );

    let mut case = VerifyCase::new(&dev, Strategy::Greedy);
    case.host.encoder.clear();
    assert_shape(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "host seq_lens_encoder",
        REAL_BSZ,
        0,
    );
}

/// `validate_gather_next_token` slices `host.seq_lens_this_time[..real_bsz]` before
/// `HostSlotLens::validate` has checked its length, so a short host copy panics instead of
/// returning `ShapeMismatch`. Un-ignore once the API checks the length first.
#[test]
fn gather_short_host_lengths_are_a_shape_mismatch() {
    let dev = device();
    let mut case = GatherCase::new(&dev);
    case.host.this_time.truncate(REAL_BSZ - 1);
    assert_shape(
        case.run(&dev),
        Op::GatherNextToken,
        "host seq_lens_this_time",
        REAL_BSZ,
        REAL_BSZ - 1,
    );
}

// ---------------------------------------------------------------------------------------------
// Buffer from another device.
// ---------------------------------------------------------------------------------------------

#[test]
fn buffer_from_another_device_is_a_device_mismatch() {
    let dev = device();
    let other = device();
    assert_ne!(dev.id(), other.id());

    let mut case = SampleCase::new(&dev);
    case.probs = up(&other, &prob_rows(T_OUT, V));
    assert_device(case.run(&dev), Op::TopKTopPSample, "probs", &dev, &other);

    let mut case = SampleCase::new(&dev);
    case.tokens = zeros::<i32>(&other, T_OUT);
    assert_device(case.run(&dev), Op::TopKTopPSample, "tokens", &dev, &other);

    let mut case = LayoutCase::new(&dev);
    case.seq_lens_output = zeros::<i32>(&other, MAX_BSZ);
    assert_device(
        case.run(&dev),
        Op::BuildOutputLayout,
        "seq_lens_output",
        &dev,
        &other,
    );

    let mut case = GatherCase::new(&dev);
    case.hidden_states = zeros::<f32>(&other, TOKEN_NUM * H);
    assert_device(
        case.run(&dev),
        Op::GatherNextToken,
        "hidden_states",
        &dev,
        &other,
    );

    let mut case = SamplingParamsCase::new(&dev);
    case.layout.cu_seqlens_q_output = up(&other, &CU_SEQLENS_Q_OUTPUT);
    assert_device(
        case.run(&dev),
        Op::BuildSamplingParams,
        "cu_seqlens_q_output",
        &dev,
        &other,
    );

    let mut case = ArgmaxCase::new(&dev);
    case.out = zeros::<i32>(&other, T_OUT);
    assert_device(case.run(&dev), Op::Argmax, "out", &dev, &other);

    let mut case = SoftmaxCase::new(&dev);
    case.temperature = zeros::<f32>(&other, T_OUT);
    assert_device(case.run(&dev), Op::Softmax, "temperature", &dev, &other);

    let mut case = CandidatesCase::new(&dev);
    case.batch_id = Some(up(&other, &BATCH_ID));
    assert_device(
        case.run(&dev),
        Op::TopPCandidates,
        "batch_id_per_token_output",
        &dev,
        &other,
    );

    let mut case = VerifyCase::new(&dev, Strategy::Greedy);
    case.end_tokens = up(&other, &END_TOKENS);
    assert_device(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "end_tokens",
        &dev,
        &other,
    );

    let mut case = VerifyCase::new(&dev, Strategy::Rejection);
    if let StrategyBufs::Rejection { target_probs, .. } = &mut case.strategy {
        *target_probs = up(&other, &prob_rows(T_OUT, V));
    }
    assert_device(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "target_probs",
        &dev,
        &other,
    );

    let mut case = UpdateCase::new(&dev);
    case.seq_lens_decoder = zeros::<i32>(&other, MAX_BSZ);
    assert_device(
        case.run(&dev),
        Op::UpdateState,
        "seq_lens_decoder",
        &dev,
        &other,
    );

    let mut case = NgramCase::new(&dev);
    case.draft_tokens = zeros::<i32>(&other, MAX_BSZ * S);
    assert_device(case.run(&dev), Op::NgramMatch, "draft_tokens", &dev, &other);

    let mut case = LogprobsCase::new(&dev);
    case.cu_accept = zeros::<i32>(&other, MAX_BSZ + 1);
    assert_device(
        case.run(&dev),
        Op::AcceptLogprobs,
        "cu_accept",
        &dev,
        &other,
    );
}

#[test]
fn memory_operations_check_the_owning_device() {
    let dev = device();
    let other = device();
    let mut foreign = zeros::<i32>(&other, 4);
    assert_device(
        dev.download_bytes(&foreign),
        Op::Memory,
        "src",
        &dev,
        &other,
    );
    assert_device(
        dev.write_bytes(&mut foreign, &[0; 16]),
        Op::Memory,
        "dst",
        &dev,
        &other,
    );
}

// ---------------------------------------------------------------------------------------------
// Scalar parameters out of range.
// ---------------------------------------------------------------------------------------------

#[test]
fn vocab_zero_or_above_2_pow_20_is_invalid() {
    let dev = device();
    for vocab in [0, (1 << 20) + 1] {
        let mut case = ArgmaxCase::new(&dev);
        case.shape.vocab = vocab;
        assert_invalid(case.run(&dev), Op::Argmax, "vocab");

        let mut case = SoftmaxCase::new(&dev);
        case.shape.vocab = vocab;
        assert_invalid(case.run(&dev), Op::Softmax, "vocab");

        let mut case = SampleCase::new(&dev);
        case.shape.vocab = vocab;
        let (expected, actual) = assert_invalid(case.run(&dev), Op::TopKTopPSample, "vocab");
        assert_eq!(expected, format!("1 ..= {}", 1 << 20));
        assert_eq!(actual, vocab.to_string());

        let mut case = CandidatesCase::new(&dev);
        case.shape.vocab = vocab;
        assert_invalid(case.run(&dev), Op::TopPCandidates, "vocab");

        for strategy in Strategy::ALL {
            let mut case = VerifyCase::new(&dev, strategy);
            case.vocab = vocab;
            assert_invalid(case.run(&dev), Op::VerifyDraftTokens, "vocab");
        }

        let mut case = LogprobsCase::new(&dev);
        case.shape.vocab = vocab;
        assert_invalid(case.run(&dev), Op::AcceptLogprobs, "vocab");
    }
}

#[test]
fn vocab_of_exactly_2_pow_20_is_accepted() {
    let dev = device();
    let vocab = 1 << 20;
    let mut case = ArgmaxCase::new(&dev);
    case.shape = RowShape { rows: 1, vocab };
    case.input = zeros::<half::f16>(&dev, vocab);
    case.out = zeros::<i32>(&dev, 1);
    case.validate(&dev).unwrap();
}

#[test]
fn host_top_p_outside_0_1_is_invalid() {
    let dev = device();
    let bad = [
        0.0f32,
        -0.0,
        1.5,
        f32::NAN,
        -0.25,
        f32::INFINITY,
        1.0 + f32::EPSILON,
    ];
    for p in bad {
        let mut case = SampleCase::new(&dev);
        case.host_top_p.as_mut().expect("host top_p")[2] = p;
        let (expected, actual) = assert_invalid(case.run(&dev), Op::TopKTopPSample, "top_p");
        assert!(
            expected.contains("entry 2") && expected.contains("(0, 1]"),
            "{expected}"
        );
        assert_eq!(actual, p.to_string());

        let mut case = CandidatesCase::new(&dev);
        case.host_top_p.as_mut().expect("host top_p")[CAP - 1] = p;
        assert_invalid(case.run(&dev), Op::TopPCandidates, "top_p");

        let mut case = SamplingParamsCase::new(&dev);
        case.host_top_p.as_mut().expect("host top_p")[0] = p;
        assert_invalid(case.run(&dev), Op::BuildSamplingParams, "top_p");
    }
}

#[test]
fn top_p_error_message_names_the_op_and_the_argument() {
    let dev = device();
    let mut case = SampleCase::new(&dev);
    case.host_top_p = Some(vec![0.5, 1.5, 0.5, 0.5]);
    let message = case.run(&dev).expect_err("1.5 is out of range").to_string();
    assert!(message.contains("top_k_top_p_sample"), "{message}");
    assert!(message.contains("top_p"), "{message}");
    assert!(
        message.contains("(0, 1]") && message.contains("1.5"),
        "{message}"
    );
}

#[test]
fn host_top_p_edges_and_device_top_p_are_accepted() {
    let dev = device();
    let mut case = SampleCase::new(&dev);
    case.host_top_p = Some(vec![1.0, f32::MIN_POSITIVE, 1e-45, 0.5]);
    case.validate(&dev).unwrap();

    // Only host copies are validated; device values out of range count as 1.0 in the op.
    let mut case = SampleCase::new(&dev);
    case.top_p = up(&dev, &[0.0f32, f32::NAN, 2.0, -1.0]);
    case.host_top_p = None;
    case.validate(&dev).unwrap();
}

#[test]
fn candidates_0_or_129_are_invalid() {
    let dev = device();
    for candidates in [0, 129] {
        let mut case = CandidatesCase::new(&dev).with_candidates(&dev, candidates);
        let (expected, actual) = assert_invalid(case.run(&dev), Op::TopPCandidates, "candidates");
        assert_eq!(
            (expected.as_str(), actual),
            ("1 ..= 128", candidates.to_string())
        );

        let mut case = VerifyCase::new(&dev, Strategy::TopP);
        case.strategy = StrategyBufs::top_p(&dev, T_OUT, candidates);
        assert_invalid(case.run(&dev), Op::VerifyDraftTokens, "candidates");
    }
    for candidates in [1, 128] {
        CandidatesCase::new(&dev)
            .with_candidates(&dev, candidates)
            .validate(&dev)
            .unwrap();
        let mut case = VerifyCase::new(&dev, Strategy::TopP);
        case.strategy = StrategyBufs::top_p(&dev, T_OUT, candidates);
        case.validate(&dev).unwrap();
    }
}

/// Runs every batch op's case with `dims` replaced, expecting `InvalidArgument { arg }`.
fn assert_every_batch_op_rejects(dims: BatchDims, arg: &str) {
    let dev = device();
    let mut case = LayoutCase::new(&dev);
    case.dims = dims;
    assert_invalid(case.run(&dev), Op::BuildOutputLayout, arg);

    let mut case = GatherCase::new(&dev);
    case.dims = dims;
    assert_invalid(case.run(&dev), Op::GatherNextToken, arg);

    let mut case = SamplingParamsCase::new(&dev);
    case.dims = dims;
    assert_invalid(case.run(&dev), Op::BuildSamplingParams, arg);

    for strategy in Strategy::ALL {
        let mut case = VerifyCase::new(&dev, strategy);
        case.dims = dims;
        assert_invalid(case.run(&dev), Op::VerifyDraftTokens, arg);
    }

    let mut case = UpdateCase::new(&dev);
    case.dims = dims;
    assert_invalid(case.run(&dev), Op::UpdateState, arg);

    let mut case = NgramCase::new(&dev);
    case.params.dims = dims;
    assert_invalid(case.run(&dev), Op::NgramMatch, arg);

    let mut case = LogprobsCase::new(&dev);
    case.dims = dims;
    assert_invalid(case.run(&dev), Op::AcceptLogprobs, arg);
}

#[test]
fn max_step_tokens_zero_is_invalid() {
    assert_every_batch_op_rejects(
        BatchDims {
            max_step_tokens: 0,
            ..dims()
        },
        "max_step_tokens",
    );
}

#[test]
fn real_bsz_above_max_bsz_is_invalid() {
    assert_every_batch_op_rejects(
        BatchDims {
            real_bsz: MAX_BSZ + 1,
            ..dims()
        },
        "real_bsz",
    );
}

#[test]
fn empty_end_tokens_are_too_small() {
    let dev = device();
    for strategy in Strategy::ALL {
        let mut case = VerifyCase::new(&dev, strategy);
        case.end_tokens = zeros::<i32>(&dev, 0);
        assert_shape(case.run(&dev), Op::VerifyDraftTokens, "end_tokens", 1, 0);
    }
    let mut case = UpdateCase::new(&dev);
    case.end_tokens = zeros::<i32>(&dev, 0);
    assert_shape(case.run(&dev), Op::UpdateState, "end_tokens", 1, 0);

    // E = 1 is enough.
    let mut case = UpdateCase::new(&dev);
    case.end_tokens = up(&dev, &[7i32]);
    case.validate(&dev).unwrap();
}

#[test]
fn logprobs_top_k_above_64_is_invalid() {
    let dev = device();
    let mut case = LogprobsCase::new(&dev).with_top_k(&dev, 65);
    let (expected, actual) = assert_invalid(case.run(&dev), Op::AcceptLogprobs, "top_k");
    assert_eq!((expected.as_str(), actual.as_str()), ("0 ..= 64", "65"));

    LogprobsCase::new(&dev)
        .with_top_k(&dev, 64)
        .validate(&dev)
        .unwrap();
}

#[test]
fn negative_or_nan_host_temperature_is_invalid() {
    let dev = device();
    for t in [-1.0f32, -f32::MIN_POSITIVE, f32::NAN, f32::NEG_INFINITY] {
        let mut case = SoftmaxCase::new(&dev);
        case.host_temperature.as_mut().expect("host temperature")[1] = t;
        let (expected, actual) = assert_invalid(case.run(&dev), Op::Softmax, "temperature");
        assert!(expected.contains("entry 1"), "{expected}");
        assert_eq!(actual, t.to_string());

        let mut case = LogprobsCase::new(&dev);
        case.host_temperature.as_mut().expect("host temperature")[0] = t;
        assert_invalid(case.run(&dev), Op::AcceptLogprobs, "temperature");

        let mut case = SamplingParamsCase::new(&dev);
        case.host_temperature.as_mut().expect("host temperature")[3] = t;
        assert_invalid(case.run(&dev), Op::BuildSamplingParams, "temperature");
    }
}

#[test]
fn zero_signed_zero_and_infinite_temperature_are_accepted() {
    let dev = device();
    let mut case = SoftmaxCase::new(&dev);
    case.host_temperature = Some(vec![0.0, -0.0, f32::INFINITY, 1e-30]);
    case.validate(&dev).unwrap();

    // Device temperatures are not validated (negative or NaN count as 1.0 in the op).
    let mut case = SoftmaxCase::new(&dev);
    case.temperature = up(&dev, &[-1.0f32, f32::NAN, 0.0, 1.0]);
    case.host_temperature = None;
    case.validate(&dev).unwrap();
}

#[test]
fn min_ngram_size_outside_1_to_max_is_invalid() {
    let dev = device();
    for (min, max) in [(0, 3), (4, 3), (1, 0)] {
        let mut case = NgramCase::new(&dev);
        case.params.min_ngram_size = min;
        case.params.max_ngram_size = max;
        let (expected, actual) = assert_invalid(case.run(&dev), Op::NgramMatch, "min_ngram_size");
        assert_eq!(expected, format!("1 ..= max_ngram_size {max}"));
        assert_eq!(actual, min.to_string());
    }
    let mut case = NgramCase::new(&dev);
    case.params.min_ngram_size = 3;
    case.validate(&dev).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Host-side slot rules (§1) and row counts.
// ---------------------------------------------------------------------------------------------

/// Runs every op that takes host lengths with `host` replaced; expects `InvalidArgument { arg }`
/// whose `expected` contains `needle`.
fn assert_host_lens_rejected(this_time: &[i32], encoder: &[i32], arg: &str, needle: &str) {
    let dev = device();
    let set = |host: &mut Host| {
        host.this_time = this_time.to_vec();
        host.encoder = encoder.to_vec();
    };
    let mut results = Vec::new();
    let mut case = LayoutCase::new(&dev);
    set(&mut case.host);
    results.push((Op::BuildOutputLayout, case.run(&dev)));
    let mut case = GatherCase::new(&dev);
    set(&mut case.host);
    results.push((Op::GatherNextToken, case.run(&dev)));
    let mut case = SamplingParamsCase::new(&dev);
    set(&mut case.host);
    results.push((Op::BuildSamplingParams, case.run(&dev)));
    for strategy in Strategy::ALL {
        let mut case = VerifyCase::new(&dev, strategy);
        set(&mut case.host);
        results.push((Op::VerifyDraftTokens, case.run(&dev)));
    }
    for (op, result) in results {
        let (expected, _) = assert_invalid(result, op, arg);
        assert!(
            expected.contains(needle),
            "{op}: `{expected}` lacks `{needle}`"
        );
    }
}

#[test]
fn host_this_time_above_s_for_a_decode_slot_is_invalid() {
    assert_host_lens_rejected(
        &[S as i32 + 1, 5, 0, 0],
        &ENCODER,
        "seq_lens_this_time",
        "decode",
    );
}

#[test]
fn prefill_slot_must_feed_its_whole_prompt() {
    assert_host_lens_rejected(&[3, 4, 0, 0], &ENCODER, "seq_lens_this_time", "prefill");
    assert_host_lens_rejected(&[3, 6, 0, 0], &ENCODER, "seq_lens_this_time", "prefill");
}

#[test]
fn negative_host_lengths_are_invalid() {
    assert_host_lens_rejected(&[-1, 5, 0, 0], &ENCODER, "seq_lens_this_time", ">= 0");
    assert_host_lens_rejected(&THIS_TIME, &[0, 5, -2, 0], "seq_lens_encoder", ">= 0");
}

#[test]
fn slots_beyond_real_bsz_are_not_checked() {
    let dev = device();
    let mut case = LayoutCase::new(&dev);
    case.host.this_time[REAL_BSZ] = 99;
    case.host.encoder[REAL_BSZ] = -7;
    case.validate(&dev).unwrap();
}

#[test]
fn verify_rows_must_equal_t_out_when_host_lengths_are_given() {
    let dev = device();
    for strategy in Strategy::ALL {
        let mut case = VerifyCase::new(&dev, strategy);
        case.rows = CAP;
        let (expected, actual) = assert_invalid(case.run(&dev), Op::VerifyDraftTokens, "rows");
        assert_eq!(
            (expected, actual),
            (format!("T_out = {T_OUT}"), CAP.to_string())
        );
    }

    // Without host lengths the per-row inputs may be padded to the capacity.
    for strategy in Strategy::ALL {
        let mut case = VerifyCase::new(&dev, strategy);
        case.host.given = false;
        case.rows = CAP;
        case.seeds = zeros::<u64>(&dev, CAP);
        case.strategy = StrategyBufs::new(&dev, strategy, CAP);
        case.validate(&dev).unwrap();
    }
}

#[test]
fn rejection_draft_probs_need_max_bsz_times_s_minus_1_rows_of_v() {
    let dev = device();
    let draft_rows = MAX_BSZ * (S - 1);

    // One row short.
    let mut case = VerifyCase::new(&dev, Strategy::Rejection);
    case.strategy = StrategyBufs::rejection(&dev, T_OUT, draft_rows - 1, V);
    assert_shape(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "draft_probs",
        draft_rows * V,
        (draft_rows - 1) * V,
    );

    // Rows per output row (T_out) instead of per draft slot.
    let mut case = VerifyCase::new(&dev, Strategy::Rejection);
    case.strategy = StrategyBufs::rejection(&dev, T_OUT, T_OUT, V);
    assert_shape(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "draft_probs",
        draft_rows * V,
        T_OUT * V,
    );

    // A different vocabulary.
    let mut case = VerifyCase::new(&dev, Strategy::Rejection);
    case.strategy = StrategyBufs::rejection(&dev, T_OUT, draft_rows, V + 1);
    assert_shape(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "draft_probs",
        draft_rows * V,
        draft_rows * (V + 1),
    );

    // Target rows other than `rows`.
    let mut case = VerifyCase::new(&dev, Strategy::Rejection);
    case.strategy = StrategyBufs::rejection(&dev, T_OUT + 1, draft_rows, V);
    assert_shape(
        case.run(&dev),
        Op::VerifyDraftTokens,
        "target_probs",
        T_OUT * V,
        (T_OUT + 1) * V,
    );

    // S = 1: no drafts, so an empty draft matrix.
    let mut case = VerifyCase::new(&dev, Strategy::Rejection);
    case.dims.max_step_tokens = 1;
    case.host.given = false;
    case.draft_tokens = zeros::<i32>(&dev, MAX_BSZ);
    case.accept_tokens = zeros::<i32>(&dev, MAX_BSZ);
    case.strategy = StrategyBufs::rejection(&dev, T_OUT, 0, V);
    case.validate(&dev).unwrap();
}

#[test]
fn gather_token_num_must_be_the_sum_of_host_this_time() {
    let dev = device();
    for token_num in [TOKEN_NUM - 1, TOKEN_NUM + 1] {
        let mut case = GatherCase::new(&dev);
        case.token_num = token_num;
        case.hidden_states = zeros::<f32>(&dev, token_num * H);
        let (expected, actual) = assert_invalid(case.run(&dev), Op::GatherNextToken, "token_num");
        assert!(expected.contains(&TOKEN_NUM.to_string()), "{expected}");
        assert_eq!(actual, token_num.to_string());

        // Without host lengths the op cannot know; the shapes alone are consistent.
        case.host.given = false;
        case.validate(&dev).unwrap();
    }

    let mut case = GatherCase::new(&dev);
    case.hidden = 0;
    case.hidden_states = zeros::<f32>(&dev, 0);
    case.out = zeros::<f32>(&dev, 0);
    assert_invalid(case.run(&dev), Op::GatherNextToken, "hidden");
}

#[test]
fn sizes_that_overflow_are_errors_not_panics() {
    let dev = device();
    let mut case = SampleCase::new(&dev);
    case.shape.rows = usize::MAX;
    let (expected, _) = assert_invalid(case.run(&dev), Op::TopKTopPSample, "probs");
    assert!(expected.contains("fits in usize"), "{expected}");

    let mut case = GatherCase::new(&dev);
    case.host.given = false;
    case.token_num = usize::MAX;
    assert_invalid(case.run(&dev), Op::GatherNextToken, "hidden_states");

    let mut case = NgramCase::new(&dev);
    case.params.max_model_len = usize::MAX;
    assert_invalid(case.run(&dev), Op::NgramMatch, "token_ids_all");

    let mut case = CandidatesCase::new(&dev);
    case.shape.rows = usize::MAX / V;
    case.candidates = 128;
    case.host_top_p = None;
    // rows · V fits, so the probs length check fires first.
    assert_shape(
        case.run(&dev),
        Op::TopPCandidates,
        "probs",
        (usize::MAX / V) * V,
        CAP * V,
    );
}

/// With `real_bsz == max_bsz == usize::MAX` (and S = 1), `validate_gather_next_token` computes
/// `real_bsz + 1` for `cu_seqlens_q` before checking the `[max_bsz]` length buffers, which
/// overflows (a panic with debug assertions). Un-ignore once the API checks the lengths first.
#[test]
fn gather_huge_batch_dims_are_an_error_not_a_panic() {
    let dev = device();
    let mut case = GatherCase::new(&dev);
    case.host.given = false;
    case.dims = BatchDims {
        max_bsz: usize::MAX,
        real_bsz: usize::MAX,
        max_step_tokens: 1,
    };
    assert!(case.run(&dev).is_err());
}

// ---------------------------------------------------------------------------------------------
// Memory operations and windows.
// ---------------------------------------------------------------------------------------------

/// `write_bytes` with `supplied` elements into a window of `window`: `ShapeMismatch` on `dst`.
/// Which of the two counts is reported as `expected` is left open (see the report: the CPU backend
/// currently reports the supplied count as expected and the window as actual).
#[track_caller]
fn assert_write_length(result: Result<()>, window: usize, supplied: usize) {
    match error_of(result, Op::Memory, "bytes") {
        Error::ShapeMismatch {
            op: Op::Memory,
            arg: "bytes",
            expected,
            actual,
        } => {
            assert_eq!(
                (expected, actual),
                (window, supplied),
                "write_bytes: (expected, actual)"
            );
        }
        other => panic!("expected ShapeMismatch {{ op: memory, arg: bytes }}, got {other:?}"),
    }
}

#[test]
fn write_bytes_of_the_wrong_length_is_a_shape_mismatch() {
    let dev = device();
    let mut buffer = zeros::<i32>(&dev, 4);
    assert_write_length(dev.write_bytes(&mut buffer, &[0; 12]), 4, 3);
    assert_write_length(dev.write_bytes(&mut buffer, &[0; 20]), 4, 5);
    assert_write_length(dev.write(&mut buffer, &[1i32; 3]), 4, 3);

    // A length that is not a whole number of elements.
    let (expected, actual) =
        assert_invalid(dev.write_bytes(&mut buffer, &[0; 15]), Op::Memory, "bytes");
    assert!(expected.contains("multiple of 4"), "{expected}");
    assert_eq!(actual, "15");
    assert_invalid(dev.upload_bytes(U64, &[0; 12]), Op::Memory, "bytes");

    // The typed helpers check the dtype.
    assert_dtype(
        dev.write(&mut buffer, &[1u32; 4]),
        Op::Memory,
        "buffer",
        "u32",
        I32,
    );
    assert_dtype(
        dev.download::<f32>(&buffer),
        Op::Memory,
        "buffer",
        "f32",
        I32,
    );

    // Nothing was written by the failed calls.
    assert_eq!(dev.download::<i32>(&buffer).unwrap(), vec![0; 4]);
    dev.write(&mut buffer, &[1i32, 2, 3, 4]).unwrap();
    assert_eq!(dev.download::<i32>(&buffer).unwrap(), vec![1, 2, 3, 4]);
}

#[test]
fn write_bytes_length_is_the_window() {
    let dev = device();
    let mut buffer = zeros::<i32>(&dev, 6);
    buffer.set_window(2, 3).unwrap();
    assert_write_length(dev.write(&mut buffer, &[9i32; 6]), 3, 6);
    dev.write(&mut buffer, &[7i32, 8, 9]).unwrap();
    buffer.reset_window();
    assert_eq!(
        dev.download::<i32>(&buffer).unwrap(),
        vec![0, 0, 7, 8, 9, 0]
    );
}

#[test]
fn set_window_beyond_capacity_is_invalid() {
    let dev = device();
    let mut buffer = zeros::<f32>(&dev, 8);
    for (offset, len) in [
        (0, 9),
        (8, 1),
        (5, 4),
        (9, 0),
        (usize::MAX, 2),
        (1, usize::MAX),
    ] {
        let (expected, actual) =
            assert_invalid(buffer.set_window(offset, len), Op::Memory, "window");
        assert!(expected.contains("capacity 8"), "{expected}");
        assert!(actual.contains(&offset.to_string()) && actual.contains(&len.to_string()));
        // A rejected window leaves the buffer as it was.
        assert_eq!((buffer.offset(), buffer.len()), (0, 8));
    }
    buffer.set_window(8, 0).unwrap();
    assert!(buffer.is_empty());
    buffer.set_window(3, 5).unwrap();
    assert_eq!(
        (buffer.offset(), buffer.len(), buffer.capacity()),
        (3, 5, 8)
    );
}

#[test]
fn ops_see_the_window_not_the_allocation() {
    let dev = device();
    let mut case = ArgmaxCase::new(&dev);
    let mut out = zeros::<i32>(&dev, T_OUT + 4);
    out.set_window(2, T_OUT).unwrap();
    case.out = out;
    case.validate(&dev).unwrap();

    case.out.set_window(2, T_OUT + 1).unwrap();
    assert_shape(case.run(&dev), Op::Argmax, "out", T_OUT, T_OUT + 1);
}
