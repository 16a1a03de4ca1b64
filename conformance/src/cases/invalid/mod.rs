//! `invalid::` cases: arguments every device must reject on the host, before anything runs, with
//! the error of `docs/semantics.md` §6 (its kind and the argument it names; the suite compares
//! both). Validation is the backend-api front's, so every backend — the reference included — must
//! give the same rejection.
//!
//! One module per op, named as the op: each builds a small valid baseline over the batch below and
//! breaks exactly one thing per case — a tensor of another dtype or length, an input uploaded to
//! another device ([`Case::foreign`]), a scalar parameter out of range, a host-side value the
//! contract forbids, or sizes whose product overflows `usize` (huge dimensions over tiny buffers:
//! validation must fail on the product and never allocate).
//!
//! The baseline batch (`max_bsz` 4, `real_bsz` 3, `S` 3):
//!
//! | slot | kind | `this_time` | `encoder` | output rows |
//! |---|---|---|---|---|
//! | 0 | decode (last token + 2 drafts) | 3 | 0 | 3 |
//! | 1 | prefill | 5 | 5 | 1 |
//! | 2 | empty | 0 | 0 | 0 |
//! | 3 | beyond `real_bsz` | 0 | 0 | — |
//!
//! so `T_out` = 4, 8 packed input tokens, and an output-row capacity `real_bsz · S` of 9.

use specula_backend_api::abi::{MAX_HOST_LENGTH, MAX_VOCAB};
use specula_backend_api::{DType, Element, Op};

use super::generate::{Batch, Rng, dims, float_tensor, i32s, logit_row, prob_row};
use crate::case::ErrorKind::{DeviceMismatch, DtypeMismatch, InvalidArgument, ShapeMismatch};
use crate::case::{Dims, ErrorKind, ExpectedError};
use crate::cases::Case;
use crate::tensor::HostTensor;

/// Declares the module of every op and the registry from the op table: an op without an
/// `invalid/<op>.rs` (with `cases` and `baselines`) does not compile.
macro_rules! invalid_registry {
    ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        $(mod $name;)*

        /// Every `invalid::` case of `op`, in a stable order (none for [`Op::Memory`]: memory
        /// operations are checked by the `invalid_memory_arguments` property).
        pub fn cases(op: Op) -> Vec<Case> {
            match op {
                $(Op::$variant => $name::cases(),)*
                Op::Memory => Vec::new(),
            }
        }

        /// The valid baselines the `invalid::` cases of `op` break (each must run).
        #[cfg(test)]
        fn baselines(op: Op) -> Vec<Case> {
            match op {
                $(Op::$variant => $name::baselines(),)*
                Op::Memory => Vec::new(),
            }
        }
    };
}

/// The two entry points the registry calls, for a row op whose only shape parameter is the
/// vocabulary: `baselines` (`$make(VOCAB)`) and `cases` ([`vocab_op_cases`] of `$make`, the
/// broken tensors `$table` and the op's own cases `$extra`).
macro_rules! vocab_op_entries {
    ($make:ident, $table:expr, $extra:expr $(,)?) => {
        /// The valid call every case breaks.
        #[cfg(test)]
        pub(super) fn baselines() -> Vec<crate::cases::Case> {
            vec![$make(super::VOCAB)]
        }

        /// Every `invalid::` case of the op.
        pub(super) fn cases() -> Vec<crate::cases::Case> {
            super::vocab_op_cases($make, $table, $extra)
        }
    };
}

specula_backend_api::for_each_op!(invalid_registry);

/// Vocabulary of the baselines.
const VOCAB: usize = 8;
/// Row width of `gather_next_token`.
const HIDDEN: usize = 2;
/// Candidates per row of `top_p_candidates` and TOPP.
const CANDIDATES: usize = 4;
/// Top-K width of `accept_logprobs`.
const LOGPROBS_TOP_K: usize = 2;
/// Row length of `token_ids_all`.
const MAX_MODEL_LEN: usize = 16;
/// End tokens of `verify_draft_tokens` and `update_state`.
const END_TOKENS: [i32; 2] = [7, 6];

/// The baseline batch (see the module docs).
fn batch() -> Batch {
    Batch::new(dims(4, 3, 3), vec![3, 5, 0, 0], vec![0, 5, 0, 0])
}

/// `rows` f32 rows of width `vocab` made by `row`, from the generator of `stream` and the shape.
fn f32_rows(
    stream: &str,
    rows: usize,
    vocab: usize,
    row: fn(&mut Rng, usize) -> Vec<f32>,
) -> HostTensor {
    let mut rng = Rng::for_rows(stream, rows, vocab);
    let values: Vec<f32> = (0..rows).flat_map(|_| row(&mut rng, vocab)).collect();
    float_tensor(DType::F32, &[rows, vocab], &values)
}

/// `rows` f32 probability rows of width `vocab`.
fn prob_rows(rows: usize, vocab: usize) -> HostTensor {
    f32_rows("invalid/probs", rows, vocab, prob_row)
}

/// `rows` f32 logit rows of width `vocab`.
fn logit_rows(rows: usize, vocab: usize) -> HostTensor {
    f32_rows("invalid/logits", rows, vocab, logit_row)
}

/// `case` renamed `invalid::<what>`, which every device must reject with `kind` naming `arg`.
fn reject(what: &str, case: Case, kind: ErrorKind, arg: &str) -> Case {
    let mut case = case.rejects(ExpectedError::new(kind, arg));
    case.name = format!("invalid::{what}");
    case
}

/// `base` with input `name` replaced by zeros of `dtype` (as many elements):
/// `invalid::<name>_dtype_<dtype>`, a `DTypeMismatch` on `name`.
fn wrong_dtype(base: &Case, name: &str, dtype: DType) -> Case {
    let mut case = base.clone();
    if let Some(t) = case.inputs.get_mut(name) {
        *t = HostTensor {
            dtype,
            shape: t.shape.clone(),
            bytes: vec![0; t.len() * dtype.size_bytes()],
        };
    }
    reject(&format!("{name}_dtype_{dtype}"), case, DtypeMismatch, name)
}

/// `base` with input `name` cut or zero-extended to `len` elements (one-dimensional).
fn resized(base: &Case, name: &str, len: usize) -> Case {
    let mut case = base.clone();
    if let Some(t) = case.inputs.get_mut(name) {
        let size = t.dtype.size_bytes();
        t.bytes.resize(len * size, 0);
        t.shape = vec![len];
    }
    case
}

/// The element count of input `name` of `base` (0 when it has none).
fn len_of(base: &Case, name: &str) -> usize {
    base.inputs.get(name).map_or(0, HostTensor::len)
}

/// `invalid::<name>_short`: input `name` one element short, a `ShapeMismatch` on `name`.
fn too_short(base: &Case, name: &str) -> Case {
    let len = len_of(base, name).saturating_sub(1);
    let case = resized(base, name, len);
    reject(&format!("{name}_short"), case, ShapeMismatch, name)
}

/// `invalid::<name>_long`: input `name` one element long, a `ShapeMismatch` on `name`.
fn too_long(base: &Case, name: &str) -> Case {
    let case = resized(base, name, len_of(base, name) + 1);
    reject(&format!("{name}_long"), case, ShapeMismatch, name)
}

/// `invalid::<name>_empty`: input `name` without elements where at least one is needed (`E == 0`),
/// a `ShapeMismatch` on `name`.
fn emptied(base: &Case, name: &str) -> Case {
    let case = resized(base, name, 0);
    reject(&format!("{name}_empty"), case, ShapeMismatch, name)
}

/// `invalid::<name>_foreign`: input `name` uploaded to another device, a `DeviceMismatch`.
fn foreign(base: &Case, name: &str) -> Case {
    reject(
        &format!("{name}_foreign"),
        base.clone().foreign(name),
        DeviceMismatch,
        name,
    )
}

/// One way to break an input tensor of a valid baseline (see [`broken`]).
#[derive(Clone, Copy, Debug)]
enum Break {
    /// Zeros of another dtype ([`wrong_dtype`]).
    Dtype(DType),
    /// Zeros of another dtype in a tensor the runner also passes as a host copy: the case runs
    /// without host copies, since the runner cannot read the tensor as one ([`wrong_dtype`]).
    HostDtype(DType),
    /// One element short ([`too_short`]).
    Short,
    /// One element long ([`too_long`]).
    Long,
    /// No elements ([`emptied`]).
    Empty,
    /// Uploaded to another device ([`foreign`]).
    Foreign,
}

/// The `invalid::` cases of `base` with its inputs broken as `table` says (each input with each
/// of its breaks), in order.
fn broken(base: &Case, table: &[(&str, &[Break])]) -> Vec<Case> {
    let mut out = Vec::new();
    for &(name, breaks) in table {
        for &how in breaks {
            out.push(match how {
                Break::Dtype(dtype) => wrong_dtype(base, name, dtype),
                Break::HostDtype(dtype) => wrong_dtype(base, name, dtype).device_only(),
                Break::Short => too_short(base, name),
                Break::Long => too_long(base, name),
                Break::Empty => emptied(base, name),
                Break::Foreign => foreign(base, name),
            });
        }
    }
    out
}

/// `base` with entry `index` of input `name` (of element type `T`) set to `value`.
fn with_entry<T: Element>(base: &Case, name: &str, index: usize, value: T) -> Case {
    let mut case = base.clone();
    if let Some(t) = case.inputs.get_mut(name)
        && let Ok(mut values) = t.to_vec::<T>()
        && let Some(slot) = values.get_mut(index)
    {
        *slot = value;
        *t = HostTensor::new(&t.shape.clone(), &values);
    }
    case
}

/// `base` with entry `index` of input `name` set to `value`: the case `invalid::<what>`, which
/// every device must reject as an invalid argument naming `name`.
fn bad_entry<T: Element>(base: &Case, what: &str, name: &str, index: usize, value: T) -> Case {
    reject(
        what,
        with_entry(base, name, index, value),
        InvalidArgument,
        name,
    )
}

/// `V == 0` and `V > 2^20`, through `make(vocab)` (the baseline with another vocabulary).
fn vocab_cases(make: impl Fn(usize) -> Case) -> Vec<Case> {
    vec![
        reject("vocab_zero", make(0), InvalidArgument, "vocab"),
        reject(
            "vocab_above_2_pow_20",
            make(MAX_VOCAB + 1),
            InvalidArgument,
            "vocab",
        ),
    ]
}

/// Every `invalid::` case of a row op whose only shape parameter is the vocabulary, through
/// `make(vocab)` (its baseline with another vocabulary): the baseline `make(VOCAB)`'s tensors
/// broken as `table` says, then [`vocab_cases`], then the op's own `extra(&baseline)`.
fn vocab_op_cases(
    make: fn(usize) -> Case,
    table: &[(&str, &[Break])],
    extra: fn(&Case) -> Vec<Case>,
) -> Vec<Case> {
    let base = make(VOCAB);
    let mut out = broken(&base, table);
    out.extend(vocab_cases(make));
    out.extend(extra(&base));
    out
}

/// The slice cases of a sharded op, through `make(slice)` (the baseline with another slice):
/// `V == 0`, `V > 2^20`, and a slice that ends past the vocabulary.
fn slice_cases(make: impl Fn(crate::cases::sharded_rows::Slice) -> Case) -> Vec<Case> {
    use crate::cases::sharded_rows::Slice;
    vec![
        reject(
            "vocab_zero",
            make(Slice::new(0, 4, 0)),
            InvalidArgument,
            "vocab",
        ),
        reject(
            "vocab_above_2_pow_20",
            make(Slice::new(0, 4, MAX_VOCAB + 1)),
            InvalidArgument,
            "vocab",
        ),
        reject(
            "slice_past_vocab",
            make(Slice::new(VOCAB - 2, 4, VOCAB)),
            InvalidArgument,
            "slice",
        ),
    ]
}

/// Host `top_p` out of (0, 1] in entry `index` of input `top_p`: 0, negative, above 1, NaN.
fn host_top_p_cases(base: &Case, index: usize) -> Vec<Case> {
    [
        ("zero", 0.0),
        ("negative", -0.25),
        ("above_one", 1.5),
        ("nan", f32::NAN),
    ]
    .into_iter()
    .map(|(what, p)| bad_entry(base, &format!("host_top_p_{what}"), "top_p", index, p))
    .collect()
}

/// Host temperature negative or NaN in entry `index` of input `temperature`.
fn host_temperature_cases(base: &Case, index: usize) -> Vec<Case> {
    [("negative", -1.0), ("nan", f32::NAN)]
        .into_iter()
        .map(|(what, t)| {
            let what = format!("host_temperature_{what}");
            bad_entry(base, &what, "temperature", index, t)
        })
        .collect()
}

/// The batch-shape cases of a batch op, through `make(dims)` (the baseline with other dims):
/// `S == 0`, `S > i32::MAX` and `real_bsz > max_bsz`. The `S > i32::MAX` case has
/// `huge_s_slots` slots: 0 for ops whose outputs the runner sizes `max_bsz · S`, so that nothing
/// huge is allocated (validation rejects `S` before it looks at any buffer).
fn dims_cases(make: impl Fn(Dims) -> Case, huge_s_slots: usize) -> Vec<Case> {
    let base = batch().dims;
    let huge_s = Dims {
        max_bsz: huge_s_slots,
        real_bsz: huge_s_slots.min(base.real_bsz),
        max_step_tokens: MAX_HOST_LENGTH + 1,
    };
    let zero_s = Dims {
        max_step_tokens: 0,
        ..base
    };
    let too_many = Dims {
        real_bsz: base.max_bsz + 1,
        ..base
    };
    vec![
        reject("s_zero", make(zero_s), InvalidArgument, "max_step_tokens"),
        reject(
            "s_above_i32_max",
            make(huge_s),
            InvalidArgument,
            "max_step_tokens",
        ),
        reject(
            "real_bsz_above_max_bsz",
            make(too_many),
            InvalidArgument,
            "real_bsz",
        ),
    ]
}

/// The host slot rules (`docs/semantics.md` §2) broken in the host copies of `seq_lens_this_time`
/// and `seq_lens_encoder` of `base` (whose device copies hold the same values).
fn host_lens_cases(base: &Case) -> Vec<Case> {
    let broken: [(&str, [i32; 4], [i32; 4], &str); 5] = [
        (
            "host_this_time_negative",
            [-1, 5, 0, 0],
            [0, 5, 0, 0],
            "seq_lens_this_time",
        ),
        (
            "host_encoder_negative",
            [3, 5, 0, 0],
            [0, 5, -2, 0],
            "seq_lens_encoder",
        ),
        (
            "decode_this_time_above_s",
            [4, 5, 0, 0],
            [0, 5, 0, 0],
            "seq_lens_this_time",
        ),
        (
            "prefill_this_time_below_encoder",
            [3, 4, 0, 0],
            [0, 5, 0, 0],
            "seq_lens_this_time",
        ),
        (
            "prefill_this_time_above_encoder",
            [3, 6, 0, 0],
            [0, 5, 0, 0],
            "seq_lens_this_time",
        ),
    ];
    broken
        .into_iter()
        .map(|(what, this_time, encoder, arg)| {
            let case = base
                .clone()
                .with("seq_lens_this_time", i32s(&this_time))
                .with("seq_lens_encoder", i32s(&encoder));
            reject(what, case, InvalidArgument, arg)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashSet;

    use specula_backend_cpu::CpuDevice;

    use super::*;
    use crate::ConformanceError;
    use crate::cases::Size;
    use crate::cases::run_case;

    #[test]
    fn the_baseline_batch_is_as_documented() {
        let b = batch();
        assert_eq!((b.t_out(), b.token_num(), b.capacity()), (4, 8, 9), "{b:?}");
    }

    /// Each op's baselines run on the CPU, so every `invalid::` case breaks one thing of a
    /// valid call.
    #[test]
    fn every_baseline_runs_on_the_cpu() {
        let cpu = CpuDevice::with_threads(1).unwrap();
        for op in Op::ALL {
            let baselines = baselines(op);
            assert!(!baselines.is_empty(), "{op} has no baseline");
            for case in baselines {
                assert_eq!(case.op(), op, "{}", case.name);
                let out = run_case(&cpu, &case);
                let out = out.unwrap_or_else(|e| panic!("{op}::{}: {e}", case.name));
                assert!(out.guard_violations.is_empty(), "{op}::{}", case.name);
            }
        }
    }

    /// Every op has `invalid::` cases, all in the registry; each one expects the error the CPU
    /// really returns (its kind and argument), and the message names the op.
    #[test]
    fn every_op_has_invalid_cases_and_the_cpu_rejects_them_as_expected() {
        let cpu = CpuDevice::with_threads(1).unwrap();
        let mut failures = Vec::new();
        for op in Op::ALL {
            let registered: Vec<Case> = crate::cases::cases(op, Size::Quick)
                .into_iter()
                .filter(|c| c.expected_error.is_some())
                .collect();
            assert_eq!(
                registered,
                cases(op),
                "{op}: the registry holds its invalid cases"
            );
            assert!(!registered.is_empty(), "{op} has no invalid:: case");
            let mut names = HashSet::new();
            for case in &registered {
                assert!(case.name.starts_with("invalid::"), "{op}::{}", case.name);
                assert!(names.insert(&case.name), "{op}: duplicate {}", case.name);
                let expected = case.expected_error.as_ref().unwrap();
                match run_case(&cpu, case) {
                    Err(ConformanceError::Device(e))
                        if ExpectedError::of(&e).as_ref() == Some(expected)
                            && e.to_string().contains(op.name()) => {}
                    Err(e) => failures.push(format!("{op}::{}: {expected}, got `{e}`", case.name)),
                    Ok(_) => failures.push(format!("{op}::{}: {expected}, ran", case.name)),
                }
            }
            eprintln!("{op}: {} invalid cases", registered.len());
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
