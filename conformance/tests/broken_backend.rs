//! The suite catches a broken backend: a test-only `Device` that is the CPU reference plus one
//! deliberate bug — (a) it flips one accepted token of `verify_draft_tokens`, or (b) it writes one
//! element past an output window — fails its trials, with messages that name the backend, op, case
//! and the mismatch or the guard violation. The unbroken copy passes the same trials.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;

use common::verify_case;
use specula_backend_api::backend::{Alloc, AnyCall, Backend, DeviceDesc, Download, Upload, Write};
use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, Device, DeviceExt, Op, Result};
use specula_backend_cpu::CpuDevice;
use specula_conformance::backends::Backend as BackendUnderTest;
use specula_conformance::cases::Case;
use specula_conformance::cases::{Size, argmax};
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

    /// Applies the bug to the outputs of `verify_draft_tokens` (`s` tokens per slot).
    fn break_verify(&self, out: &mut VerifyOutputs<'_>, s: usize) -> Result<()> {
        match self.bug {
            Bug::None => Ok(()),
            Bug::FlipAcceptedToken => {
                let accept_num: Vec<i32> = self.inner.download(out.accept_num)?;
                let mut tokens: Vec<i32> = self.inner.download(out.accept_tokens)?;
                if let Some(slot) = accept_num.iter().position(|&n| n > 0) {
                    tokens[slot * s] ^= 1;
                    self.inner.write(out.accept_tokens, &tokens)?;
                }
                Ok(())
            }
            Bug::WritePastOutput => self.write_past(out.accept_num),
        }
    }

    /// Writes one element just past `buffer`'s window, through the public `Buffer` API.
    fn write_past(&self, buffer: &mut Buffer) -> Result<()> {
        let (offset, len) = (buffer.offset(), buffer.len());
        buffer.set_window(offset + len, 1)?;
        let junk = vec![0x5A; buffer.dtype().size_bytes()];
        let written = Device::write_bytes(&self.inner, buffer, &junk);
        buffer.set_window(offset, len)?;
        written
    }
}

impl Backend for BrokenDevice {
    fn desc(&self) -> &DeviceDesc {
        self.inner.desc()
    }
    fn run_alloc_zeroed(&self, alloc: Alloc) -> Result<Buffer> {
        self.inner.run_alloc_zeroed(alloc)
    }
    fn run_upload(&self, upload: Upload<'_>) -> Result<Buffer> {
        self.inner.run_upload(upload)
    }
    fn run_write(&self, write: Write<'_, '_>) -> Result<()> {
        self.inner.run_write(write)
    }
    fn run_download(&self, download: Download<'_>) -> Result<Vec<u8>> {
        self.inner.run_download(download)
    }
    fn run_synchronize(&self) -> Result<()> {
        self.inner.run_synchronize()
    }
    fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
        match call {
            AnyCall::Argmax(mut call) => {
                let (input, out, shape, _) = call.parts();
                Device::argmax(&self.inner, input, out, shape)?;
                if self.bug == Bug::WritePastOutput {
                    self.write_past(out)?;
                }
                Ok(())
            }
            AnyCall::VerifyDraftTokens(mut call) => {
                let (inputs, out, params, _) = call.parts();
                Device::verify_draft_tokens(&self.inner, inputs, out, params)?;
                self.break_verify(out, params.dims.max_step_tokens)
            }
            other => self.inner.run(other),
        }
    }
}

fn argmax_case() -> Case {
    Case::new("hand::f32::2x5", argmax::Params { rows: 2, vocab: 5 }).with(
        "input",
        HostTensor::new(
            &[2, 5],
            &[0.1f32, 0.7, 0.2, 0.0, -1.0, 0.5, 0.4, 0.1, 3.0, 2.0],
        ),
    )
}

fn suite_over(device: Arc<dyn Device>) -> Suite {
    Suite::new(
        vec![BackendUnderTest::available("broken", device)],
        Size::Quick,
    )
    .unwrap()
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
    let outputs = specula_conformance::cases::run_case(cpu.as_ref(), &verify_case()).unwrap();
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
    for op in [Op::Argmax, Op::VerifyDraftTokens] {
        let cell = cells.iter().find(|c| c.op == op.name()).unwrap();
        // Only the `invalid::` cases pass: they are rejected before the op runs.
        let invalid = specula_conformance::cases::cases(op, Size::Quick)
            .iter()
            .filter(|c| c.expected_error.is_some())
            .count();
        assert!(
            cell.counts.failed > 0 && cell.counts.passed == invalid,
            "{op}: {}",
            report.render()
        );
    }
}

#[test]
fn an_absent_backend_is_skipped_with_its_reason_or_fails_when_required() {
    let backends = vec![
        BackendUnderTest::available("cpu", BrokenDevice::open(Bug::None)),
        BackendUnderTest::unavailable("ghost", "library not found"),
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
