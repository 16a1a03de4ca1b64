//! One module per op, named as the op, beside its kernel file `kernels/<op>.cl`.
//!
//! Every function here runs after the shared validation of `backend-api` (and only when the op has
//! something to do), so shapes, dtypes, devices and host scalars are known to be right; buffer
//! *contents* may still be anything, and the kernels clamp them as the contract says.
//!
//! Kernel parameters follow one convention: each buffer is a positional argument followed by the
//! element offset of its window, both set from one [`KernelBuffers`](crate::runtime::KernelBuffers)
//! entry, so each buffer is named once, in the kernel's parameter order; then one
//! [`kernel_args!`](specula_backend_api::kernel_args) struct per kernel, passed by value, holding
//! the scalars. The kernel files do not declare these structs: each module lists its own in
//! `ARGS`, and [`program_source`] writes them as OpenCL C into the program between `common.cl` and
//! the kernel file ([`ArgsStruct::declaration`]). The kernel files, programs and argument structs
//! are collected here from the op table ([`kernel_source`], [`kernel_programs`], [`kernel_args`]);
//! the runtime builds a program from its [`ProgramKey::source`].

pub(crate) mod accept_logprobs;
pub(crate) mod argmax;
pub(crate) mod build_output_layout;
pub(crate) mod build_sampling_params;
pub(crate) mod gather_next_token;
pub(crate) mod ngram_match;
pub(crate) mod process_logits;
pub(crate) mod shard_exp_sum;
pub(crate) mod shard_histogram;
pub(crate) mod shard_key;
pub(crate) mod shard_records;
pub(crate) mod shard_walk;
pub(crate) mod sharded;
pub(crate) mod softmax;
pub(crate) mod top_k_top_p_sample;
pub(crate) mod top_p_candidates;
pub(crate) mod update_state;
pub(crate) mod verify_draft_tokens;

use specula_backend_api::WarmUp;
use specula_backend_api::ops::ScoresKind;
use specula_backend_api::{DType, Op, Result};

pub(crate) use crate::runtime::{ArgsStruct, Program};
use crate::runtime::{ClStorage, ProgramKey, Runtime};

/// The common kernel file: Philox, 128-bit helpers, keys, row primitives.
const COMMON: &str = include_str!("../../kernels/common.cl");

/// The kernel file the ops of sharded rows share (`docs/semantics.md` §4d): rank keys and the
/// weights of a slice's tokens as tokens of the whole row.
const SHARD: &str = include_str!("../../kernels/shard.cl");

/// Collects each op's kernel file, programs and argument structs from the op table, so an op
/// without its module, its kernel file, its `programs` or its `ARGS` does not compile.
macro_rules! kernel_sources {
    ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        /// The kernel file of `op`, `kernels/<op>.cl`, embedded (`None` for [`Op::Memory`]).
        /// Generated from the op table, so an op without its kernel file does not compile.
        pub(crate) fn kernel_source(op: Op) -> Option<&'static str> {
            match op {
                Op::Memory => None,
                $(Op::$variant => Some(include_str!(concat!("../../kernels/", stringify!($name), ".cl"))),)*
            }
        }

        /// Every program `op`'s host code may launch for score rows of the plan's dtypes, with
        /// its kernels (`ops::<op>::programs`; none for [`Op::Memory`]): what the warm-up builds.
        pub(crate) fn kernel_programs(op: Op, plan: &WarmUp) -> Vec<Program> {
            match op {
                Op::Memory => Vec::new(),
                $(Op::$variant => $name::programs(plan),)*
            }
        }

        /// The argument structs of `op`'s kernels (`ops::<op>::ARGS`; none for [`Op::Memory`]).
        pub(crate) fn kernel_args(op: Op) -> &'static [ArgsStruct] {
            match op {
                Op::Memory => &[],
                $(Op::$variant => $name::ARGS,)*
            }
        }
    };
}

specula_backend_api::for_each_op!(kernel_sources);

/// The whole program of `op` as it is built: `common.cl` (and `shard.cl` for the ops of sharded
/// rows), the OpenCL C declarations of the op's argument structs (generated from their
/// `kernel_args!` declarations), then the kernel file (`None` for [`Op::Memory`]).
pub(crate) fn program_source(op: Op) -> Option<String> {
    let text = kernel_source(op)?;
    let structs: String = kernel_args(op)
        .iter()
        .map(ArgsStruct::declaration)
        .collect();
    let shard = if op.is_sharded() { SHARD } else { "" };
    Some(format!("{COMMON}\n{shard}\n{structs}\n{text}\n"))
}

impl ProgramKey {
    /// The whole source of this key's program ([`program_source`] of its op), as the runtime
    /// builds it.
    pub(crate) fn source(&self) -> Option<String> {
        program_source(self.op)
    }
}

/// The program of `(key, entry)` with its one kernel, `entry`.
pub(crate) fn single((key, entry): (ProgramKey, String)) -> Program {
    (key, vec![entry])
}

/// Every program of a row op over one float storage format ([`float_program`]), one per float
/// dtype of the warm-up plan, with its one kernel.
pub(crate) fn float_programs(op: Op, plan: &WarmUp) -> Vec<Program> {
    plan.dtypes()
        .iter()
        .map(|&dtype| single(float_program(op, dtype)))
        .collect()
}

/// Every program of a sampling op ([`scores_program`]): each float dtype of the warm-up plan,
/// probabilities and logits rows.
pub(crate) fn scores_programs(op: Op, plan: &WarmUp) -> Vec<Program> {
    plan.dtypes()
        .iter()
        .flat_map(|&dtype| [false, true].map(|logits| ScoresKind { dtype, logits }))
        .map(|kind| single(scores_program(op, kind)))
        .collect()
}
/// A count the kernels take as a 32-bit `uint`.
///
/// Every count passed this way is bounded before it gets here: by validation (`S` and the n-gram
/// sizes ≤ `i32::MAX`, `V` ≤ 2^20, `C` ≤ 128, `K` ≤ 64), or as the element count of a buffer of the
/// same call whose elements are 4 bytes or wider (`rows`, `max_bsz`, `real_bsz` ≤ `max_bsz`, the
/// number of end tokens, a capacity), and this backend allocates no buffer above
/// [`MAX_BUFFER_BYTES`](crate::runtime::MAX_BUFFER_BYTES) = 4 · (2^32 − 1) bytes, so such a buffer
/// has fewer than 2^32 elements. The saturation is never reached; it only makes the conversion
/// total.
pub(crate) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A flag as the kernels take it (`uint`, 0 or 1).
pub(crate) fn flag(value: bool) -> u32 {
    u32::from(value)
}

/// The program of `op`'s kernel file with the `-D` options `defines` (beyond the shared ones).
pub(crate) fn program(op: Op, defines: &[(&'static str, &str)]) -> ProgramKey {
    ProgramKey {
        op,
        defines: defines.iter().map(|&(k, v)| (k, v.to_owned())).collect(),
    }
}

/// The program and entry point (`<op>_<dtype>`) of a row op over one float storage format.
pub(crate) fn float_program(op: Op, dtype: DType) -> (ProgramKey, String) {
    let entry = op.entry_point(dtype);
    let key = program(op, &[("ENTRY", &entry), ("T_DTYPE", float_code(dtype))]);
    (key, entry)
}

/// The program and entry point (`<op>_<dtype>`) of a sampling op over `kind`'s rows: probabilities,
/// or logits (`LOGITS=1`: each row weighed by `docs/semantics.md` §4b at its temperature).
pub(crate) fn scores_program(op: Op, kind: ScoresKind) -> (ProgramKey, String) {
    let entry = op.entry_point(kind.dtype);
    let key = program(
        op,
        &[
            ("ENTRY", &entry),
            ("T_DTYPE", float_code(kind.dtype)),
            ("LOGITS", logits_code(kind.logits)),
        ],
    );
    (key, entry)
}

/// The program and entry point (`<op>_i32`) of an integer batch op.
pub(crate) fn batch_program(op: Op) -> (ProgramKey, String) {
    (program(op, &[]), op.entry_point(DType::I32))
}

/// The storage-format code of a float dtype in kernels (`T_DTYPE` / `D_DTYPE`).
pub(crate) fn float_code(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "1",
        DType::BF16 => "2",
        _ => "0",
    }
}

/// The kind of the sampling rows in kernels (`LOGITS`): 1 for logits, 0 for probabilities.
pub(crate) fn logits_code(logits: bool) -> &'static str {
    if logits { "1" } else { "0" }
}

/// A scratch buffer of `len` i32 entries (uninitialised; the first stage of a two-stage op writes
/// it before the second reads it).
pub(crate) fn scratch_i32(runtime: &Runtime, len: usize) -> Result<ClStorage> {
    runtime.alloc(len.saturating_mul(4))
}

#[cfg(test)]
mod tests {
    use specula_backend_api::Op;
    use specula_backend_api::abi;

    use super::*;

    /// What is wrong with `args` in `op`'s program, if anything: it must be declared once, with
    /// the fields of its Rust declaration, and taken by the kernel file (`const struct <Name> args`).
    fn check(op: Op, args: &ArgsStruct) -> Option<String> {
        let source = program_source(op).unwrap_or_default();
        let kernel = kernel_source(op).unwrap_or_default();
        let declared = source.matches(&format!("struct {} {{", args.name)).count();
        let fields = abi::c_struct_fields(&source, args.name);
        let rust: Vec<(String, usize)> = args
            .fields
            .iter()
            .map(|f| (f.name.to_owned(), f.bytes))
            .collect();
        let taken = kernel.contains(&format!("const struct {} args", args.name));
        (declared != 1 || fields.as_ref() != Some(&rust) || !taken).then(|| {
            format!(
                "{op}: struct {} declared {declared} times, taken by the kernel: {taken}, fields {fields:?}, Rust {rust:?}",
                args.name
            )
        })
    }

    #[test]
    fn every_args_struct_is_in_its_program() {
        let mut failures: Vec<String> = Op::ALL
            .into_iter()
            .flat_map(|op| {
                kernel_args(op)
                    .iter()
                    .filter_map(move |args| check(op, args))
            })
            .collect();
        failures.extend(
            Op::ALL
                .into_iter()
                .filter(|&op| kernel_args(op).is_empty())
                .map(|op| format!("{op} has no argument struct")),
        );
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn every_op_has_its_kernel_file() {
        for op in Op::ALL {
            let source = kernel_source(op).unwrap_or_default();
            assert!(
                source.starts_with(&format!("// {op} ")),
                "kernels/{} does not describe {op} first",
                op.kernel_file("cl")
            );
        }
        assert!(kernel_source(Op::Memory).is_none());
    }

    #[test]
    fn counts_never_truncate() {
        assert_eq!(count(0), 0);
        assert_eq!(count(i32::MAX as usize), i32::MAX as u32);
        assert_eq!(count(usize::MAX), u32::MAX);
        assert_eq!((flag(false), flag(true)), (0, 1));
    }
}
