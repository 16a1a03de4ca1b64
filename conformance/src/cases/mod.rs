//! Case generators, one module per op: generated cases (deterministic from a seed), golden cases
//! written by hand from the contract (`golden::…`, with expected outputs), and hostile cases
//! (`hostile::…`: garbage device contents that must give the documented fallbacks).
//!
//! Generated shapes include 1, primes, non-multiples of every workgroup size, several workgroups,
//! the real vocabularies 32000 / 128256 / 151936, batches 1 … 256, `S` from 1 to 8, every slot kind
//! mixed, every strategy and the dtypes f32 / f16 / bf16. Names are stable: the same op and size
//! always give the same cases, names and bytes.

pub mod generate;
mod invalid;
pub mod sharded_rows;

use serde::{Deserialize, Serialize};
use specula_backend_api::{DType, Op};

use std::collections::BTreeMap;

use specula_backend_api::Device;

use crate::case::ExpectedError;
use crate::exec::{CaseInputs, OpCase, Outputs, Runner};
use crate::tensor::HostTensor;

/// Declares the case module of every op, [`CaseParams`] and the registry, from the op table:
/// an op without a case module (`cases/<op>.rs` with `Params`, `cases`) does not compile.
macro_rules! case_registry {
    ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        $(pub mod $name;)*

        /// The op of a case and its scalar parameters (the JSON header of a case file:
        /// `{"op": "argmax", "rows": 2, "vocab": 3}`). One variant per op of the op table.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "op", rename_all = "snake_case")]
        pub enum CaseParams {
            $(
                #[doc = concat!("`", stringify!($name), "` (its parameters: [`", stringify!($name), "::Params`]).")]
                $variant($name::Params),
            )*
        }

        $(
            impl From<$name::Params> for CaseParams {
                fn from(params: $name::Params) -> Self {
                    CaseParams::$variant(params)
                }
            }
        )*

        impl CaseParams {
            /// The op these parameters are for.
            pub fn op(&self) -> Op {
                match self {
                    $(CaseParams::$variant(_) => Op::$variant,)*
                }
            }

            fn op_case(&self) -> &dyn OpCase {
                match self {
                    $(CaseParams::$variant(params) => params,)*
                }
            }
        }

        /// Every case of `op` at `size`, in a stable order with unique names. `hostile::` cases
        /// hold device contents that host validation rejects, so they run device-only. The
        /// `invalid::` cases come last: every device must reject them on the host.
        pub fn cases(op: Op, size: Size) -> Vec<Case> {
            let cases = match op {
                $(Op::$variant => $name::cases(size),)*
                Op::Memory => Vec::new(),
            };
            cases.into_iter().chain(invalid::cases(op)).map(mark_hostile).collect()
        }
    };
}

specula_backend_api::for_each_op!(case_registry);

/// One case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The name after the op in a trial name, e.g. `target_match::bs64_s6` or `f32::1x32000`.
    pub name: String,
    /// The op and its parameters.
    pub params: CaseParams,
    /// The input tensors by name (the in/out buffers' initial contents included).
    pub inputs: BTreeMap<String, HostTensor>,
    /// Hand-computed outputs (golden cases); otherwise the reference device's outputs are
    /// expected.
    pub expected: Option<BTreeMap<String, HostTensor>>,
    /// The error every device (the reference included) must reject the case with (`invalid::`
    /// cases); `None`: the case must run.
    pub expected_error: Option<ExpectedError>,
    /// The inputs hold hostile device contents that host validation would reject (negative
    /// lengths, slot rules broken): the case runs without host copies. Otherwise the host-side
    /// tensors (slot lengths, `top_p`, temperatures) are also passed as host copies, so that host
    /// validation runs as it does for a runner.
    pub device_only: bool,
    /// Inputs uploaded to another device than the one under test (a `DeviceMismatch` case).
    pub foreign: Vec<String>,
}

impl Case {
    /// A case without expected outputs.
    pub fn new(name: impl Into<String>, params: impl Into<CaseParams>) -> Self {
        Case {
            name: name.into(),
            params: params.into(),
            inputs: BTreeMap::new(),
            expected: None,
            expected_error: None,
            device_only: false,
            foreign: Vec::new(),
        }
    }

    /// Marks the inputs as device-only contents (no host copies, no host validation).
    pub fn device_only(mut self) -> Self {
        self.device_only = true;
        self
    }

    /// Makes this an `invalid::` case: every device must reject it with `error`.
    pub fn rejects(mut self, error: ExpectedError) -> Self {
        self.expected_error = Some(error);
        self
    }

    /// Uploads input `name` to another device than the one under test.
    pub fn foreign(mut self, name: &str) -> Self {
        self.foreign.push(name.to_owned());
        self
    }

    /// Adds an input tensor.
    pub fn with(mut self, name: &str, tensor: HostTensor) -> Self {
        self.inputs.insert(name.to_owned(), tensor);
        self
    }

    /// Adds an expected output (making this a golden case).
    pub fn expect(mut self, name: &str, tensor: HostTensor) -> Self {
        self.expected
            .get_or_insert_with(BTreeMap::new)
            .insert(name.to_owned(), tensor);
        self
    }

    /// The op of this case.
    pub fn op(&self) -> Op {
        self.params.op()
    }
}

impl Case {
    /// Checks every input tensor against the op's table ([`CaseParams::tensors`]): each declared
    /// tensor present (unless optional) with its dtype and element count, and no other tensor.
    /// `Err` names the tensor.
    pub fn check_tensors(&self) -> Result<(), String> {
        let specs = self.params.tensors();
        for spec in &specs {
            match self.inputs.get(spec.name) {
                None if spec.optional => {}
                None => return Err(format!("tensor `{}` is missing", spec.name)),
                Some(tensor) => {
                    if let Some(why) = spec.mismatch(tensor) {
                        return Err(format!("tensor `{}` {why}", spec.name));
                    }
                }
            }
        }
        match self
            .inputs
            .keys()
            .find(|n| !specs.iter().any(|s| s.name == n.as_str()))
        {
            Some(extra) => Err(format!("tensor `{extra}` is not an input of {}", self.op())),
            None => Ok(()),
        }
    }

    /// What a [`Runner`] reads of the case.
    pub(crate) fn inputs_view(&self) -> CaseInputs<'_> {
        CaseInputs {
            name: &self.name,
            op: self.op(),
            inputs: &self.inputs,
            foreign: &self.foreign,
            device_only: self.device_only,
        }
    }
}

/// Runs `case` on `device` and returns its outputs and any guard violation.
pub fn run_case(device: &dyn Device, case: &Case) -> crate::Result<Outputs> {
    let mut runner = Runner::new(device, case.inputs_view());
    case.params.run(&mut runner)?;
    runner.finish()
}

fn mark_hostile(case: Case) -> Case {
    match case.name.starts_with("hostile::") {
        true => case.device_only(),
        false => case,
    }
}

impl CaseParams {
    /// The length of the rows a float output is reduced over (the vocabulary of `softmax` and
    /// `accept_logprobs`; 1 for the other ops, whose outputs are exact).
    pub fn reduction_width(&self) -> usize {
        self.op_case().reduction_width()
    }

    /// Whether the case samples from logits rows (`docs/semantics.md` §4b) rather than
    /// probabilities.
    pub fn logits(&self) -> bool {
        match self {
            CaseParams::TopKTopPSample(p) => p.logits,
            CaseParams::TopPCandidates(p) => p.logits,
            CaseParams::VerifyDraftTokens(p) => p.logits,
            CaseParams::ProcessLogits(p) => p.logits,
            CaseParams::ShardKey(p) => p.shard.logits,
            CaseParams::ShardRecords(p) => p.shard.logits,
            CaseParams::ShardHistogram(p) => p.shard.logits,
            CaseParams::ShardWalk(p) => p.shard.logits,
            CaseParams::ShardExpSum(_) => true,
            _ => false,
        }
    }

    /// The op's input tensors (names, dtypes, element counts) for these parameters.
    pub fn tensors(&self) -> Vec<crate::case::TensorSpec> {
        self.op_case().tensors()
    }

    /// Runs the op of these parameters through `runner`.
    pub(crate) fn run(&self, runner: &mut Runner<'_>) -> crate::Result<()> {
        self.op_case().run(runner)
    }
}

/// How big the generated cases are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Size {
    /// Small shapes that still cover every edge (1, primes, several workgroups, every slot kind,
    /// every strategy and dtype), plus each real vocabulary at a small batch: for CI and for slow
    /// software devices.
    Quick,
    /// Adds the real vocabularies (32000, 128256, 151936) at batches up to 256.
    Full,
}

/// `(rows, vocab)` of the row ops (`argmax`, `softmax`, sampling, candidates): 1, primes,
/// non-multiples of any workgroup size, several workgroups; the real vocabularies at one or two
/// rows in Quick and at batches up to 256 in Full.
fn row_shapes(size: Size) -> Vec<(usize, usize)> {
    let mut shapes = vec![
        (1, 1),
        (1, 2),
        (3, 7),
        (5, 97),
        (17, 257),
        (2, 256),
        (4, 1000),
        (3, 1025),
        (64, 129),
        (8, 4099),
        (1, 32000),
        (2, 128256),
        (1, 151936),
    ];
    if size == Size::Full {
        shapes.extend([(256, 32000), (64, 128256), (128, 151936), (256, 151936)]);
    }
    shapes
}

/// Whether a Full-only shape is too big for a dtype (keeps Full's memory in check: the largest
/// shapes are generated in one dtype each).
fn full_shape_for(dtype: DType, rows: usize, vocab: usize) -> bool {
    match (rows, vocab) {
        (256, 32000) => dtype == DType::F32,
        (64, 128256) => dtype == DType::F16,
        (128, 151936) => dtype == DType::BF16,
        (256, 151936) => dtype == DType::BF16,
        _ => true,
    }
}

/// Where a generated case of a row op starts: a dtype, a shape of [`row_shapes`] and a generator
/// seeded for both.
pub(crate) struct RowGen {
    /// The position of the shape in [`row_shapes`].
    pub index: usize,
    /// The dtype of the float input.
    pub dtype: DType,
    /// Rows.
    pub rows: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// The generator of this dtype and shape.
    pub rng: generate::Rng,
}

impl RowGen {
    /// The case name, `{dtype}::{rows}x{vocab}`.
    pub fn name(&self) -> String {
        format!("{}::{}x{}", self.dtype, self.rows, self.vocab)
    }
}

/// The generated cases of a row op in `dtype`: every shape of [`row_shapes`] (the largest Full
/// shapes in one dtype each), with a generator of the stream `{stream}/{dtype}` seeded by the
/// shape.
pub(crate) fn row_gens(size: Size, stream: &str, dtype: DType) -> Vec<RowGen> {
    let stream = format!("{stream}/{dtype}");
    row_shapes(size)
        .into_iter()
        .enumerate()
        .filter(|&(_, (rows, vocab))| full_shape_for(dtype, rows, vocab))
        .map(|(index, (rows, vocab))| RowGen {
            index,
            dtype,
            rows,
            vocab,
            rng: generate::Rng::for_rows(&stream, rows, vocab),
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashSet;
    use std::time::Instant;

    use specula_backend_api::Op;
    use specula_backend_cpu::CpuDevice;

    use super::run_case;
    use super::*;
    use crate::compare::compare_outputs;

    #[test]
    fn golden_cases_pass_on_the_cpu() {
        let cpu = CpuDevice::new().unwrap();
        let mut failures = Vec::new();
        for op in Op::ALL {
            for case in cases(op, Size::Quick) {
                let Some(expected) = &case.expected else {
                    continue;
                };
                assert!(case.name.starts_with("golden::"), "{op}::{}", case.name);
                if case.params.logits() && !specula_backend_api::Device::capabilities(&cpu).logits {
                    continue;
                }
                let out =
                    run_case(&cpu, &case).unwrap_or_else(|e| panic!("{op}::{}: {e}", case.name));
                assert!(out.guard_violations.is_empty(), "{op}::{}", case.name);
                let width = case.params.reduction_width();
                if let Err(m) = compare_outputs(op, width, expected, &out.tensors) {
                    failures.push(format!("{op}::{}: {m}", case.name));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn names_are_unique_and_every_op_has_every_kind_of_case() {
        for size in [Size::Quick] {
            for op in Op::ALL {
                let cases = cases(op, size);
                let mut names = HashSet::new();
                for case in &cases {
                    assert_eq!(case.op(), op, "{}", case.name);
                    assert!(
                        names.insert(case.name.clone()),
                        "{op}: duplicate {}",
                        case.name
                    );
                    assert!(
                        case.name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "_:.-".contains(c)),
                        "{op}: odd name {}",
                        case.name
                    );
                }
                let golden = cases
                    .iter()
                    .filter(|c| c.name.starts_with("golden::"))
                    .count();
                let hostile = cases
                    .iter()
                    .filter(|c| c.name.starts_with("hostile::"))
                    .count();
                let generated = cases.len() - golden - hostile;
                assert!(
                    golden > 0 && hostile > 0 && generated > 0,
                    "{op}: {golden} golden, {hostile} hostile, {generated} generated"
                );
                assert!(
                    cases
                        .iter()
                        .all(|c| c.expected.is_some() == c.name.starts_with("golden::"))
                );
            }
        }
    }

    #[test]
    fn every_case_holds_the_tensors_of_its_op() {
        for op in Op::ALL {
            for case in cases(op, Size::Quick) {
                if case.expected_error.is_none() {
                    let checked = case.check_tensors();
                    assert_eq!(checked, Ok(()), "{op}::{}", case.name);
                }
            }
        }
    }

    #[test]
    fn cases_are_deterministic() {
        for op in [Op::VerifyDraftTokens, Op::TopKTopPSample, Op::NgramMatch] {
            assert_eq!(cases(op, Size::Quick), cases(op, Size::Quick), "{op}");
        }
    }

    /// Every Quick case but the `invalid::` ones (which must be rejected) passes host validation
    /// on the CPU, writes nothing outside its outputs and gives the same outputs twice; prints
    /// the time of the whole CPU run.
    #[test]
    fn every_quick_case_runs_on_the_cpu() {
        let cpu = CpuDevice::new().unwrap();
        let start = Instant::now();
        let mut total_cases = 0;
        let mut bytes = 0;
        for op in Op::ALL {
            let op_start = Instant::now();
            let cases = cases(op, Size::Quick);
            let generated = op_start.elapsed();
            let runnable = |c: &&Case| {
                c.expected_error.is_none()
                    && (specula_backend_api::Device::capabilities(&cpu).logits
                        || !c.params.logits())
            };
            for case in cases.iter().filter(runnable) {
                bytes += case.inputs.values().map(|t| t.bytes.len()).sum::<usize>();
                let a = run_case(&cpu, case).unwrap_or_else(|e| panic!("{op}::{}: {e}", case.name));
                assert!(
                    a.guard_violations.is_empty(),
                    "{op}::{}: {:?}",
                    case.name,
                    a.guard_violations
                );
                let b = run_case(&cpu, case).unwrap();
                assert_eq!(
                    a.tensors, b.tensors,
                    "{op}::{} is not deterministic",
                    case.name
                );
            }
            total_cases += cases.len();
            eprintln!(
                "{op}: {} cases, generated in {generated:?}, total {:?}",
                cases.len(),
                op_start.elapsed()
            );
        }
        eprintln!(
            "all Quick cases: {total_cases} cases, {:.1} MB of inputs, {:?} (generation + 2 CPU runs)",
            bytes as f64 / 1e6,
            start.elapsed()
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod full_tests {
    use std::time::Instant;

    use specula_backend_api::Op;
    use specula_backend_cpu::CpuDevice;

    use super::run_case;
    use super::*;

    /// Generates and runs every Full case on the CPU, one op at a time (minutes; run with
    /// `--ignored`).
    #[test]
    #[ignore]
    fn every_full_case_runs_on_the_cpu() {
        let cpu = CpuDevice::new().unwrap();
        for op in Op::ALL {
            let start = Instant::now();
            let cases = cases(op, Size::Full);
            let generated = start.elapsed();
            let bytes: usize = cases
                .iter()
                .flat_map(|c| c.inputs.values())
                .map(|t| t.bytes.len())
                .sum();
            for case in cases.iter().filter(|c| {
                c.expected_error.is_none()
                    && (specula_backend_api::Device::capabilities(&cpu).logits
                        || !c.params.logits())
            }) {
                let out =
                    run_case(&cpu, case).unwrap_or_else(|e| panic!("{op}::{}: {e}", case.name));
                assert!(out.guard_violations.is_empty(), "{op}::{}", case.name);
            }
            eprintln!(
                "{op}: {} cases, {:.0} MB, generated in {generated:?}, run in {:?}",
                cases.len(),
                bytes as f64 / 1e6,
                start.elapsed() - generated
            );
        }
    }
}
