//! The kernel sources, their entry points and the NVRTC options they are built with.
//!
//! Every op has one file under `kernels/`, named as the op and embedded with `include_str!`; the
//! list of files ([`KernelFile`]) is generated from the op table of `specula-backend-api`, so an op
//! without its kernel file is a compile error. What is known about a file — the shared headers it
//! is built on, its entry points, its element-type instances and its argument structs
//! ([`KernelFacts`]) — is declared beside the op's host code, as `KERNEL` in `ops/<op>.rs`, and
//! collected from the op table by [`KernelFile::facts`]. Every file is built on the shared
//! `common.cuh` (types, 128-bit helpers, Philox, weights, block collectives) and, as its facts say,
//! `select.cuh` (rank-order selection) or `shard.cuh` (sharded rows); then come its argument
//! structs, generated from their Rust declarations ([`ArgsStruct::declaration`]), then the file.
//! The headers are prepended as text, so no include path is needed. Constants shared with the
//! Rust side come from [`specula_backend_api::abi`] as `-D` defines ([`defines`]); the element
//! types as `-DSPECULA_T=F32|F16|BF16` (and `SPECULA_D` for REJECTION's draft rows);
//! `-DSPECULA_SUFFIX` names the entry points (`argmax_f32`).
//!
//! The runtime ([`crate::CudaDevice`]) and the compile check (`nvrtc-check`) both build through
//! [`KernelFile::source`] and [`compile_options`], so CI checks exactly what a GPU runs.

use specula_backend_api::abi;
use specula_backend_api::logit_weights;
use specula_backend_api::ops::process_logits::{PENALTY_FIELDS, penalty};
use specula_backend_api::rng::Purpose;
use specula_backend_api::{DType, Op, WarmUp};

pub use crate::args::ArgsStruct;
use crate::args::cuda_args;
use crate::launch;

/// The shared header of every kernel file.
pub const COMMON: &str = include_str!("../kernels/common.cuh");
/// The rank-order selection shared by the sampling kernels.
pub const SELECT: &str = include_str!("../kernels/select.cuh");
/// Rank keys and slice weights shared by the kernels of sharded rows (`docs/semantics.md` §4d).
pub const SHARD: &str = include_str!("../kernels/shard.cuh");

/// The read-floor kernel of the benchmarks (not an op: `CudaDevice::read_floor`), without its
/// argument struct ([`read_floor_source`] puts [`FloorArgs`] before it).
pub const READ_FLOOR: &str = include_str!("../kernels/read_floor.cu");

cuda_args! {
    /// The argument block of the read-floor kernel (`kernels/read_floor.cu`), generated into its
    /// source ([`read_floor_source`]) as the ops' structs are into theirs.
    pub struct FloorArgs {
        src: u64 as "const unsigned char*", // the bytes to read (any alignment)
        bytes: u64 as "unsigned long long",
        sink: u64 as "unsigned long long*", // one word, written (almost) never
    }
}

/// The source NVRTC compiles for the read-floor kernel: [`FloorArgs`]' CUDA declaration (from its
/// Rust declaration, with its layout's `static_assert`s), then `kernels/read_floor.cu`.
pub fn read_floor_source() -> String {
    format!(
        "{}\n{READ_FLOOR}",
        ArgsStruct::of::<FloorArgs>().declaration()
    )
}

/// The NVRTC options of the read-floor kernel for a target.
pub fn floor_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_owned(),
    ]
}

/// Blocks of the read-floor kernel for `bytes`: enough 256-thread blocks to read 16 bytes per
/// thread four times, at most `resident` (what the device runs at once), at least 1.
pub fn floor_blocks(bytes: u64, resident: u32) -> u32 {
    let per_block = 256 * 16 * 4;
    let wanted = bytes.div_ceil(per_block).max(1);
    u32::try_from(wanted)
        .unwrap_or(u32::MAX)
        .clamp(1, resident.max(1))
}

/// Declares [`KernelFile`] from the op table: one variant per op, whose source is
/// `kernels/<op>.cu`, so an op without its kernel file does not compile. (Its facts,
/// [`KernelFile::facts`], are collected from the op table where the op modules are: `ops/mod.rs`.)
macro_rules! kernel_files {
    ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        /// One kernel file per op of the contract (`kernels/<op>.cu`), generated from the op table
        /// ([`specula_backend_api::for_each_op!`]).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum KernelFile {
            $(
                #[doc = concat!("`kernels/", stringify!($name), ".cu` (§", $section, ").")]
                $variant,
            )*
        }

        impl KernelFile {
            /// Every kernel file, in the order of the op table.
            pub const ALL: [KernelFile; [$(stringify!($name)),*].len()] =
                [$(KernelFile::$variant),*];

            /// The op this file implements.
            pub const fn op(self) -> Op {
                match self {
                    $(KernelFile::$variant => Op::$variant,)*
                }
            }

            /// The op's own source (without the shared headers and its argument structs).
            pub const fn body(self) -> &'static str {
                match self {
                    $(KernelFile::$variant => {
                        include_str!(concat!("../kernels/", stringify!($name), ".cu"))
                    })*
                }
            }
        }
    };
}

specula_backend_api::for_each_op!(kernel_files);

/// A shared header a kernel file may be built on, after `common.cuh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// `select.cuh`: the rank-order selection of the sampling kernels.
    Select,
    /// `shard.cuh`: rank keys and slice weights of the ops of sharded rows (§4d).
    Shard,
}

impl Library {
    /// The header's text.
    pub const fn text(self) -> &'static str {
        match self {
            Library::Select => SELECT,
            Library::Shard => SHARD,
        }
    }
}

/// The element-type instances a kernel file is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instances {
    /// One integer-only instance, its entry points named by this dtype (`i32`; `u8` for the byte
    /// copy of `gather_next_token`).
    Integer(DType),
    /// One per float dtype of the rows.
    Float,
    /// One per (target, draft) pair of float dtypes (REJECTION's target and draft rows).
    FloatPairs,
}

impl Instances {
    /// Every instance, in order: `(suffix dtype, T, D)`.
    pub fn list(self) -> Vec<Instance> {
        match self {
            Instances::Integer(suffix) => vec![Instance::integer(suffix)],
            Instances::Float => DType::FLOATS
                .iter()
                .map(|&t| Instance::float(t, t))
                .collect(),
            Instances::FloatPairs => DType::FLOATS
                .iter()
                .flat_map(|&t| DType::FLOATS.iter().map(move |&d| Instance::float(t, d)))
                .collect(),
        }
    }

    /// How many there are ([`Instances::list`]), without allocating.
    pub const fn count(self) -> usize {
        match self {
            Instances::Integer(_) => 1,
            Instances::Float => DType::FLOATS.len(),
            Instances::FloatPairs => DType::FLOATS.len() * DType::FLOATS.len(),
        }
    }

    /// The position of `instance` in [`Instances::list`], without allocating (`None`: not one of
    /// them).
    pub fn index(self, instance: Instance) -> Option<usize> {
        let float = |d: DType| DType::FLOATS.iter().position(|&f| f == d);
        match self {
            Instances::Integer(suffix) => (Instance::integer(suffix) == instance).then_some(0),
            Instances::Float => (instance == Instance::float(instance.target, instance.target))
                .then(|| float(instance.target))
                .flatten(),
            Instances::FloatPairs => {
                let (t, d) = (float(instance.target)?, float(instance.draft)?);
                (instance.suffix == instance.target).then_some(t * DType::FLOATS.len() + d)
            }
        }
    }
}

/// What an op's host code (`ops/<op>.rs`, its `KERNEL`) declares about its kernel file, beside
/// the `run` that launches it; [`KernelFile::facts`] collects them from the op table.
#[derive(Clone, Copy, Debug)]
pub struct KernelFacts {
    /// The shared headers the file is built on after `common.cuh`, in order.
    pub libraries: &'static [Library],
    /// Entry-point stems; each is suffixed with the instance's dtype name
    /// (`top_k_top_p_sample` → `top_k_top_p_sample_f32`).
    pub entry_stems: &'static [&'static str],
    /// The element-type instances the file is built for.
    pub instances: Instances,
    /// The instance a warm-up builds whatever its dtypes, if any (`verify_draft_tokens`' f32 pair:
    /// the strategies other than REJECTION launch it whatever the rows).
    pub always_built: Option<Instance>,
    /// The argument structs of its kernels, declared in Rust and generated into its source.
    pub args: &'static [ArgsStruct],
}

impl KernelFacts {
    /// A file built on `common.cuh` alone, with these entry-point stems, instances and argument
    /// structs, none of its instances built by a warm-up of other dtypes.
    pub const fn new(
        entry_stems: &'static [&'static str],
        instances: Instances,
        args: &'static [ArgsStruct],
    ) -> Self {
        KernelFacts {
            libraries: &[],
            entry_stems,
            instances,
            always_built: None,
            args,
        }
    }

    /// The same file, built on `libraries` too (after `common.cuh`, in order).
    pub const fn on(self, libraries: &'static [Library]) -> Self {
        KernelFacts { libraries, ..self }
    }

    /// The same file, its `instance` built by every warm-up whatever its dtypes.
    pub const fn always_building(self, instance: Instance) -> Self {
        KernelFacts {
            always_built: Some(instance),
            ..self
        }
    }
}

impl KernelFile {
    /// The file name under `kernels/` (`<op>.cu`).
    pub fn file_name(self) -> String {
        self.op().kernel_file("cu")
    }

    /// The op's file with its argument structs declared before it (generated from their Rust
    /// declarations, [`ArgsStruct::declaration`]): what follows the headers.
    pub fn declared_body(self) -> String {
        let mut src: String = self
            .facts()
            .args
            .iter()
            .map(ArgsStruct::declaration)
            .collect();
        src.push('\n');
        src.push_str(self.body());
        src
    }

    /// The complete translation unit NVRTC compiles: `common.cuh`, the file's libraries, its
    /// argument structs, then the op's file.
    pub fn source(self) -> String {
        let mut src = String::from(COMMON);
        src.push('\n');
        for library in self.facts().libraries {
            src.push_str(library.text());
            src.push('\n');
        }
        src.push_str(&self.declared_body());
        src
    }

    /// Entry-point stems of the file ([`KernelFacts::entry_stems`]).
    pub const fn entry_stems(self) -> &'static [&'static str] {
        self.facts().entry_stems
    }

    /// Whether a warm-up for `plan` builds `instance` of this file: an integer instance always,
    /// a float one when its rows are of the plan's dtypes, and the file's
    /// [`KernelFacts::always_built`] instance always.
    fn builds_instance(self, instance: Instance, plan: &WarmUp) -> bool {
        plan.builds_dtype(instance.suffix) || self.facts().always_built == Some(instance)
    }

    /// The element-type instances this file is built for: `(suffix dtype, T, D)`
    /// ([`KernelFacts::instances`]).
    pub fn instances(self) -> Vec<Instance> {
        self.facts().instances.list()
    }

    /// How many instances the file is built for ([`KernelFile::instances`]), without allocating.
    pub const fn instance_count(self) -> usize {
        self.facts().instances.count()
    }

    /// The position of `instance` in [`KernelFile::instances`], without allocating (`None`: the
    /// file is not built for it).
    pub fn instance_index(self, instance: Instance) -> Option<usize> {
        self.facts().instances.index(instance)
    }

    /// The position of `stem` in [`KernelFile::entry_stems`].
    pub fn stem_index(self, stem: &str) -> Option<usize> {
        self.entry_stems().iter().position(|&s| s == stem)
    }
}

/// The number of functions of every file, instance and entry point: the size of a device's
/// table of loaded functions ([`function_slot`]).
pub fn function_slots() -> usize {
    KernelFile::ALL
        .iter()
        .map(|f| f.instance_count() * f.entry_stems().len())
        .sum()
}

/// The index of entry `stem` of `file` built for `instance` in a table of [`function_slots`]
/// functions: files in table order, then instances, then entry points. No allocation, so a
/// launch finds its function with a few comparisons.
pub fn function_slot(file: KernelFile, instance: Instance, stem: &str) -> Option<usize> {
    let base: usize = KernelFile::ALL
        .iter()
        .take_while(|&&f| f != file)
        .map(|f| f.instance_count() * f.entry_stems().len())
        .sum();
    let stems = file.entry_stems().len();
    Some(base + file.instance_index(instance)? * stems + file.stem_index(stem)?)
}

/// Every function a device may load for `plan`: each kernel file of the plan's ops, each of its
/// instances ([`KernelFile::instances`]) whose rows are of the plan's dtypes (integer instances
/// always) and each entry-point stem ([`KernelFile::entry_stems`]), in table order. What the
/// warm-up compiles and loads (one module per file and instance).
pub fn warm_up_plan(plan: &WarmUp) -> Vec<(KernelFile, Instance, &'static str)> {
    KernelFile::ALL
        .into_iter()
        .filter(|file| plan.builds(file.op()))
        .flat_map(|file| {
            let instances = file.instances().into_iter();
            instances
                .filter(move |&instance| file.builds_instance(instance, plan))
                .flat_map(move |instance| {
                    file.entry_stems()
                        .iter()
                        .map(move |&stem| (file, instance, stem))
                })
        })
        .collect()
}

/// One compiled instance of a kernel file: the entry-point suffix and the element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Instance {
    /// The dtype that names the entry points (`_f32`).
    pub suffix: DType,
    /// The element type of the probabilities/logits (`SPECULA_T`).
    pub target: DType,
    /// The element type of REJECTION's draft rows (`SPECULA_D`).
    pub draft: DType,
}

impl Instance {
    /// An integer-only kernel (the float types are unused and set to f32).
    pub const fn integer(suffix: DType) -> Self {
        Instance {
            suffix,
            target: DType::F32,
            draft: DType::F32,
        }
    }

    /// A float kernel over `target` rows (and `draft` rows for REJECTION).
    pub const fn float(target: DType, draft: DType) -> Self {
        Instance {
            suffix: target,
            target,
            draft,
        }
    }

    /// The entry point of `stem` in this instance (`argmax` → `argmax_f32`).
    pub fn entry(&self, stem: &str) -> String {
        format!("{stem}_{}", self.suffix.name())
    }
}

/// The CUDA element-type tag of a float dtype (`F32`, `F16`, `BF16`).
fn element_tag(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        _ => "F32",
    }
}

/// The `-D` defines shared with the Rust side, generated from [`abi`], the constants of contract
/// §4b ([`logit_weights`], and the bounds of its `sanitize_logit` as f32 bit patterns) and the
/// launch constants.
pub fn defines() -> Vec<(String, String)> {
    let d = |name: &str, value: String| (format!("SPECULA_{name}"), value);
    let coefficients: Vec<String> = logit_weights::EXP2_COEFFICIENTS
        .iter()
        .map(|a| format!("{a}ull"))
        .collect();
    vec![
        d("LOG2E_Q63", format!("{:#x}ull", logit_weights::LOG2E_Q63)),
        d(
            "GAP_FRACTION_BITS",
            logit_weights::GAP_FRACTION_BITS.to_string(),
        ),
        d("GAP_LIMIT", format!("{}ull", logit_weights::GAP_LIMIT)),
        d("EXP2_COEFFICIENTS", coefficients.join(",")),
        d(
            "LOGIT_TINY_BITS",
            format!("{:#x}u", logit_weights::logit_tiny_bits()),
        ),
        d(
            "LOGIT_HUGE_BITS",
            format!("{:#x}u", logit_weights::logit_huge_bits()),
        ),
        d("PHILOX_M0", format!("{:#x}u", abi::PHILOX_M0)),
        d("PHILOX_M1", format!("{:#x}u", abi::PHILOX_M1)),
        d("PHILOX_W0", format!("{:#x}u", abi::PHILOX_W0)),
        d("PHILOX_W1", format!("{:#x}u", abi::PHILOX_W1)),
        d("PHILOX_ROUNDS", abi::PHILOX_ROUNDS.to_string()),
        d("MAX_INFER_SEED", format!("{}ull", abi::MAX_INFER_SEED)),
        d("SEED_STRIDE", format!("{}ull", abi::SEED_STRIDE)),
        d("WEIGHT_BITS", abi::WEIGHT_BITS.to_string()),
        d("TOP_P_BITS", abi::TOP_P_BITS.to_string()),
        d("MAX_VOCAB", format!("{}u", abi::MAX_VOCAB)),
        d("MAX_CANDIDATES", abi::MAX_CANDIDATES.to_string()),
        d("MAX_LOGPROBS_TOP_K", abi::MAX_LOGPROBS_TOP_K.to_string()),
        d("SHARD_KEY_ID_BITS", abi::SHARD_KEY_ID_BITS.to_string()),
        d("MAX_SHARD_RECORDS", abi::MAX_SHARD_RECORDS.to_string()),
        d(
            "REJECTION_MAX_TOTAL_WEIGHT",
            format!("{}ull", abi::REJECTION_MAX_TOTAL_WEIGHT),
        ),
        d("PENALTY_FIELDS", PENALTY_FIELDS.to_string()),
        d("PENALTY_REPETITION", penalty::REPETITION.to_string()),
        d(
            "PENALTY_REPETITION_INVERSE",
            penalty::REPETITION_INVERSE.to_string(),
        ),
        d("PENALTY_FREQUENCY", penalty::FREQUENCY.to_string()),
        d("PENALTY_PRESENCE", penalty::PRESENCE.to_string()),
        d("PENALTY_MIN_P", penalty::MIN_P.to_string()),
        d("PURPOSE_SAMPLE", format!("{}u", Purpose::Sample as u32)),
        d(
            "PURPOSE_CANDIDATE",
            format!("{}u", Purpose::Candidate as u32),
        ),
        d("PURPOSE_ACCEPT", format!("{}u", Purpose::Accept as u32)),
        d("PURPOSE_RESIDUAL", format!("{}u", Purpose::Residual as u32)),
        d("SELECT_BLOCK", launch::SELECT_BLOCK.to_string()),
        d("SELECT_ITEMS", launch::SELECT_ITEMS.to_string()),
        d("SELECT_MAX_PASSES", launch::SELECT_MAX_PASSES.to_string()),
        d("ROW_BLOCK", launch::ROW_BLOCK.to_string()),
        d("BATCH_BLOCK", launch::BATCH_BLOCK.to_string()),
        d("STRATEGY_GREEDY", launch::STRATEGY_GREEDY.to_string()),
        d(
            "STRATEGY_TARGET_MATCH",
            launch::STRATEGY_TARGET_MATCH.to_string(),
        ),
        d("STRATEGY_TOPP", launch::STRATEGY_TOPP.to_string()),
        d("STRATEGY_REJECTION", launch::STRATEGY_REJECTION.to_string()),
    ]
}

/// The NVRTC options of an instance for a target (`sm_90` for a CUBIN, `compute_90` for PTX).
///
/// No fast math and no FMA contraction: the float ops (softmax, logprobs) stay as close to the
/// CPU reference as the hardware's correctly rounded operations allow, and every exact op is
/// integer arithmetic anyway.
pub fn compile_options(instance: &Instance, arch: &str) -> Vec<String> {
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_owned(),
        "--fmad=false".to_owned(),
        "--prec-div=true".to_owned(),
        "--prec-sqrt=true".to_owned(),
        "--ftz=false".to_owned(),
        format!("-DSPECULA_T={}", element_tag(instance.target)),
        format!("-DSPECULA_D={}", element_tag(instance.draft)),
        format!("-DSPECULA_SUFFIX={}", instance.suffix.name()),
    ];
    options.extend(
        defines()
            .into_iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_has_its_entry_points_in_its_source() {
        for file in KernelFile::ALL {
            let body = file.body();
            for stem in file.entry_stems() {
                assert!(
                    body.contains(&format!("SPECULA_ENTRY({stem})")),
                    "{} lacks entry {stem}",
                    file.file_name()
                );
            }
            assert!(
                file.entry_stems().contains(&file.op().name()),
                "{} has no entry named after its op",
                file.file_name()
            );
        }
    }

    /// The names of the `struct *Args {` declarations of a kernel source.
    fn declared_args(source: &str) -> Vec<&str> {
        source
            .lines()
            .filter_map(|line| line.strip_prefix("struct "))
            .filter_map(|rest| rest.strip_suffix(" {"))
            .filter(|name| name.ends_with("Args"))
            .collect()
    }

    #[test]
    fn every_argument_struct_is_generated_into_its_source_from_rust() {
        for file in KernelFile::ALL {
            let (name, facts) = (file.file_name(), file.facts());
            assert!(!facts.args.is_empty(), "{name} has no argument struct");
            assert_eq!(
                declared_args(file.body()),
                Vec::<&str>::new(),
                "{name} declares its own"
            );
            let source = file.source();
            let generated: Vec<&str> = facts.args.iter().map(|a| a.name).collect();
            assert_eq!(declared_args(&source), generated, "{name}");
            for args in facts.args {
                let rust: Vec<(String, usize)> = args
                    .fields
                    .iter()
                    .map(|f| (f.name.to_owned(), f.bytes))
                    .collect();
                let read_back = abi::c_struct_fields(&source, args.name);
                assert_eq!(read_back, Some(rust), "{name}: struct {}", args.name);
                assert!(
                    file.body().contains(&format!("(const {} a)", args.name)),
                    "{name}: no kernel takes {}",
                    args.name
                );
            }
        }
    }

    #[test]
    fn files_of_sharded_rows_are_built_on_the_shard_header() {
        for file in KernelFile::ALL {
            let libraries = file.facts().libraries;
            assert_eq!(
                libraries.contains(&Library::Shard),
                file.op().is_sharded(),
                "{}",
                file.file_name()
            );
            assert!(file.source().contains(SELECT) == libraries.contains(&Library::Select));
        }
    }

    #[test]
    fn one_file_per_op_in_table_order() {
        assert_eq!(KernelFile::ALL.map(KernelFile::op), Op::ALL);
        assert_eq!(KernelFile::Argmax.file_name(), "argmax.cu");
    }

    #[test]
    fn entry_points_follow_the_op_naming() {
        let i = Instance::float(DType::BF16, DType::F16);
        assert_eq!(i.entry("softmax"), Op::Softmax.entry_point(DType::BF16));
        assert_eq!(
            Instance::integer(DType::I32).entry("update_state"),
            Op::UpdateState.entry_point(DType::I32)
        );
    }

    #[test]
    fn sources_use_only_injected_constants() {
        // Every SPECULA_* macro a kernel reads is either defined in the headers or injected.
        let injected: Vec<String> = defines().into_iter().map(|(n, _)| n).collect();
        let all = format!(
            "{COMMON}{SELECT}{SHARD}{}",
            KernelFile::ALL.map(KernelFile::declared_body).concat()
        );
        for word in all.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !word.starts_with("SPECULA_") {
                continue;
            }
            let defined_in_source = all.contains(&format!("#define {word}"));
            let builtin = matches!(word, "SPECULA_T" | "SPECULA_D" | "SPECULA_SUFFIX");
            assert!(
                defined_in_source || builtin || injected.iter().any(|n| n == word),
                "{word} is neither defined nor injected"
            );
        }
    }

    #[test]
    fn the_logit_bounds_are_those_of_the_contract() {
        // 2^-76 and 2^64 (`docs/semantics.md` §4b step 1).
        assert_eq!(logit_weights::logit_tiny_bits(), 0x1980_0000);
        assert_eq!(logit_weights::logit_huge_bits(), 0x5f80_0000);
        let defines = defines();
        let value = |name: &str| {
            defines
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            value("SPECULA_LOGIT_TINY_BITS").as_deref(),
            Some("0x19800000u")
        );
        assert_eq!(
            value("SPECULA_LOGIT_HUGE_BITS").as_deref(),
            Some("0x5f800000u")
        );
    }

    #[test]
    fn the_warm_up_plan_covers_every_file_instance_and_entry() {
        let all = warm_up_plan(&WarmUp::all());
        let expected: usize = KernelFile::ALL
            .map(|f| f.instances().len() * f.entry_stems().len())
            .iter()
            .sum();
        assert_eq!(all.len(), expected);
        for file in KernelFile::ALL {
            for instance in file.instances() {
                for stem in file.entry_stems() {
                    assert!(all.contains(&(file, instance, stem)), "{file:?} {stem}");
                }
            }
        }
        let ops = Op::ALL.into_iter().filter(|&op| op != Op::ProcessLogits);
        let without = warm_up_plan(&WarmUp::new(ops, DType::FLOATS));
        assert!(
            without
                .iter()
                .all(|(f, _, _)| *f != KernelFile::ProcessLogits)
        );
        assert_eq!(without.len(), expected - 3);
    }

    #[test]
    fn a_warm_up_for_one_dtype_builds_its_instances_and_the_integer_ones() {
        let plan = warm_up_plan(&WarmUp::new(Op::ALL, [DType::BF16]));
        for file in KernelFile::ALL {
            let built: Vec<Instance> = plan
                .iter()
                .filter(|(f, _, _)| *f == file)
                .map(|(_, i, _)| *i)
                .collect();
            for instance in file.instances() {
                let wanted = !instance.suffix.is_float()
                    || instance.suffix == DType::BF16
                    || (file == KernelFile::VerifyDraftTokens
                        && instance == Instance::float(DType::F32, DType::F32));
                assert_eq!(built.contains(&instance), wanted, "{file:?} {instance:?}");
            }
        }
    }

    #[test]
    fn every_function_has_its_own_slot() {
        let mut seen = vec![false; function_slots()];
        for file in KernelFile::ALL {
            assert_eq!(file.instances().len(), file.instance_count());
            for (i, instance) in file.instances().into_iter().enumerate() {
                assert_eq!(
                    file.instance_index(instance),
                    Some(i),
                    "{file:?} {instance:?}"
                );
                for stem in file.entry_stems() {
                    let slot = function_slot(file, instance, stem).expect("a slot");
                    assert!(
                        !seen[slot],
                        "{file:?} {instance:?} {stem} shares slot {slot}"
                    );
                    seen[slot] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "every slot is used");
        let other = Instance::float(DType::F16, DType::F32);
        assert_eq!(KernelFile::Argmax.instance_index(other), None);
        assert_eq!(KernelFile::Argmax.stem_index("softmax"), None);
        assert_eq!(
            function_slot(
                KernelFile::UpdateState,
                Instance::integer(DType::U8),
                "update_state"
            ),
            None
        );
    }

    #[test]
    fn the_read_floor_fills_the_device_without_idle_blocks() {
        assert_eq!(floor_blocks(0, 1056), 1);
        assert_eq!(floor_blocks(16, 1056), 1);
        assert_eq!(
            floor_blocks(64 * 151_936 * 4, 1056),
            1056,
            "39 MB: every resident block"
        );
        assert_eq!(floor_blocks(256 * 64 * 10, 1056), 10);
        assert_eq!(floor_blocks(u64::MAX, 0), 1);
    }

    #[test]
    fn instances_cover_every_float_dtype() {
        assert_eq!(KernelFile::Argmax.instances().len(), 3);
        assert_eq!(KernelFile::VerifyDraftTokens.instances().len(), 9);
        assert_eq!(KernelFile::UpdateState.instances().len(), 1);
    }
}
