//! What an op costs the CUDA driver after its warm-up, counted by the device itself
//! (`Device::memory_stats().driver`): no allocation, no synchronisation and no copy, only its
//! launches, for every op with scratch (the split sample, REJECTION, `accept_logprobs`,
//! `ngram_match`) and the ops of a TARGET_MATCH step. A split sample repeated on reused scratch,
//! between ops that leave other data in it, gives the CPU backend's tokens every time. A captured
//! step replays with one launch and gives what the step gives, on new logits too; a capture
//! refuses (typed) what it cannot record and leaves the device usable.
//!
//! Needs an NVIDIA GPU: without one the tests are listed as ignored with the reason, and fail
//! under `SPECULA_REQUIRE=cuda` (`ci/test-cuda.sh` on a GPU machine).

use std::process::ExitCode;

use specula_backend_api::named_tests;
use specula_backend_api::ops::*;
use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_api::{Buffer, Device, DeviceExt, DriverStats, Error, Result};
use specula_backend_cpu::CpuDevice;
use specula_backend_cuda::CudaDevice;
use specula_reference::fixtures::step::{StepRows, StepSlots};

/// Slots of the step, tokens per slot, and a vocabulary large enough to split a few rows.
const SLOTS: usize = 4;
const S: usize = 3;
const VOCAB: usize = 151_936;

type Outcome = std::result::Result<(), String>;

fn open() -> std::result::Result<CudaDevice, String> {
    let device = CudaDevice::new(0).map_err(|e| e.to_string())?;
    device.warm_up().map_err(|e| format!("warm-up: {e}"))?;
    Ok(device)
}

/// Deterministic logits (σ ≈ 3.5, peaked) for `rows` rows.
fn logits(rows: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..rows * VOCAB)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 12.0
        })
        .collect()
}

/// The driver calls of `call` on `device`, run once before (its warm-up: kernels, scratch).
fn driver_cost(device: &CudaDevice, call: &mut dyn FnMut() -> Result<()>) -> Result<DriverStats> {
    call()?;
    let before = device.memory_stats();
    call()?;
    let after = device.memory_stats().since(&before);
    if after.blocking_waits != 0 {
        return Err(Error::invalid(
            specula_backend_api::Op::Memory,
            "op",
            "no blocking wait",
            after.blocking_waits,
        ));
    }
    Ok(after.driver.unwrap_or_default())
}

/// `launches` launches and nothing else.
fn only_launches(what: &str, cost: DriverStats, launches: u64) -> Outcome {
    let want = DriverStats {
        launches,
        ..DriverStats::default()
    };
    if cost != want {
        return Err(format!("{what}: {cost:?}, expected {want:?}"));
    }
    Ok(())
}

/// Sampling inputs of `rows` rows: top-k 50 / top-p 0.9 and seeds.
struct Sampling {
    top_k: Buffer,
    top_p: Buffer,
    seed: Buffer,
    temperature: Buffer,
}

impl Sampling {
    fn new(d: &dyn Device, rows: usize) -> Result<Self> {
        Ok(Sampling {
            top_k: d.upload(&vec![50i32; rows])?,
            top_p: d.upload(&vec![0.9f32; rows])?,
            seed: d.upload(&(0..rows as u64).map(|r| r * 7 + 1).collect::<Vec<_>>())?,
            temperature: d.upload(&vec![0.8f32; rows])?,
        })
    }

    fn sample(
        &self,
        d: &dyn Device,
        scores: &Buffer,
        tokens: &mut Buffer,
        rows: usize,
    ) -> Result<()> {
        let inputs = SampleInputs::new(
            Scores::logits(scores, &self.temperature),
            &self.top_k,
            &self.top_p,
            &self.seed,
        );
        d.top_k_top_p_sample(
            &inputs,
            tokens,
            &SampleParams::new(RowShape { rows, vocab: VOCAB }),
        )
    }
}

/// Every op with scratch, and argmax, cost only their launches once warm.
fn ops_after_their_warm_up_only_launch() -> Outcome {
    let d = open()?;
    let e = |e: Error| e.to_string();
    let rows = SLOTS * S;
    let scores = d.upload(&logits(rows, 1)).map_err(e)?;
    let sampling = Sampling::new(&d, rows).map_err(e)?;
    let mut tokens = d.alloc::<i32>(rows).map_err(e)?;
    // Two rows of a large vocabulary: split over cooperating blocks (barrier words, histograms).
    let (two, two_sampling) = (
        d.upload(&logits(2, 1)).map_err(e)?,
        Sampling::new(&d, 2).map_err(e)?,
    );
    let mut two_tokens = d.alloc::<i32>(2).map_err(e)?;
    let mut call = || two_sampling.sample(&d, &two, &mut two_tokens, 2);
    only_launches("split sample", driver_cost(&d, &mut call).map_err(e)?, 1)?;
    let mut call = || sampling.sample(&d, &scores, &mut tokens, rows);
    only_launches("sample", driver_cost(&d, &mut call).map_err(e)?, 1)?;
    let shape = RowShape { rows, vocab: VOCAB };
    let mut call = || d.argmax(&scores, &mut tokens, &shape);
    only_launches("argmax", driver_cost(&d, &mut call).map_err(e)?, 1)?;

    let step = Step::new(&d).map_err(e)?;
    let (dims, cu_out, zeros) = (step.slots.dims, &step.cu_out, &step.slots.zeros_i32);
    let accept_num = d.upload(&[S as i32; SLOTS]).map_err(e)?;
    let accept_tokens = d.upload(&(0..rows as i32).collect::<Vec<_>>()).map_err(e)?;
    let mut out = LogprobsBuffers::alloc(&d, SLOTS, rows, 5).map_err(e)?;
    let mut call = || {
        let inputs = LogprobsInputs {
            logits: &scores,
            temperature: &sampling.temperature,
            accept_tokens: &accept_tokens,
            accept_num: &accept_num,
            seq_lens_encoder: zeros,
            cu_seqlens_q_output: cu_out,
        };
        let params = LogprobsParams {
            dims,
            shape,
            top_k: 5,
            host_temperature: None,
        };
        d.accept_logprobs(&inputs, &mut out.outputs(), &params)
    };
    only_launches("accept_logprobs", driver_cost(&d, &mut call).map_err(e)?, 2)?;

    let draft = d.upload(&logits(SLOTS * (S - 1), 2)).map_err(e)?;
    let (mut accepted, mut count) = (
        d.alloc::<i32>(rows).map_err(e)?,
        d.alloc::<i32>(SLOTS).map_err(e)?,
    );
    let mut call = || {
        step.verify_rejection(
            &d,
            (&scores, &draft, &sampling),
            (&mut accepted, &mut count),
        )
    };
    only_launches("REJECTION", driver_cost(&d, &mut call).map_err(e)?, 2)?;

    let history: Vec<i32> = (0..SLOTS * 64).map(|i| ((i * 7) % 5) as i32).collect();
    let history = d.upload(&history).map_err(e)?;
    let (prompt_lens, step_idx) = (
        d.upload(&[20i32; SLOTS]).map_err(e)?,
        d.upload(&[30i32; SLOTS]).map_err(e)?,
    );
    let budget = d.upload(&[S as i32 - 1; SLOTS]).map_err(e)?;
    let max_dec_len = d.upload(&[1000i32; SLOTS]).map_err(e)?;
    let mut drafts = d.alloc::<i32>(rows).map_err(e)?;
    let mut this_time = d.upload(&[1i32; SLOTS]).map_err(e)?;
    let mut call = || {
        let inputs = NgramInputs {
            token_ids_all: &history,
            prompt_lens: &prompt_lens,
            step_idx: &step_idx,
            draft_token_num: &budget,
            seq_lens_encoder: zeros,
            max_dec_len: &max_dec_len,
        };
        let params = NgramParams {
            dims,
            max_model_len: 64,
            max_ngram_size: 3,
            min_ngram_size: 1,
            threshold: 1024,
        };
        let mut out = NgramOutputs {
            draft_tokens: &mut drafts,
            seq_lens_this_time: &mut this_time,
        };
        d.ngram_match(&inputs, &mut out, &params)
    };
    only_launches("ngram_match", driver_cost(&d, &mut call).map_err(e)?, 2)
}

/// The per-slot state of a TARGET_MATCH step of `SLOTS` slots × `S` tokens
/// ([`specula_reference::fixtures::step`]) and its layout.
struct Step {
    slots: StepSlots,
    /// The layout of full slots (`0, S, 2S, ...`), for the ops run outside a step.
    cu_out: Buffer,
}

impl Step {
    fn new(d: &dyn Device) -> Result<Self> {
        Ok(Step {
            slots: StepSlots::new(d, (SLOTS, S, VOCAB), 0.8, 7919)?,
            cu_out: d.upload(&(0..=SLOTS as i32).map(|b| b * S as i32).collect::<Vec<_>>())?,
        })
    }

    /// Layout, per-row parameters, sampling of `logits` (at the rows' temperatures), TARGET_MATCH.
    fn run(&self, d: &dyn Device, logits: &Buffer, o: &mut StepRows) -> Result<()> {
        o.plan(d, &self.slots)?;
        let sample = SampleInputs::new(
            Scores::logits(logits, &o.temperature),
            &o.top_k,
            &o.top_p,
            &o.seed,
        );
        let shape = RowShape {
            rows: SLOTS * S,
            vocab: VOCAB,
        };
        d.top_k_top_p_sample(&sample, &mut o.targets, &SampleParams::new(shape))?;
        o.verify(d, &self.slots)
    }

    /// REJECTION of dense draft logits against target logits (layout of `cu_out` 0, S, 2S, ...).
    fn verify_rejection(
        &self,
        d: &dyn Device,
        (target, draft, sampling): (&Buffer, &Buffer, &Sampling),
        (accept_tokens, accept_num): (&mut Buffer, &mut Buffer),
    ) -> Result<()> {
        let slots = &self.slots;
        let verify = VerifyInputs {
            draft_tokens: &slots.drafts,
            lens: slots.lens(),
            cu_seqlens_q_output: &self.cu_out,
            state: slots.state(),
            seeds: &sampling.seed,
            strategy: StrategyInputs::Rejection(RejectionInputs {
                target: Scores::logits(target, &sampling.temperature),
                draft,
                draft_index: None,
                top_k: &sampling.top_k,
                top_p: &sampling.top_p,
                fallback: None,
            }),
        };
        let mut out = VerifyOutputs {
            accept_tokens,
            accept_num,
        };
        d.verify_draft_tokens(&verify, &mut out, &slots.verify_params())
    }
}

/// The split sample's tokens equal the CPU backend's, every time, while REJECTION and
/// `accept_logprobs` leave other data in the arena between the samples.
fn a_split_sample_on_reused_scratch_matches_the_cpu_backend() -> Outcome {
    let d = open()?;
    let cpu = CpuDevice::new().map_err(|e| e.to_string())?;
    let e = |e: Error| e.to_string();
    let rows = 2;
    let values = logits(rows, 3);
    let (scores, cpu_scores) = (
        d.upload(&values).map_err(e)?,
        cpu.upload(&values).map_err(e)?,
    );
    let (sampling, cpu_sampling) = (
        Sampling::new(&d, rows).map_err(e)?,
        Sampling::new(&cpu, rows).map_err(e)?,
    );
    // REJECTION's target rows and their sampling inputs, in the same arena between the samples.
    let target = d.upload(&logits(SLOTS * S, 8)).map_err(e)?;
    let target_sampling = Sampling::new(&d, SLOTS * S).map_err(e)?;
    let mut want = cpu.alloc::<i32>(rows).map_err(e)?;
    cpu_sampling
        .sample(&cpu, &cpu_scores, &mut want, rows)
        .map_err(e)?;
    let want: Vec<i32> = cpu.download(&want).map_err(e)?;
    let step = Step::new(&d).map_err(e)?;
    let draft = d.upload(&logits(SLOTS * (S - 1), 4)).map_err(e)?;
    let (mut accepted, mut count) = (
        d.alloc::<i32>(SLOTS * S).map_err(e)?,
        d.alloc::<i32>(SLOTS).map_err(e)?,
    );
    let mut tokens = d.alloc::<i32>(rows).map_err(e)?;
    for round in 0..5 {
        sampling.sample(&d, &scores, &mut tokens, rows).map_err(e)?;
        let got: Vec<i32> = d.download(&tokens).map_err(e)?;
        if got != want {
            return Err(format!("round {round}: {got:?}, the CPU backend {want:?}"));
        }
        step.verify_rejection(
            &d,
            (&target, &draft, &target_sampling),
            (&mut accepted, &mut count),
        )
        .map_err(e)?;
    }
    Ok(())
}

/// A captured TARGET_MATCH step replays with one launch (no allocation, copy or wait) and writes
/// what the step writes, on the logits it was captured with and on new ones.
fn a_captured_step_replays_the_step() -> Outcome {
    let d = open()?;
    let e = |e: Error| e.to_string();
    let rows = SLOTS * S;
    let step = Step::new(&d).map_err(e)?;
    let mut logits_buf = d.upload(&logits(rows, 5)).map_err(e)?;
    let mut plain = StepRows::new(&d, &step.slots).map_err(e)?;
    let mut replayed = StepRows::new(&d, &step.slots).map_err(e)?;
    let outputs = |o: &StepRows| -> std::result::Result<(Vec<i32>, Vec<i32>), String> {
        Ok((
            d.download(&o.accept_tokens).map_err(e)?,
            d.download(&o.accept_num).map_err(e)?,
        ))
    };
    // Once uncaptured: builds the kernels and grows the arena.
    step.run(&d, &logits_buf, &mut replayed).map_err(e)?;
    let captured = d
        .capture_step(|dev| step.run(dev, &logits_buf, &mut replayed))
        .map_err(|err| format!("capture: {err}"))?;
    for seed in [5u64, 6] {
        d.write(&mut logits_buf, &logits(rows, seed)).map_err(e)?;
        step.run(&d, &logits_buf, &mut plain).map_err(e)?;
        let before = d.memory_stats();
        captured.replay(&d).map_err(e)?;
        let cost = d.memory_stats().since(&before).driver.unwrap_or_default();
        only_launches("replay", cost, 1)?;
        let (want, got) = (outputs(&plain)?, outputs(&replayed)?);
        if want != got {
            return Err(format!(
                "logits {seed}: replayed {got:?}, the step {want:?}"
            ));
        }
    }
    if captured.kernels() != 4 {
        return Err(format!(
            "{} kernels recorded, expected 4",
            captured.kernels()
        ));
    }
    Ok(())
}

/// A call a capture must refuse.
type Refused<'a> = Box<dyn Fn(&CudaDevice) -> Result<()> + 'a>;

/// A download, a synchronisation or an allocation inside a capture is refused as unsupported;
/// a capture of nothing is an invalid argument; the device works normally afterwards.
fn a_capture_refuses_what_it_cannot_record() -> Outcome {
    let d = open()?;
    let e = |e: Error| e.to_string();
    let values = logits(1, 7);
    let scores = d.upload(&values).map_err(e)?;
    let mut tokens = d.alloc::<i32>(1).map_err(e)?;
    let shape = RowShape {
        rows: 1,
        vocab: VOCAB,
    };
    d.argmax(&scores, &mut tokens, &shape).map_err(e)?;
    let refusals: [(&str, Refused<'_>); 3] = [
        (
            "download",
            Box::new(|dev| dev.download::<i32>(&tokens).map(drop)),
        ),
        ("synchronize", Box::new(|dev| dev.synchronize())),
        ("alloc", Box::new(|dev| dev.alloc::<i32>(4).map(drop))),
    ];
    for (what, body) in &refusals {
        match d.capture_step(|dev| body(dev)) {
            Err(Error::Unsupported { .. }) => {}
            other => return Err(format!("{what} in a capture: {other:?}")),
        }
    }
    match d.capture_step(|_| Ok(())) {
        Err(Error::InvalidArgument { .. }) => {}
        other => return Err(format!("an empty capture: {other:?}")),
    }
    let mut again = d.alloc::<i32>(1).map_err(e)?;
    d.argmax(&scores, &mut again, &shape).map_err(e)?;
    let (a, b): (Vec<i32>, Vec<i32>) = (
        d.download(&tokens).map_err(e)?,
        d.download(&again).map_err(e)?,
    );
    if a != b {
        return Err(format!("after the refused captures: {b:?}, before {a:?}"));
    }
    Ok(())
}

fn main() -> ExitCode {
    let needs = Needs::of_open("cuda", &CudaDevice::new(0));
    let tests: Vec<(&str, TestFn)> = named_tests![
        ops_after_their_warm_up_only_launch,
        a_split_sample_on_reused_scratch_matches_the_cpu_backend,
        a_captured_step_replays_the_step,
        a_capture_refuses_what_it_cannot_record,
    ];
    testing::run(&needs, tests)
}
