//! The CPU's own fallible allocation, and the part of host-side validation that the conformance
//! suite cannot run as a case.
//!
//! Validation lives in backend-api's front, the same for every backend. Its error classes
//! (`docs/semantics.md` §6) are conformance cases, run on every backend: the `invalid::` cases of
//! each op (`conformance/src/cases/invalid/`, `specula run --filter invalid::`) and, for the memory
//! operations, the `invalid_memory_arguments` property. What a case cannot express is checked here,
//! on the CPU:
//!
//! - host copies of another length than their device buffers: the suite's runner takes the host
//!   copies from the device tensors, whose lengths the front checks first;
//! - bad output buffers (dtype, length, device): the runner allocates every output from the case's
//!   parameters, on the device under test;
//! - `rows · V` overflowing on the row ops: the runner would first allocate the `[rows]` output;
//! - [`Buffer::set_window`], which no device call reaches;
//! - calls without rows (the front's zero-row rule): no case has zero rows.

mod common;

use std::fmt::Debug;

use common::{Rows, down, sample_and_candidates, up, zeros};
use specula_backend_api::ops::*;
use specula_backend_api::{BackendKind, Buffer, DType, Device, Error, Op, Result};
use specula_backend_cpu::CpuDevice;

/// The batch: slot 0 decodes 3 tokens, slot 1 prefills 5, slot 2 is empty, slot 3 lies beyond
/// `real_bsz`: `T_out` = 4 output rows from 8 packed tokens, a capacity `real_bsz · S` of 9.
const THIS_TIME: [i32; 4] = [3, 5, 0, 0];
const ENCODER: [i32; 4] = [0, 5, 0, 0];
const DIMS: BatchDims = BatchDims::new(4, 3, 3);
const T_OUT: usize = 4;
const TOKEN_NUM: usize = 8;
const CAP: usize = 9;
const V: usize = 8;
const H: usize = 2;

fn device() -> CpuDevice {
    CpuDevice::with_threads(1).expect("the CPU device always opens")
}

fn host_lens<'a>(this_time: &'a [i32], encoder: &'a [i32]) -> Option<HostSlotLens<'a>> {
    Some(HostSlotLens {
        seq_lens_this_time: this_time,
        seq_lens_encoder: encoder,
    })
}

/// The batch on the device: its lengths, its layout (as `build_output_layout` writes it) and
/// hidden states of [`H`] zeros per packed token.
struct Batch {
    this_time: Buffer,
    encoder: Buffer,
    seq_lens_output: Buffer,
    cu_seqlens_q: Buffer,
    cu_seqlens_q_output: Buffer,
    batch_id: Buffer,
    hidden_states: Buffer,
}

impl Batch {
    fn new(dev: &CpuDevice) -> Self {
        Batch {
            this_time: up(dev, &THIS_TIME),
            encoder: up(dev, &ENCODER),
            seq_lens_output: up(dev, &[3i32, 1, 0, 0]),
            cu_seqlens_q: up(dev, &[0i32, 3, 8, 8]),
            cu_seqlens_q_output: up(dev, &[0i32, 3, 4, 4]),
            batch_id: up(dev, &[0i32, 0, 0, 1, -1, -1, -1, -1, -1]),
            hidden_states: zeros::<f32>(dev, TOKEN_NUM * H),
        }
    }

    fn lens(&self) -> SlotLens<'_> {
        SlotLens {
            seq_lens_this_time: &self.this_time,
            seq_lens_encoder: &self.encoder,
        }
    }

    /// `build_output_layout` of the batch with the host lengths `host`.
    fn build_layout(&mut self, dev: &CpuDevice, host: Option<HostSlotLens<'_>>) -> Result<()> {
        let lens = SlotLens {
            seq_lens_this_time: &self.this_time,
            seq_lens_encoder: &self.encoder,
        };
        let mut outputs = LayoutOutputs {
            seq_lens_output: &mut self.seq_lens_output,
            cu_seqlens_q: &mut self.cu_seqlens_q,
            cu_seqlens_q_output: &mut self.cu_seqlens_q_output,
            batch_id_per_token_output: &mut self.batch_id,
        };
        let params = LayoutParams { dims: DIMS, host };
        dev.build_output_layout(&lens, &mut outputs, &params)
    }

    fn gather_inputs(&self) -> GatherInputs<'_> {
        GatherInputs {
            hidden_states: &self.hidden_states,
            cu_seqlens_q: &self.cu_seqlens_q,
            lens: self.lens(),
            layout: OutputLayout {
                cu_seqlens_q_output: &self.cu_seqlens_q_output,
                batch_id_per_token_output: &self.batch_id,
            },
        }
    }
}

/// `gather_next_token` parameters of the batch.
fn gather_params(is_speculative: bool, host: Option<HostSlotLens<'_>>) -> GatherParams<'_> {
    GatherParams {
        dims: DIMS,
        token_num: TOKEN_NUM,
        hidden: H,
        is_speculative,
        host,
    }
}

/// The kind of a host-side rejection, its op and its argument.
fn rejection(error: &Error) -> Option<(&'static str, Op, &'static str)> {
    Some(match error {
        Error::InvalidArgument { op, arg, .. } => ("invalid", *op, *arg),
        Error::ShapeMismatch { op, arg, .. } => ("shape", *op, *arg),
        Error::DTypeMismatch { op, arg, .. } => ("dtype", *op, *arg),
        Error::DeviceMismatch { op, arg, .. } => ("device", *op, *arg),
        _ => return None,
    })
}

/// Asserts that `result` is the rejection `kind` (`invalid`, `shape`, `dtype`, `device`) of `op`
/// naming `arg`, with a message that names both.
#[track_caller]
fn assert_rejects<T: Debug>(result: Result<T>, op: Op, kind: &str, arg: &str) {
    let error = match result {
        Ok(value) => panic!("{op}: expected a {kind} error on `{arg}`, got Ok({value:?})"),
        Err(error) => error,
    };
    assert_eq!(rejection(&error), Some((kind, op, arg)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(op.name()) && message.contains(arg),
        "`{message}` does not name {op} and `{arg}`"
    );
}

// ---------------------------------------------------------------------------------------------
// The CPU's allocation.
// ---------------------------------------------------------------------------------------------

/// The CPU declares no largest buffer, so the front passes every size that fits in `usize` and
/// the CPU's own storage refuses what it cannot have: `OutOfMemory` with the bytes requested,
/// never an abort.
#[test]
fn the_cpu_allocation_is_fallible() {
    let dev = device();
    assert_eq!(dev.capabilities().max_buffer_bytes, None);
    // 2^63 bytes: more than any allocation may be; 2^48 bytes: more than a process can map (so
    // the refusal does not depend on the machine's overcommit policy, as 4 TiB would).
    for (len, bytes) in [(1usize << 61, 1usize << 63), (1 << 46, 1 << 48)] {
        match dev.alloc_zeroed(DType::F32, len) {
            Err(Error::OutOfMemory {
                backend: BackendKind::Cpu,
                requested_bytes,
            }) => assert_eq!(requested_bytes, bytes),
            other => panic!("alloc_zeroed of {len} f32: {other:?}"),
        }
    }
    assert_eq!(down::<f32>(&dev, &zeros::<f32>(&dev, 3)), [0.0; 3]);
}

// ---------------------------------------------------------------------------------------------
// Host copies of another length than their device buffers.
// ---------------------------------------------------------------------------------------------

#[test]
fn host_top_p_and_temperature_of_another_length_are_shape_mismatches() {
    let dev = device();
    let probs = up(&dev, &[1.0f32 / V as f32; T_OUT * V]);
    let (top_k, top_p) = (zeros::<i32>(&dev, T_OUT), up(&dev, &[0.5f32; T_OUT]));
    let seed = zeros::<u64>(&dev, T_OUT);
    let mut tokens = zeros::<i32>(&dev, T_OUT);
    let inputs = SampleInputs::new(Scores::Probs(&probs), &top_k, &top_p, &seed);
    let shape = RowShape {
        rows: T_OUT,
        vocab: V,
    };
    let params = SampleParams {
        shape,
        host_top_p: Some(&[0.5; T_OUT - 1]),
    };
    let result = dev.top_k_top_p_sample(&inputs, &mut tokens, &params);
    assert_rejects(result, Op::TopKTopPSample, "shape", "host top_p");

    let temperature = up(&dev, &[1.0f32; T_OUT]);
    let mut out = zeros::<f32>(&dev, T_OUT * V);
    let params = SoftmaxParams {
        shape,
        host_temperature: Some(&[]),
    };
    let result = dev.softmax(&probs, &temperature, &mut out, &params);
    assert_rejects(result, Op::Softmax, "shape", "host temperature");
}

#[test]
fn short_host_lengths_are_shape_mismatches() {
    let dev = device();
    let mut batch = Batch::new(&dev);
    let short = &THIS_TIME[..DIMS.real_bsz - 1];
    let result = batch.build_layout(&dev, host_lens(short, &ENCODER));
    let arg = "host seq_lens_this_time";
    assert_rejects(result, Op::BuildOutputLayout, "shape", arg);

    // gather once sliced the host copy before checking its length (a panic).
    let mut out = zeros::<f32>(&dev, CAP * H);
    let params = gather_params(true, host_lens(short, &ENCODER));
    let result = dev.gather_next_token(&batch.gather_inputs(), &mut out, &params);
    assert_rejects(result, Op::GatherNextToken, "shape", arg);
}

// ---------------------------------------------------------------------------------------------
// Output buffers.
// ---------------------------------------------------------------------------------------------

#[test]
fn outputs_of_another_dtype_length_or_device_are_rejected() {
    let dev = device();
    let other = device();
    let shape = RowShape {
        rows: T_OUT,
        vocab: V,
    };
    let input = up(&dev, &[0.5f32; T_OUT * V]);
    let argmax = |out: &mut Buffer| dev.argmax(&input, out, &shape);
    assert_rejects(
        argmax(&mut zeros::<f32>(&dev, T_OUT)),
        Op::Argmax,
        "dtype",
        "out",
    );
    assert_rejects(
        argmax(&mut zeros::<i32>(&other, T_OUT)),
        Op::Argmax,
        "device",
        "out",
    );
    // Ops see the window, not the allocation.
    let mut out = zeros::<i32>(&dev, T_OUT + 4);
    out.set_window(2, T_OUT + 1).unwrap();
    assert_rejects(argmax(&mut out), Op::Argmax, "shape", "out");
    out.set_window(2, T_OUT).unwrap();
    argmax(&mut out).unwrap();

    // softmax writes f32 whatever the logits dtype.
    let temperature = up(&dev, &[1.0f32; T_OUT]);
    let params = SoftmaxParams {
        shape,
        host_temperature: None,
    };
    let mut probs = zeros::<half::f16>(&dev, T_OUT * V);
    let result = dev.softmax(&input, &temperature, &mut probs, &params);
    assert_rejects(result, Op::Softmax, "dtype", "probs");
}

#[test]
fn gather_output_follows_the_hidden_states_and_the_mode() {
    let dev = device();
    let batch = Batch::new(&dev);
    let inputs = batch.gather_inputs();
    let params = |is_speculative| gather_params(is_speculative, host_lens(&THIS_TIME, &ENCODER));
    let mut out = zeros::<half::f16>(&dev, CAP * H);
    let result = dev.gather_next_token(&inputs, &mut out, &params(true));
    assert_rejects(result, Op::GatherNextToken, "dtype", "out");
    // Not speculative: one row per slot, not per layout row.
    let mut out = zeros::<f32>(&dev, CAP * H);
    let result = dev.gather_next_token(&inputs, &mut out, &params(false));
    assert_rejects(result, Op::GatherNextToken, "shape", "out");
    let mut out = zeros::<f32>(&dev, DIMS.max_bsz * H);
    dev.gather_next_token(&inputs, &mut out, &params(false))
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Sizes of the row ops that overflow.
// ---------------------------------------------------------------------------------------------

#[test]
fn row_counts_whose_matrix_overflows_are_errors_not_panics() {
    let dev = device();
    let shape = RowShape {
        rows: usize::MAX,
        vocab: V,
    };
    let input = up(&dev, &[0.5f32; T_OUT * V]);
    let (mut out, temperature) = (zeros::<i32>(&dev, T_OUT), up(&dev, &[1.0f32; T_OUT]));
    assert_rejects(
        dev.argmax(&input, &mut out, &shape),
        Op::Argmax,
        "invalid",
        "input",
    );
    let params = SoftmaxParams {
        shape,
        host_temperature: None,
    };
    let mut probs = zeros::<f32>(&dev, T_OUT * V);
    let result = dev.softmax(&input, &temperature, &mut probs, &params);
    assert_rejects(result, Op::Softmax, "invalid", "logits");
}

// ---------------------------------------------------------------------------------------------
// Limits that are accepted, and windows.
// ---------------------------------------------------------------------------------------------

#[test]
fn vocab_of_exactly_2_pow_20_is_accepted() {
    let dev = device();
    let vocab = 1 << 20;
    let input = zeros::<half::f16>(&dev, vocab);
    let mut out = zeros::<i32>(&dev, 1);
    dev.argmax(&input, &mut out, &RowShape { rows: 1, vocab })
        .unwrap();
}

/// Host lengths are checked for the described slots only (the conformance cases hold no such
/// batch: their host copies beyond `real_bsz` are zeros).
#[test]
fn host_lengths_beyond_real_bsz_are_not_checked() {
    let dev = device();
    let mut batch = Batch::new(&dev);
    let host = host_lens(&[3, 5, 0, 99], &[0, 5, 0, -7]);
    batch.build_layout(&dev, host).unwrap();
}

/// A call without rows is valid, and does nothing (the front's zero-row rule; no conformance case
/// has zero rows).
#[test]
fn zero_rows_are_a_valid_no_op() {
    let dev = device();
    let empty = Rows::<f32> {
        probs: Vec::new(),
        vocab: 32,
        top_k: Vec::new(),
        top_p: Vec::new(),
        seed: Vec::new(),
    };
    let (tokens, ids, scores, lens) = sample_and_candidates(&dev, &empty);
    assert!(tokens.is_empty() && ids.is_empty() && scores.is_empty() && lens.is_empty());
    let shape = RowShape { rows: 0, vocab: 32 };
    let (logits, mut out) = (zeros::<f32>(&dev, 0), zeros::<i32>(&dev, 0));
    dev.argmax(&logits, &mut out, &shape).unwrap();
    let mut probs = zeros::<f32>(&dev, 0);
    let params = SoftmaxParams {
        shape,
        host_temperature: None,
    };
    dev.softmax(&logits, &logits, &mut probs, &params).unwrap();
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
        let result = buffer.set_window(offset, len);
        let Err(Error::InvalidArgument {
            op: Op::Memory,
            arg: "window",
            expected,
            actual,
        }) = result
        else {
            panic!("set_window({offset}, {len}): {result:?}");
        };
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
