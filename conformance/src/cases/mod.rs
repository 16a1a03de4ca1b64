//! Case generators, one module per op: generated cases (deterministic from a seed), golden cases
//! written by hand from the contract (`golden::…`, with expected outputs), and hostile cases
//! (`hostile::…`: garbage device contents that must give the documented fallbacks).
//!
//! Generated shapes include 1, primes, non-multiples of every workgroup size, several workgroups,
//! the real vocabularies 32000 / 128256 / 151936, batches 1 … 256, `S` from 1 to 8, every slot kind
//! mixed, every strategy and the dtypes f32 / f16 / bf16. Names are stable: the same op and size
//! always give the same cases, names and bytes.

mod accept_logprobs;
mod argmax;
mod build_output_layout;
mod build_sampling_params;
mod gather_next_token;
pub mod generate;
mod ngram_match;
mod softmax;
mod top_k_top_p_sample;
mod top_p_candidates;
mod update_state;
mod verify_draft_tokens;

use specula_backend_api::Op;

use crate::case::Case;

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

/// Every case of `op` at `size`, in a stable order with unique names.
pub fn cases(op: Op, size: Size) -> Vec<Case> {
    match op {
        Op::BuildOutputLayout => build_output_layout::cases(size),
        Op::GatherNextToken => gather_next_token::cases(size),
        Op::BuildSamplingParams => build_sampling_params::cases(size),
        Op::Argmax => argmax::cases(size),
        Op::Softmax => softmax::cases(size),
        Op::TopKTopPSample => top_k_top_p_sample::cases(size),
        Op::TopPCandidates => top_p_candidates::cases(size),
        Op::VerifyDraftTokens => verify_draft_tokens::cases(size),
        Op::UpdateState => update_state::cases(size),
        Op::NgramMatch => ngram_match::cases(size),
        Op::AcceptLogprobs => accept_logprobs::cases(size),
        Op::Memory => Vec::new(),
    }
}

/// `(rows, vocab, label)` of the row ops (`argmax`, `softmax`, sampling, candidates): 1, primes,
/// non-multiples of any workgroup size, several workgroups; the real vocabularies at one or two
/// rows in Quick and at batches up to 256 in Full.
pub(crate) fn row_shapes(size: Size) -> Vec<(usize, usize)> {
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
pub(crate) fn full_shape_for(dtype: specula_backend_api::DType, rows: usize, vocab: usize) -> bool {
    use specula_backend_api::DType;
    match (rows, vocab) {
        (256, 32000) => dtype == DType::F32,
        (64, 128256) => dtype == DType::F16,
        (128, 151936) => dtype == DType::BF16,
        (256, 151936) => dtype == DType::BF16,
        _ => true,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashSet;
    use std::time::Instant;

    use specula_backend_api::Op;
    use specula_backend_cpu::CpuDevice;

    use super::*;
    use crate::compare::compare_outputs;
    use crate::exec::run_case;

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
    fn cases_are_deterministic() {
        for op in [Op::VerifyDraftTokens, Op::TopKTopPSample, Op::NgramMatch] {
            assert_eq!(cases(op, Size::Quick), cases(op, Size::Quick), "{op}");
        }
    }

    /// Every Quick case passes host validation on the CPU, writes nothing outside its outputs and
    /// gives the same outputs twice; prints the time of the whole CPU run.
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
            for case in &cases {
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

    use super::*;
    use crate::exec::run_case;

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
            for case in &cases {
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
