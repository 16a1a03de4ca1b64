//! The suite: one named trial per backend × op × case (and per backend × end-to-end property), run
//! against the oracle — the plain reference device (`specula-reference`) — with one [`Outcome`]
//! each.
//!
//! The `specula` command, the `cargo test` harness and the tests that prove the suite catches a
//! broken backend all go through this module, so they agree on names, references and verdicts.
//!
//! - A trial's name is `<backend>::<op>::<case>` (`cpu::verify_draft_tokens::target_match::bs64_s6`)
//!   or `<backend>::properties::<property>`.
//! - The expected outputs of a case are its golden `expected` tensors where it has them, and
//!   otherwise the outputs of the reference device: every op written the obvious way, independent
//!   of every backend's code — the fast CPU backend is held to it like the others.
//! - An `invalid::` case carries the error it expects; the reference and every backend must
//!   reject it with that kind of error, naming that argument. A case the reference rejects without
//!   expecting it fails (`rejected: …`).
//! - A trial of an unavailable backend is [`Outcome::Skipped`] with the reason, or
//!   [`Outcome::Failed`] when the backend is required ([`crate::backends::REQUIRE_VAR`]).
//!
//! ```
//! use specula_conformance::{backends, cases::Size, suite::{Plan, Suite}};
//! let suite = Suite::new(backends::probe_selected(&[specula_backend_api::BackendKind::Cpu]), Size::Quick)?;
//! let plan = Plan { ops: vec![specula_backend_api::Op::Argmax], properties: false, filter: None };
//! let report = suite.run_plan(&plan, &mut |_| {});
//! assert_eq!(report.totals().failed, 0);
//! # Ok::<(), specula_conformance::ConformanceError>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use specula_backend_api::{Device, Error, Op};

use crate::backends::Backend;
use crate::case::ExpectedError;
use crate::cases::Case;
use crate::cases::{self, Size};
use crate::compare::compare_outputs;
use crate::exec::Outputs;
use crate::properties::{self, Property};
pub use crate::report::{Outcome, PROPERTIES};
use crate::report::{Report, TrialResult};
use crate::tensor::HostTensor;
use crate::{ConformanceError, Result};

/// Why a trial does not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The backend is unavailable, with the registry's reason.
    Unavailable(String),
    /// The backend's capabilities exclude this case (`dtype bf16`).
    Unsupported(String),
}

/// The expected outputs of a case, computed once and shared by every backend's trial of it.
#[derive(Debug)]
enum Reference {
    Outputs(BTreeMap<String, HostTensor>),
    /// The reference rejects the case on the host, as its `expected_error` says.
    Rejected {
        error: ExpectedError,
        message: String,
    },
    /// The reference rejects the case on the host though the case expects outputs: every
    /// backend should reject it too, and the case is reported as `rejected: …`.
    Unexpected(String),
    /// The case is broken: it cannot run, or the reference does not do what it expects.
    Broken(String),
}

/// A case and its lazily computed reference outputs.
#[derive(Debug)]
pub struct CaseEntry {
    /// The case.
    pub case: Case,
    reference: OnceLock<Reference>,
}

impl CaseEntry {
    /// Wraps a case for the suite.
    pub fn new(case: Case) -> Arc<Self> {
        Arc::new(CaseEntry {
            case,
            reference: OnceLock::new(),
        })
    }

    fn reference(&self, reference_device: &dyn Device) -> &Reference {
        self.reference.get_or_init(|| {
            let expected_error = &self.case.expected_error;
            if let (Some(expected), None) = (&self.case.expected, expected_error) {
                return Reference::Outputs(expected.clone());
            }
            let run = catch(|| crate::cases::run_case(reference_device, &self.case));
            match (run, expected_error) {
                (Ok(Ok(outputs)), None) => Reference::Outputs(outputs.tensors),
                (Ok(Ok(_)), Some(expected)) => Reference::Broken(format!(
                    "the case expects the rejection `{expected}`, but the reference runs it"
                )),
                (Ok(Err(ConformanceError::Device(error))), expected) => {
                    rejected(&error, expected.as_ref())
                }
                (Ok(Err(other)), _) => Reference::Broken(format!("malformed case: {other}")),
                (Err(panic), _) => Reference::Broken(format!("the reference panicked: {panic}")),
            }
        })
    }

    /// Why the case cannot run at all (a missing input tensor, a bad strategy name), if it cannot:
    /// a broken case, rather than one the reference rejects as it expects.
    pub fn malformed(&self, reference_device: &dyn Device) -> Option<&str> {
        match self.reference(reference_device) {
            Reference::Broken(message) => Some(message),
            _ => None,
        }
    }

    /// `rejected: <error>` when the reference rejects a case that expects outputs (an invalid
    /// layout in a replay file, say).
    pub fn unexpected_rejection(&self, reference_device: &dyn Device) -> Option<&str> {
        match self.reference(reference_device) {
            Reference::Unexpected(message) => Some(message),
            _ => None,
        }
    }

    /// The reference outputs of this case (golden, or the reference device's); `Err` when the
    /// reference rejects the case or the case is malformed.
    pub fn reference_outputs(
        &self,
        reference_device: &dyn Device,
    ) -> std::result::Result<&BTreeMap<String, HostTensor>, String> {
        match self.reference(reference_device) {
            Reference::Outputs(outputs) => Ok(outputs),
            Reference::Rejected { message, .. } => {
                Err(format!("the reference rejects the case: {message}"))
            }
            Reference::Unexpected(message) | Reference::Broken(message) => Err(message.clone()),
        }
    }
}

/// What a rejection by the reference means for a case that expects `expected` (or outputs).
fn rejected(error: &Error, expected: Option<&ExpectedError>) -> Reference {
    let message = error.to_string();
    match (ExpectedError::of(error), expected) {
        (Some(kind), Some(expected)) if kind == *expected => Reference::Rejected {
            error: kind,
            message,
        },
        (_, Some(expected)) => Reference::Broken(format!(
            "the case expects the rejection `{expected}`, but the reference says `{message}`"
        )),
        (Some(kind), None) => Reference::Unexpected(format!(
            "rejected: {message} (the case expects outputs; if the rejection is intended, the case \
             says expected.error = \"{kind}\")"
        )),
        (None, None) => Reference::Broken(format!("the reference fails: {message}")),
    }
}

/// Every case of `op` at `size`, wrapped for the suite.
pub fn case_entries(op: Op, size: Size) -> Vec<Arc<CaseEntry>> {
    cases::cases(op, size)
        .into_iter()
        .map(CaseEntry::new)
        .collect()
}

/// What a trial checks.
#[derive(Clone, Debug)]
pub enum Subject {
    /// One op on one case.
    Case(Arc<CaseEntry>),
    /// One end-to-end property.
    Property(Property),
}

/// One trial: a backend and a case or property.
#[derive(Clone, Debug)]
pub struct Trial {
    /// The backend under test.
    pub backend: Backend,
    /// The op name, or [`PROPERTIES`].
    pub group: String,
    /// The case name, or the property name.
    pub case: String,
    /// What the trial checks.
    pub subject: Subject,
    /// Why the trial does not run, if it does not.
    pub skip: Option<Skip>,
    /// Whether the backend is required, so that a skip is a failure.
    pub required: bool,
}

impl Trial {
    /// `<backend>::<op>::<case>` or `<backend>::properties::<property>`.
    pub fn name(&self) -> String {
        format!("{}::{}::{}", self.backend.name, self.group, self.case)
    }

    /// The name with the skip reason in front when the trial does not run
    /// (`[skipped: wgpu: not compiled into this build] wgpu::argmax::f32::1x7`,
    /// `[unsupported: dtype bf16] wgpu::softmax::bf16::3x5`).
    pub fn display_name(&self) -> String {
        match (&self.skip, self.required) {
            (Some(Skip::Unavailable(reason)), false) => {
                format!("[skipped: {}: {reason}] {}", self.backend.name, self.name())
            }
            (Some(Skip::Unsupported(what)), _) => format!("[unsupported: {what}] {}", self.name()),
            _ => self.name(),
        }
    }

    /// Whether the trial will be skipped rather than run (a required backend's absence runs, and
    /// fails).
    pub fn is_skipped(&self) -> bool {
        match &self.skip {
            Some(Skip::Unavailable(_)) => !self.required,
            Some(Skip::Unsupported(_)) => true,
            None => false,
        }
    }

    /// The op of a case trial.
    pub fn op(&self) -> Option<Op> {
        match &self.subject {
            Subject::Case(entry) => Some(entry.case.op()),
            Subject::Property(_) => None,
        }
    }

    fn context(&self) -> String {
        match &self.subject {
            Subject::Case(_) => format!(
                "backend {}, op {}, case {}",
                self.backend.name, self.group, self.case
            ),
            Subject::Property(_) => {
                format!("backend {}, property {}", self.backend.name, self.case)
            }
        }
    }
}

/// What to run.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The ops whose cases run, in this order.
    pub ops: Vec<Op>,
    /// Whether the end-to-end properties run (after the ops).
    pub properties: bool,
    /// Only trials whose name contains this.
    pub filter: Option<String>,
}

impl Plan {
    /// Every op and every property.
    pub fn everything() -> Self {
        Plan {
            ops: Op::ALL.to_vec(),
            properties: true,
            filter: None,
        }
    }
}

/// Progress of [`Suite::run_plan`], for a progress bar.
#[derive(Debug)]
pub enum Progress<'a> {
    /// This many more trials are planned (called once per op, as its cases are generated). Their
    /// sum is [`Suite::count_trials`], which a progress bar can ask for before the run.
    Planned(usize),
    /// A trial starts.
    Started(&'a Trial),
    /// A trial ended.
    Finished(&'a TrialResult),
}

/// The backends under test, the reference device and the case size.
#[derive(Clone, Debug)]
pub struct Suite {
    /// The backends under test, in report order.
    pub backends: Vec<Backend>,
    /// The oracle: the device expected outputs are computed on (the reference device, never one
    /// of the devices under test).
    pub reference: Arc<dyn Device>,
    /// The size of the generated cases and of the property checks.
    pub size: Size,
    /// Names of the backends whose absence is a failure.
    pub required: BTreeSet<String>,
}

impl Suite {
    /// A suite over `backends`, with the reference device as the oracle.
    pub fn new(backends: Vec<Backend>, size: Size) -> Result<Self> {
        let reference: Arc<dyn Device> = Arc::new(specula_reference::ReferenceDevice::new());
        Ok(Suite {
            backends,
            reference,
            size,
            required: BTreeSet::new(),
        })
    }

    /// The oracle in one line: its name and driver.
    pub fn oracle(&self) -> String {
        let info = self.reference.info();
        format!("{} ({})", info.name, info.driver)
    }

    /// Makes the absence of these backends a failure.
    pub fn with_required(mut self, required: BTreeSet<String>) -> Self {
        self.required = required;
        self
    }

    fn trial(&self, backend: &Backend, group: &str, case: &str, subject: Subject) -> Trial {
        let skip = match &backend.status {
            Err(reason) => Some(Skip::Unavailable(reason.clone())),
            Ok(device) => match &subject {
                Subject::Case(entry) => unsupported(device.as_ref(), &entry.case),
                Subject::Property(property) => property
                    .missing_capability(device.as_ref())
                    .map(|what| Skip::Unsupported(what.to_owned())),
            },
        };
        Trial {
            backend: backend.clone(),
            group: group.to_owned(),
            case: case.to_owned(),
            subject,
            skip,
            required: self.required.contains(&backend.name),
        }
    }

    /// One trial per backend × case, backend-major (every case on the first backend, then the
    /// next).
    pub fn case_trials(&self, entries: &[Arc<CaseEntry>]) -> Vec<Trial> {
        let mut trials = Vec::with_capacity(entries.len() * self.backends.len());
        for backend in &self.backends {
            for entry in entries {
                let op = entry.case.op();
                let subject = Subject::Case(entry.clone());
                trials.push(self.trial(backend, op.name(), &entry.case.name, subject));
            }
        }
        trials
    }

    /// One trial per backend × end-to-end property.
    pub fn property_trials(&self) -> Vec<Trial> {
        let props = properties::properties();
        let mut trials = Vec::with_capacity(props.len() * self.backends.len());
        for backend in &self.backends {
            for property in &props {
                let subject = Subject::Property(*property);
                trials.push(self.trial(backend, PROPERTIES, property.name, subject));
            }
        }
        trials
    }

    /// Every trial of `plan` (generating every case up front; [`Suite::run_plan`] generates them
    /// one op at a time instead).
    pub fn trials(&self, plan: &Plan) -> Vec<Trial> {
        let mut trials = Vec::new();
        for &op in &plan.ops {
            trials.extend(self.case_trials(&case_entries(op, self.size)));
        }
        if plan.properties {
            trials.extend(self.property_trials());
        }
        trials.retain(|t| plan_keeps(plan, t));
        trials
    }

    /// Runs one trial.
    pub fn run(&self, trial: &Trial) -> Outcome {
        match &trial.skip {
            Some(Skip::Unavailable(reason)) if trial.required => {
                return Outcome::Failed(format!(
                    "{}: {} is required ({}) but unavailable: {reason}",
                    trial.context(),
                    trial.backend.name,
                    crate::backends::REQUIRE_VAR
                ));
            }
            Some(Skip::Unavailable(reason)) => {
                return Outcome::Skipped(format!("{}: {reason}", trial.backend.name));
            }
            Some(Skip::Unsupported(what)) => {
                return Outcome::Skipped(format!("{}: unsupported {what}", trial.backend.name));
            }
            None => {}
        }
        let Some(device) = trial.backend.device() else {
            return Outcome::Failed(format!("{}: no device", trial.context()));
        };
        let outcome = match &trial.subject {
            Subject::Case(entry) => self.check_case(device.as_ref(), entry).0,
            Subject::Property(property) => match catch(|| (property.check)(device, self.size)) {
                Ok(Ok(())) => Outcome::Passed,
                Ok(Err(message)) => Outcome::Failed(message),
                Err(panic) => Outcome::Failed(format!("panicked: {panic}")),
            },
        };
        match outcome {
            Outcome::Failed(message) => Outcome::Failed(format!("{}: {message}", trial.context())),
            other => other,
        }
    }

    /// Runs one trial and times it.
    pub fn run_timed(&self, trial: &Trial) -> TrialResult {
        let start = Instant::now();
        let outcome = self.run(trial);
        TrialResult {
            name: trial.name(),
            backend: trial.backend.name.clone(),
            group: trial.group.clone(),
            case: trial.case.clone(),
            outcome,
            seconds: start.elapsed().as_secs_f64(),
        }
    }

    /// Runs `entry` on `device` and checks it against the reference: the outcome (without the
    /// trial's context) and the outputs the device produced, if it produced any.
    pub fn check_case(&self, device: &dyn Device, entry: &CaseEntry) -> (Outcome, Option<Outputs>) {
        let actual = catch(|| crate::cases::run_case(device, &entry.case));
        let reference = entry.reference(self.reference.as_ref());
        let op = entry.case.op();
        match (actual, reference) {
            (Err(panic), _) => (Outcome::Failed(format!("panicked: {panic}")), None),
            (
                Ok(Err(error)),
                Reference::Rejected {
                    error: expected,
                    message,
                },
            ) => {
                let outcome = match &error {
                    ConformanceError::Device(e)
                        if ExpectedError::of(e).as_ref() == Some(expected) =>
                    {
                        Outcome::Passed
                    }
                    _ => Outcome::Failed(format!(
                        "error `{error}`, but the reference rejects the case with `{message}` ({expected})"
                    )),
                };
                (outcome, None)
            }
            (Ok(Err(error)), Reference::Unexpected(message) | Reference::Broken(message)) => (
                Outcome::Failed(format!("{message}; this backend: {error}")),
                None,
            ),
            (Ok(Err(error)), _) => (Outcome::Failed(format!("error: {error}")), None),
            (Ok(Ok(outputs)), Reference::Rejected { message, .. }) => (
                Outcome::Failed(format!(
                    "ran without error, but the reference rejects the case with `{message}`"
                )),
                Some(outputs),
            ),
            (Ok(Ok(outputs)), Reference::Unexpected(message) | Reference::Broken(message)) => {
                (Outcome::Failed(message.clone()), Some(outputs))
            }
            (Ok(Ok(outputs)), Reference::Outputs(expected)) => {
                let mut problems = Vec::new();
                if !outputs.guard_violations.is_empty() {
                    problems.push(guard_message(&outputs));
                }
                let width = entry.case.params.reduction_width();
                if let Err(mismatch) = compare_outputs(op, width, expected, &outputs.tensors) {
                    problems.push(format!("mismatch: {mismatch}"));
                }
                let outcome = match problems.is_empty() {
                    true => Outcome::Passed,
                    false => Outcome::Failed(problems.join("; ")),
                };
                (outcome, Some(outputs))
            }
        }
    }

    /// How many trials [`Suite::run_plan`] runs for `plan` (skipped ones included), without keeping
    /// any case: each op's cases are generated, counted and dropped before the next op's, so this
    /// costs one generation of the cases and the memory of one op's.
    pub fn count_trials(&self, plan: &Plan) -> usize {
        let mut total = 0;
        for &op in &plan.ops {
            let entries = case_entries(op, self.size);
            total += self
                .case_trials(&entries)
                .iter()
                .filter(|t| plan_keeps(plan, t))
                .count();
        }
        if plan.properties {
            total += self
                .property_trials()
                .iter()
                .filter(|t| plan_keeps(plan, t))
                .count();
        }
        total
    }

    /// Runs `plan`: one op at a time (its cases are generated, each case is run on every backend
    /// and then dropped), then the properties; returns the report.
    pub fn run_plan(&self, plan: &Plan, on_progress: &mut dyn FnMut(Progress<'_>)) -> Report {
        let start = Instant::now();
        let mut report = Report::new(&self.backends, self.size, &self.oracle());
        for &op in &plan.ops {
            let batches: Vec<Vec<Trial>> = case_entries(op, self.size)
                .into_iter()
                .map(|entry| {
                    let mut trials = self.case_trials(&[entry]);
                    trials.retain(|t| plan_keeps(plan, t));
                    trials
                })
                .collect();
            on_progress(Progress::Planned(batches.iter().map(Vec::len).sum()));
            // Case-major, so a case and its reference outputs are freed once every backend ran it.
            for trials in batches {
                for trial in &trials {
                    self.run_reporting(trial, &mut report, on_progress);
                }
            }
        }
        if plan.properties {
            let mut trials = self.property_trials();
            trials.retain(|t| plan_keeps(plan, t));
            on_progress(Progress::Planned(trials.len()));
            for trial in &trials {
                self.run_reporting(trial, &mut report, on_progress);
            }
        }
        report.seconds = start.elapsed().as_secs_f64();
        report
    }

    fn run_reporting(
        &self,
        trial: &Trial,
        report: &mut Report,
        on_progress: &mut dyn FnMut(Progress<'_>),
    ) {
        on_progress(Progress::Started(trial));
        let result = self.run_timed(trial);
        on_progress(Progress::Finished(&result));
        report.push(result);
    }
}

fn plan_keeps(plan: &Plan, trial: &Trial) -> bool {
    plan.filter
        .as_ref()
        .is_none_or(|filter| trial.name().contains(filter.as_str()))
}

/// Why `device` cannot run `case`, if its capabilities exclude it: the first float dtype among the
/// case's inputs it does not support for the op, or logits rows.
pub(crate) fn unsupported(device: &dyn Device, case: &Case) -> Option<Skip> {
    let capabilities = device.capabilities();
    let op = case.op();
    if case.params.logits() && !capabilities.logits {
        return Some(Skip::Unsupported("logits rows".to_owned()));
    }
    if needs_processing(case) && !capabilities.processing {
        return Some(Skip::Unsupported("logits processing".to_owned()));
    }
    if op.is_sharded() && !capabilities.sharded {
        return Some(Skip::Unsupported("sharded rows".to_owned()));
    }
    let sliced =
        matches!(&case.params, crate::cases::CaseParams::ProcessLogits(p) if p.slice.is_some());
    if sliced && !capabilities.sliced_processing {
        return Some(Skip::Unsupported("logits processing of a slice".to_owned()));
    }
    case.inputs
        .values()
        .map(|t| t.dtype)
        .find(|&dtype| dtype.is_float() && !capabilities.supports(op, dtype))
        .map(|dtype| Skip::Unsupported(format!("dtype {dtype}")))
}

/// Whether `case` uses logits processing (`docs/semantics.md` §4c): `process_logits` itself, a
/// sampling op's `fallback` input, or `update_state`'s token counts.
fn needs_processing(case: &Case) -> bool {
    case.op() == specula_backend_api::Op::ProcessLogits
        || ["fallback", "token_counts"]
            .iter()
            .any(|name| case.inputs.contains_key(*name))
}

/// Describes every guard region an op overwrote.
fn guard_message(outputs: &Outputs) -> String {
    let mut by_tensor: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for violation in &outputs.guard_violations {
        by_tensor
            .entry(violation.tensor.as_str())
            .or_default()
            .push(violation.element);
    }
    let parts: Vec<String> = by_tensor
        .into_iter()
        .map(|(tensor, elements)| {
            let len = outputs.tensors.get(tensor).map_or(0, HostTensor::len);
            let first = elements[0];
            let place = if first < 0 {
                format!("{} before the start", -first)
            } else {
                format!("{} past the end", first - len as i64 + 1)
            };
            format!(
                "`{tensor}` element {first} ({place} of its {len}-element window; {} element{} overwritten)",
                elements.len(),
                if elements.len() == 1 { "" } else { "s" }
            )
        })
        .collect();
    format!("wrote outside its output: {}", parts.join(", "))
}

/// Runs `f`, turning a panic into its message.
pub fn catch<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic without a message".to_owned()
        }
    })
}
