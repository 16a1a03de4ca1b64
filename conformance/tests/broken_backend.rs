//! The suite catches a broken backend: a test-only `Device` that is the CPU reference plus one
//! deliberate bug — (a) it flips one accepted token of `verify_draft_tokens`, or (b) it writes one
//! element past an output window — fails its trials, with messages that name the backend, op, case
//! and the mismatch or the guard violation. The unbroken copy passes the same trials.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use specula_backend_api::ops::*;
use specula_backend_api::{
    Buffer, Capabilities, DType, Device, DeviceExt, DeviceId, DeviceInfo, Op, Result,
};
use specula_backend_cpu::CpuDevice;
use specula_conformance::backends::Backend;
use specula_conformance::case::{Case, CaseParams, Dims};
use specula_conformance::cases::Size;
use specula_conformance::report::Report;
use specula_conformance::suite::{CaseEntry, Outcome, Plan, Suite};
use specula_conformance::tensor::HostTensor;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Bug {
    None,
    /// `verify_draft_tokens` emits a wrong first token in the first slot that emits any.
    FlipAcceptedToken,
    /// `argmax` and `verify_draft_tokens` write one element past the end of an output's window.
    WritePastOutput,
}

#[derive(Debug)]
struct BrokenDevice {
    inner: CpuDevice,
    bug: Bug,
}

impl BrokenDevice {
    fn open(bug: Bug) -> Arc<dyn Device> {
        Arc::new(BrokenDevice {
            inner: CpuDevice::new().unwrap(),
            bug,
        })
    }

    /// Writes one element just past `buffer`'s window, through the public `Buffer` API.
    fn write_past(&self, buffer: &mut Buffer) -> Result<()> {
        let (offset, len) = (buffer.offset(), buffer.len());
        buffer.set_window(offset + len, 1)?;
        let junk = vec![0x5A; buffer.dtype().size_bytes()];
        let written = self.inner.write_bytes(buffer, &junk);
        buffer.set_window(offset, len)?;
        written
    }
}

impl Device for BrokenDevice {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn id(&self) -> DeviceId {
        self.inner.id()
    }
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    fn alloc_zeroed(&self, dtype: DType, len: usize) -> Result<Buffer> {
        self.inner.alloc_zeroed(dtype, len)
    }
    fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<Buffer> {
        self.inner.upload_bytes(dtype, bytes)
    }
    fn write_bytes(&self, dst: &mut Buffer, bytes: &[u8]) -> Result<()> {
        self.inner.write_bytes(dst, bytes)
    }
    fn download_bytes(&self, src: &Buffer) -> Result<Vec<u8>> {
        self.inner.download_bytes(src)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn build_output_layout(
        &self,
        lens: &SlotLens<'_>,
        out: &mut LayoutOutputs<'_>,
        params: &LayoutParams<'_>,
    ) -> Result<()> {
        self.inner.build_output_layout(lens, out, params)
    }
    fn gather_next_token(
        &self,
        inputs: &GatherInputs<'_>,
        out: &mut Buffer,
        params: &GatherParams<'_>,
    ) -> Result<()> {
        self.inner.gather_next_token(inputs, out, params)
    }
    fn build_sampling_params(
        &self,
        inputs: &SamplingParamsInputs<'_>,
        out: &mut RowSamplingParams<'_>,
        params: &SamplingParamsParams<'_>,
    ) -> Result<()> {
        self.inner.build_sampling_params(inputs, out, params)
    }
    fn argmax(&self, input: &Buffer, out: &mut Buffer, shape: &RowShape) -> Result<()> {
        self.inner.argmax(input, out, shape)?;
        if self.bug == Bug::WritePastOutput {
            self.write_past(out)?;
        }
        Ok(())
    }
    fn softmax(
        &self,
        logits: &Buffer,
        temperature: &Buffer,
        probs: &mut Buffer,
        params: &SoftmaxParams<'_>,
    ) -> Result<()> {
        self.inner.softmax(logits, temperature, probs, params)
    }
    fn top_k_top_p_sample(
        &self,
        inputs: &SampleInputs<'_>,
        tokens: &mut Buffer,
        params: &SampleParams<'_>,
    ) -> Result<()> {
        self.inner.top_k_top_p_sample(inputs, tokens, params)
    }
    fn top_p_candidates(
        &self,
        inputs: &CandidatesInputs<'_>,
        out: &mut CandidatesOutputs<'_>,
        params: &CandidatesParams<'_>,
    ) -> Result<()> {
        self.inner.top_p_candidates(inputs, out, params)
    }
    fn verify_draft_tokens(
        &self,
        inputs: &VerifyInputs<'_>,
        out: &mut VerifyOutputs<'_>,
        params: &VerifyParams<'_>,
    ) -> Result<()> {
        self.inner.verify_draft_tokens(inputs, out, params)?;
        match self.bug {
            Bug::None => {}
            Bug::FlipAcceptedToken => {
                let accept_num: Vec<i32> = self.inner.download(out.accept_num)?;
                let mut tokens: Vec<i32> = self.inner.download(out.accept_tokens)?;
                let s = params.dims.max_step_tokens;
                if let Some(slot) = accept_num.iter().position(|&n| n > 0) {
                    tokens[slot * s] ^= 1;
                    self.inner.write(out.accept_tokens, &tokens)?;
                }
            }
            Bug::WritePastOutput => self.write_past(out.accept_num)?,
        }
        Ok(())
    }
    fn update_state(
        &self,
        inputs: &UpdateStateInputs<'_>,
        state: &mut DecodeState<'_>,
        params: &UpdateStateParams,
    ) -> Result<()> {
        self.inner.update_state(inputs, state, params)
    }
    fn ngram_match(
        &self,
        inputs: &NgramInputs<'_>,
        out: &mut NgramOutputs<'_>,
        params: &NgramParams,
    ) -> Result<()> {
        self.inner.ngram_match(inputs, out, params)
    }
    fn accept_logprobs(
        &self,
        inputs: &LogprobsInputs<'_>,
        out: &mut LogprobsOutputs<'_>,
        params: &LogprobsParams<'_>,
    ) -> Result<()> {
        self.inner.accept_logprobs(inputs, out, params)
    }
}

/// Two slots: slot 0 verifies two drafts that the target confirms (3 tokens emitted), slot 1 has
/// no draft (1 token).
fn verify_case() -> Case {
    let dims = Dims {
        max_bsz: 2,
        real_bsz: 2,
        max_step_tokens: 3,
    };
    let params = CaseParams::VerifyDraftTokens {
        dims,
        rows: 4,
        vocab: 1000,
        strategy: "target_match".to_owned(),
        candidates: 0,
        accept_all: false,
        reject_all: false,
    };
    Case::new("hand::bs2_s3", params)
        .with(
            "draft_tokens",
            HostTensor::new(&[2, 3], &[10i32, 11, 12, 20, -1, -1]),
        )
        .with("seq_lens_this_time", HostTensor::vector(&[3i32, 1]))
        .with("seq_lens_encoder", HostTensor::vector(&[0i32, 0]))
        .with("cu_seqlens_q_output", HostTensor::vector(&[0i32, 3, 4]))
        .with("stop_flags", HostTensor::vector(&[0u8, 0]))
        .with("is_block_step", HostTensor::vector(&[0u8, 0]))
        .with("reasoning_status", HostTensor::vector(&[0i32, 0]))
        .with("step_idx", HostTensor::vector(&[5i32, 5]))
        .with("max_dec_len", HostTensor::vector(&[100i32, 100]))
        .with("end_tokens", HostTensor::vector(&[999i32]))
        .with("seeds", HostTensor::vector(&[1u64, 5, 9, 13]))
        .with("target_tokens", HostTensor::vector(&[11i32, 12, 13, 21]))
}

fn argmax_case() -> Case {
    Case::new("hand::f32::2x5", CaseParams::Argmax { rows: 2, vocab: 5 }).with(
        "input",
        HostTensor::new(
            &[2, 5],
            &[0.1f32, 0.7, 0.2, 0.0, -1.0, 0.5, 0.4, 0.1, 3.0, 2.0],
        ),
    )
}

fn suite_over(device: Arc<dyn Device>) -> Suite {
    Suite::new(vec![Backend::available("broken", device)], Size::Quick).unwrap()
}

/// Runs the hand-written cases on `device` through the suite; returns every outcome by trial name.
fn run_hand_cases(device: Arc<dyn Device>) -> Vec<(String, Outcome)> {
    let suite = suite_over(device);
    let entries = vec![CaseEntry::new(verify_case()), CaseEntry::new(argmax_case())];
    suite
        .case_trials(&entries)
        .iter()
        .map(|t| (t.name(), suite.run(t)))
        .collect()
}

fn failure<'a>(outcomes: &'a [(String, Outcome)], name: &str) -> &'a str {
    match outcomes.iter().find(|(n, _)| n == name) {
        Some((_, Outcome::Failed(message))) => message,
        other => panic!("{name}: expected a failure, got {other:?}"),
    }
}

/// The same code path as `specula run` (`Suite::run_plan`) over the generated cases of `ops`.
fn run_generated(device: Arc<dyn Device>, ops: &[Op]) -> Report {
    let plan = Plan {
        ops: ops.to_vec(),
        properties: false,
        filter: None,
    };
    suite_over(device).run_plan(&plan, &mut |_| {})
}

#[test]
fn the_unbroken_copy_passes() {
    let outcomes = run_hand_cases(BrokenDevice::open(Bug::None));
    assert_eq!(outcomes.len(), 2);
    for (name, outcome) in &outcomes {
        assert_eq!(outcome, &Outcome::Passed, "{name}");
    }
    // The hand-written verify case really emits tokens (so flipping one is observable).
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new().unwrap());
    let outputs = specula_conformance::exec::run_case(cpu.as_ref(), &verify_case()).unwrap();
    assert_eq!(
        outputs.tensors["accept_num"].to_vec::<i32>().unwrap(),
        vec![3, 1]
    );
    let report = run_generated(
        BrokenDevice::open(Bug::None),
        &[Op::Argmax, Op::VerifyDraftTokens],
    );
    assert_eq!(report.totals().failed, 0, "{}", report.render());
}

#[test]
fn a_flipped_accepted_token_fails() {
    let outcomes = run_hand_cases(BrokenDevice::open(Bug::FlipAcceptedToken));
    let message = failure(&outcomes, "broken::verify_draft_tokens::hand::bs2_s3");
    assert!(
        message.starts_with("backend broken, op verify_draft_tokens, case hand::bs2_s3: mismatch: accept_tokens[0]: expected 11, got 10"),
        "{message}"
    );
    assert_eq!(outcomes[1].1, Outcome::Passed, "argmax is not broken");

    let report = run_generated(
        BrokenDevice::open(Bug::FlipAcceptedToken),
        &[Op::VerifyDraftTokens],
    );
    assert!(!report.passed(), "{}", report.render());
    assert!(report.totals().failed > 0, "{}", report.render());
    assert!(report.render().contains("FAIL:"));
}

#[test]
fn a_write_past_an_output_fails() {
    let outcomes = run_hand_cases(BrokenDevice::open(Bug::WritePastOutput));
    let message = failure(&outcomes, "broken::verify_draft_tokens::hand::bs2_s3");
    assert!(
        message.contains("wrote outside its output: `accept_num` element 2 (1 past the end of its 2-element window"),
        "{message}"
    );
    let message = failure(&outcomes, "broken::argmax::hand::f32::2x5");
    assert!(
        message.contains("backend broken, op argmax, case hand::f32::2x5: wrote outside its output: `out` element 2"),
        "{message}"
    );
    // The outputs themselves are right: only the guard caught it.
    assert!(!message.contains("mismatch"), "{message}");

    let report = run_generated(
        BrokenDevice::open(Bug::WritePastOutput),
        &[Op::Argmax, Op::VerifyDraftTokens],
    );
    assert!(!report.passed(), "{}", report.render());
    let cells = report.cells();
    for op in ["argmax", "verify_draft_tokens"] {
        let cell = cells.iter().find(|c| c.op == op).expect(op);
        assert!(
            cell.counts.failed > 0 && cell.counts.passed == 0,
            "{op}: {}",
            report.render()
        );
    }
}

#[test]
fn an_absent_backend_is_skipped_with_its_reason_or_fails_when_required() {
    let backends = vec![
        Backend::available("cpu", BrokenDevice::open(Bug::None)),
        Backend::unavailable("ghost", "library not found"),
    ];
    let entries = vec![CaseEntry::new(argmax_case())];
    let suite = Suite::new(backends.clone(), Size::Quick).unwrap();
    let trials = suite.case_trials(&entries);
    let ghost = trials.iter().find(|t| t.backend.name == "ghost").unwrap();
    assert!(ghost.is_skipped());
    assert_eq!(
        ghost.display_name(),
        "[skipped: ghost: library not found] ghost::argmax::hand::f32::2x5"
    );
    assert_eq!(
        suite.run(ghost),
        Outcome::Skipped("ghost: library not found".to_owned())
    );
    let plan = Plan {
        ops: vec![Op::Argmax],
        properties: false,
        filter: Some("hand".to_owned()),
    };
    // Never a silent pass: a run where only skips happened is not a pass either.
    let only_ghost = Suite::new(vec![backends[1].clone()], Size::Quick).unwrap();
    assert!(!only_ghost.run_plan(&plan, &mut |_| {}).passed());

    let required = Suite::new(backends, Size::Quick)
        .unwrap()
        .with_required(["ghost".to_owned()].into());
    let trials = required.case_trials(&entries);
    let ghost = trials.iter().find(|t| t.backend.name == "ghost").unwrap();
    assert!(!ghost.is_skipped());
    match required.run(ghost) {
        Outcome::Failed(message) => assert!(
            message
                .contains("ghost is required (SPECULA_REQUIRE) but unavailable: library not found"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
}
