//! The WGSL kernel files, embedded with `include_str!`, and the generated prelude that injects the
//! constants shared with Rust (`backend_api::abi`) and the kernels' argument structs (declared in
//! Rust with `kernel_args!`) into every module.

use std::fmt::Write as _;
use std::marker::PhantomData;

use specula_backend_api::abi::{self, KernelArgs, KernelField};
use specula_backend_api::logit_weights;
use specula_backend_api::ops::BatchDims;
use specula_backend_api::{DType, Op};

use crate::words::{split_u64, u};

/// Workgroup size of the row kernels (one workgroup per row).
pub(crate) const WG: u32 = 256;
/// Workgroup size of the per-slot kernels.
pub(crate) const SLOT_WG: u32 = 64;

const COMMON: &str = include_str!("../shaders/common.wgsl");
const SELECT: &str = include_str!("../shaders/select.wgsl");
const ROWSTATS: &str = include_str!("../shaders/rowstats.wgsl");
const SHARD: &str = include_str!("../shaders/shard.wgsl");
const SHARD_ROWS: &str = include_str!("../shaders/shard_rows.wgsl");
const MASS_BINS: &str = include_str!("../shaders/mass_bins.wgsl");
const DRAW: &str = include_str!("../shaders/draw.wgsl");

macro_rules! kernel_registry {
    ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        /// One shader module per op of the table (`shaders/<op>.wgsl`, plus the shared files it
        /// needs). Generated from [`specula_backend_api::for_each_op!`], so an op without its
        /// shader file does not compile. What the op's host code declares about it
        /// ([`KernelFacts`]) is collected from the op table where the op modules are
        /// (`Kernel::facts`, in `ops/mod.rs`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub(crate) enum Kernel {
            $(
                #[doc = concat!("`shaders/", stringify!($name), ".wgsl`.")]
                $variant,
            )*
        }

        impl Kernel {
            /// The kernel of a contract op (`None` for [`Op::Memory`]).
            pub(crate) fn of(op: Op) -> Option<Kernel> {
                match op {
                    $(Op::$variant => Some(Kernel::$variant),)*
                    Op::Memory => None,
                }
            }

            /// The op this module implements.
            pub(crate) fn op(self) -> Op {
                match self {
                    $(Kernel::$variant => Op::$variant,)*
                }
            }

            /// The op's own shader file.
            fn body(self) -> &'static str {
                match self {
                    $(Kernel::$variant => include_str!(concat!("../shaders/", stringify!($name), ".wgsl")),)*
                }
            }
        }
    };
}

specula_backend_api::for_each_op!(kernel_registry);

impl Kernel {
    /// The file name under `shaders/` (`argmax.wgsl`).
    pub(crate) fn file(self) -> String {
        self.op().kernel_file("wgsl")
    }

    /// The argument structs of the module's kernels ([`KernelFacts::args`]).
    pub(crate) fn args(self) -> &'static [ArgsStruct] {
        self.facts().args
    }

    /// Every entry point of the module, each a pipeline: those of its float kernels for each dtype
    /// of `floats` (`<op>[_<suffix>]_<dtype>`), and its integer kernels (`<op>[_<suffix>]_i32`).
    /// Taken from the kernels declared beside the op's host code ([`Kernel::args`], one per
    /// [`Entry`]), so the list is not written twice; the tests check it against the module's own
    /// entry points.
    pub(crate) fn entry_points(self, floats: &[DType]) -> Vec<String> {
        let op = self.op();
        let mut names = Vec::new();
        for args in self.args() {
            if self.float_kernels().iter().any(|k| k.suffix == args.suffix) {
                names.extend(floats.iter().map(|&dtype| entry(op, args.suffix, dtype)));
            } else {
                names.push(entry(op, args.suffix, DType::I32));
            }
        }
        names
    }

    /// The module's float kernels ([`KernelFacts::float_kernels`]).
    fn float_kernels(self) -> &'static [FloatKernel] {
        self.facts().float_kernels
    }
}

/// A shared WGSL file a module may be built on, after `common.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Library {
    /// `select.wgsl`: rank-order selection (built on `mass_bins.wgsl`, which comes with it).
    Select,
    /// `rowstats.wgsl`: a row's softmax statistics.
    RowStats,
    /// `shard.wgsl`: rank keys and slice weights of sharded rows (`docs/semantics.md` §4d).
    Shard,
    /// `shard_rows.wgsl`: the rows of the ops over `ops::ShardRows` (records, histogram, walk).
    ShardRows,
    /// `mass_bins.wgsl`: histogram bins with a count and an exact 64-bit mass (the module declares
    /// the bins), for a module without [`Library::Select`].
    MassBins,
    /// `draw.wgsl`: a draw among a selection's members in ascending id order, each weighing the
    /// module's `drawn_weight` (after [`Library::Select`]).
    Draw,
}

impl Library {
    /// The files' texts, in order.
    const fn texts(self) -> &'static [&'static str] {
        match self {
            Library::Select => &[MASS_BINS, SELECT],
            Library::RowStats => &[ROWSTATS],
            Library::Shard => &[SHARD],
            Library::ShardRows => &[SHARD_ROWS],
            Library::MassBins => &[MASS_BINS],
            Library::Draw => &[DRAW],
        }
    }
}

/// What an op's host code (`ops/<op>.rs`, its `KERNEL`) declares about its shader module, beside
/// the `run` that dispatches it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelFacts {
    /// The shared files the module is built on after `common.wgsl`, in order.
    pub(crate) libraries: &'static [Library],
    /// The module's float kernels, one workgroup per row (or entry): for each, the entry point
    /// `<op>[_<suffix>]_<dtype>` of every float dtype is generated ([`float_entry_points`]),
    /// calling `<op>[_<suffix>]_main` of the op's file; the module's other kernels are integer
    /// ones (`<op>[_<suffix>]_i32`).
    pub(crate) float_kernels: &'static [FloatKernel],
    /// The argument structs of its kernels, one per [`Entry`] ([`Entry::args`]), generated into
    /// the module.
    pub(crate) args: &'static [ArgsStruct],
    /// The module's own constants (`const NAME: u32 = <value>u;`, generated after the prelude),
    /// where the host writes the same codes into its arguments.
    pub(crate) constants: &'static [(&'static str, u32)],
}

/// A float kernel of a module ([`KernelFacts::float_kernels`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FloatKernel {
    /// The kernel's suffix: `None` for the op's main kernel `<op>_<dtype>`.
    pub(crate) suffix: Option<&'static str>,
    /// The WGSL expression of the number of groups that hold work (`p.rows`, from the kernel's
    /// argument struct): the generated entry point returns on the groups past it (a dispatch is
    /// rounded up to whole rows of groups), so `<op>[_<suffix>]_main` runs only on real ones.
    pub(crate) groups: &'static str,
}

impl FloatKernel {
    /// The op's main kernel over `p.rows` rows.
    pub(crate) const ROWS: FloatKernel = FloatKernel {
        suffix: None,
        groups: "p.rows",
    };
}

impl KernelFacts {
    /// A module of integer kernels only (`<op>[_<suffix>]_i32`), built on `common.wgsl` alone.
    pub(crate) const fn batch(args: &'static [ArgsStruct]) -> Self {
        KernelFacts {
            libraries: &[],
            float_kernels: &[],
            args,
            constants: &[],
        }
    }

    /// A module with one float kernel, `<op>_<dtype>` for every float dtype (one workgroup per
    /// row of `p.rows`, [`FloatKernel::ROWS`]), built on `libraries`.
    pub(crate) const fn rows(libraries: &'static [Library], args: &'static [ArgsStruct]) -> Self {
        KernelFacts {
            libraries,
            float_kernels: &[FloatKernel::ROWS],
            args,
            constants: &[],
        }
    }
}

/// The entry point `<op>_<dtype>` (Op::entry_point), or `<op>_<suffix>_<dtype>` for an op's
/// auxiliary kernels.
pub(crate) fn entry(op: Op, suffix: Option<&str>, dtype: DType) -> String {
    match suffix {
        None => op.entry_point(dtype),
        Some(s) => format!("{}_{s}_{}", op.name(), dtype.name()),
    }
}

/// The entry points of `kernel`'s float kernels, named as [`entry`] names them: for each float
/// dtype, `<op>[_<suffix>]_<dtype>` runs `<op>[_<suffix>]_main(group, lid, DT_<DTYPE>)` with one
/// workgroup of [`WG`] invocations per group (`group` flattened by `group_index`), for the groups
/// below the kernel's [`FloatKernel::groups`] only.
fn float_entry_points(kernel: Kernel) -> String {
    let op = kernel.op();
    let mut out = String::new();
    for &FloatKernel { suffix, groups } in kernel.float_kernels() {
        let main = match suffix {
            None => format!("{}_main", op.name()),
            Some(s) => format!("{}_{s}_main", op.name()),
        };
        for dtype in DType::FLOATS {
            let name = entry(op, suffix, dtype);
            let dt = dtype.name().to_uppercase();
            // Writing to a String cannot fail.
            let _ = write!(
                out,
                "\n@compute @workgroup_size(WG)\n\
                 fn {name}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n    \
                 let g = group_index(wid, nwg);\n    \
                 if g >= {groups} {{\n        \
                 return;\n    \
                 }}\n    \
                 {main}(g, lid, DT_{dt});\n\
                 }}\n"
            );
        }
    }
    out
}

/// The index of a float dtype in the kernels (`DT_*`).
pub(crate) fn float_code(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 1,
        DType::BF16 => 2,
        _ => 0,
    }
}

// select.wgsl gathers the members of a selection (top-p candidates, logprobs top-K) into arrays of
// MAX_CANDIDATES entries.
const _: () = assert!(abi::MAX_LOGPROBS_TOP_K <= abi::MAX_CANDIDATES);

/// The constants every module sees, from `backend_api::abi` (never re-typed in WGSL): one
/// `const NAME: u32 = <value>u;` each, a 64-bit value as its halves `NAME_LO`, `NAME_HI`.
pub(crate) fn prelude() -> String {
    let min_weight_key = (2f32).powi(-(abi::WEIGHT_BITS as i32)).to_bits();
    let (seed_lo, seed_hi) = split_u64(abi::MAX_INFER_SEED);
    let (total_lo, total_hi) = split_u64(abi::REJECTION_MAX_TOTAL_WEIGHT);
    let constants = [
        ("WG", WG),
        ("SLOT_WG", SLOT_WG),
        ("PHILOX_M0", abi::PHILOX_M0),
        ("PHILOX_M1", abi::PHILOX_M1),
        ("PHILOX_W0", abi::PHILOX_W0),
        ("PHILOX_W1", abi::PHILOX_W1),
        ("PHILOX_ROUNDS", u(abi::PHILOX_ROUNDS)),
        ("MAX_INFER_SEED_LO", seed_lo),
        ("MAX_INFER_SEED_HI", seed_hi),
        ("WEIGHT_BITS", abi::WEIGHT_BITS),
        ("TOP_P_BITS", abi::TOP_P_BITS),
        ("MAX_CANDIDATES", u(abi::MAX_CANDIDATES)),
        ("MAX_LOGPROBS_TOP_K", u(abi::MAX_LOGPROBS_TOP_K)),
        ("SHARD_KEY_ID_BITS", abi::SHARD_KEY_ID_BITS),
        ("MAX_SHARD_RECORDS", u(abi::MAX_SHARD_RECORDS)),
        ("REJECTION_MAX_TOTAL_WEIGHT_LO", total_lo),
        ("REJECTION_MAX_TOTAL_WEIGHT_HI", total_hi),
        ("MIN_WEIGHT_KEY", min_weight_key),
        ("PURPOSE_SAMPLE", 0),
        ("PURPOSE_CANDIDATE", 1),
        ("PURPOSE_ACCEPT", 2),
        ("PURPOSE_RESIDUAL", 3),
        ("DT_F32", 0),
        ("DT_F16", 1),
        ("DT_BF16", 2),
    ];
    let mut out = String::from("// Generated by specula-backend-wgpu from backend_api::abi.\n");
    for (name, value) in constants {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "const {name}: u32 = {value}u;");
    }
    out + &logits_prelude()
}

/// The constants of `docs/semantics.md` §4b from `backend_api::logit_weights`: `LOG2E_Q63` as two halves,
/// the gap's fraction bits and limit, the polynomial's coefficients `EXP2_A0 ..= EXP2_A6`, and the
/// bounds of its `sanitize_logit` as f32 bit patterns.
fn logits_prelude() -> String {
    let mut out = format!(
        "const LOG2E_Q63_LO: u32 = {lo}u;\n\
         const LOG2E_Q63_HI: u32 = {hi}u;\n\
         const GAP_FRACTION_BITS: u32 = {f}u;\n\
         const GAP_LIMIT: u32 = {limit}u;\n\
         const LOGIT_TINY_BITS: u32 = {tiny:#x}u;\n\
         const LOGIT_HUGE_BITS: u32 = {huge:#x}u;\n",
        lo = logit_weights::LOG2E_Q63 as u32,
        hi = (logit_weights::LOG2E_Q63 >> 32) as u32,
        f = logit_weights::GAP_FRACTION_BITS,
        limit = logit_weights::GAP_LIMIT,
        tiny = logit_weights::logit_tiny_bits(),
        huge = logit_weights::logit_huge_bits(),
    );
    for (k, a) in logit_weights::EXP2_COEFFICIENTS.iter().enumerate() {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "const EXP2_A{k}: u32 = {a}u;");
    }
    out
}

/// A kernel of a module: the entry points `<op>[_<suffix>]_<dtype>` of `kernel`'s module, whose
/// uniform at `args_binding` is an `A` (its [`kernel_args!`](specula_backend_api::kernel_args)
/// struct) after the head `H` its kernels share (`()`: none; [`RowHead`]: the row kernels';
/// [`BatchHead`]: the batch kernels').
/// Declared once per kernel beside its host code; dispatches and the module's generated argument
/// structs both come from it.
#[derive(Debug)]
pub(crate) struct Entry<A, H = ()> {
    kernel: Kernel,
    suffix: Option<&'static str>,
    args_binding: u32,
    args: PhantomData<fn() -> (H, A)>,
}

/// The fields a kernel's uniform holds before those of its own argument struct: the same in Rust
/// (the head's bytes, then the struct's) and in the generated WGSL struct.
pub(crate) trait Head: bytemuck::Pod {
    /// The head's fields, in order (none for `()`).
    const FIELDS: &'static [KernelField];
}

impl Head for () {
    const FIELDS: &'static [KernelField] = &[];
}

specula_backend_api::kernel_args! {
    /// The head of a row kernel's uniform (one workgroup per row): rows `row0 .. row0 + rows` of
    /// a `[.., vocab]` matrix, the chunk a dispatch covers (`ops::row_chunk_dispatches` fills it).
    pub(crate) struct RowHead {
        rows: u32,
        vocab: u32,
        row0: u32,
    }
}

impl Head for RowHead {
    const FIELDS: &'static [KernelField] = <RowHead as KernelArgs>::FIELDS;
}

specula_backend_api::kernel_args! {
    /// The head of a batch kernel's uniform: the call's batch shape ([`BatchDims`]; `step_tokens`
    /// is `S`).
    pub(crate) struct BatchHead {
        max_bsz: u32,
        real_bsz: u32,
        step_tokens: u32,
    }
}

impl Head for BatchHead {
    const FIELDS: &'static [KernelField] = <BatchHead as KernelArgs>::FIELDS;
}

impl BatchHead {
    /// The head of a call of batch shape `dims`.
    pub(crate) fn of(dims: &BatchDims) -> Self {
        BatchHead {
            max_bsz: u(dims.max_bsz),
            real_bsz: u(dims.real_bsz),
            step_tokens: u(dims.max_step_tokens),
        }
    }
}

impl<A: KernelArgs, H: Head> Entry<A, H> {
    /// The kernel `<op>[_<suffix>]` of `kernel`'s module, its arguments bound at `args_binding`.
    pub(crate) const fn new(
        kernel: Kernel,
        suffix: Option<&'static str>,
        args_binding: u32,
    ) -> Self {
        Entry {
            kernel,
            suffix,
            args_binding,
            args: PhantomData,
        }
    }

    /// The module.
    pub(crate) fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// The entry point for `dtype`.
    pub(crate) fn name(&self, dtype: DType) -> String {
        entry(self.kernel.op(), self.suffix, dtype)
    }

    /// The binding of the argument struct.
    pub(crate) fn args_binding(&self) -> u32 {
        self.args_binding
    }

    /// The argument struct, as generated into the module.
    pub(crate) const fn args(&self) -> ArgsStruct {
        ArgsStruct::of::<A, H>(self.suffix, self.args_binding)
    }
}

/// A kernel's argument struct as the shaders see it, taken from its Rust declaration
/// ([`KernelArgs::STRUCT`] and [`KernelArgs::FIELDS`]): the WGSL struct is generated from it, so
/// the uniform's layout is defined once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ArgsStruct {
    /// The struct's name, in Rust and in WGSL.
    pub(crate) name: &'static str,
    /// The fields of its [`Head`], first in the uniform.
    pub(crate) head: &'static [KernelField],
    /// Its own fields, in order, every one a `u32`.
    pub(crate) fields: &'static [KernelField],
    /// The suffix of the kernel whose uniform it is (`<op>[_<suffix>]_<dtype>`).
    pub(crate) suffix: Option<&'static str>,
    /// The size of the head and the Rust struct in bytes (checked against the shader by the tests).
    #[cfg(test)]
    pub(crate) bytes: usize,
    /// The binding of the uniform that holds it (checked against the shader by the tests).
    #[cfg(test)]
    pub(crate) binding: u32,
}

impl ArgsStruct {
    /// The struct of `A` after the head `H`, the uniform of the kernel `suffix` bound at
    /// `binding`. WGSL has no 64-bit integers, so every field must be a `u32` (a 64-bit host value
    /// is a `*_lo`, `*_hi` pair); used in a constant, another size fails to compile.
    pub(crate) const fn of<A: KernelArgs, H: Head>(
        suffix: Option<&'static str>,
        binding: u32,
    ) -> Self {
        assert!(
            all_u32(H::FIELDS) && all_u32(A::FIELDS),
            "WGSL argument fields are u32"
        );
        #[cfg(not(test))]
        let _ = binding;
        ArgsStruct {
            name: A::STRUCT,
            head: H::FIELDS,
            fields: A::FIELDS,
            suffix,
            #[cfg(test)]
            bytes: std::mem::size_of::<H>() + std::mem::size_of::<A>(),
            #[cfg(test)]
            binding,
        }
    }

    /// Every field, the head's first, as the uniform holds them.
    pub(crate) fn all_fields(&self) -> impl Iterator<Item = &'static KernelField> {
        self.head.iter().chain(self.fields)
    }

    /// The WGSL declaration: `struct Name {\n    field: u32,\n    ...\n}`.
    pub(crate) fn wgsl(&self) -> String {
        let mut out = format!("struct {} {{\n", self.name);
        for field in self.all_fields() {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "    {}: u32,", field.name);
        }
        out.push_str("}\n");
        out
    }
}

/// Whether every field is a `u32`.
const fn all_u32(fields: &[KernelField]) -> bool {
    let mut i = 0;
    while i < fields.len() {
        if fields[i].bytes != 4 {
            return false;
        }
        i += 1;
    }
    true
}

/// The whole source of a module: prelude, the module's constants, argument structs, common helpers, libraries, the op's
/// file, the generated entry points of its float kernels.
pub(crate) fn shader_source(kernel: Kernel) -> String {
    let mut source = prelude();
    for (name, value) in kernel.facts().constants {
        // Writing to a String cannot fail.
        let _ = writeln!(source, "const {name}: u32 = {value}u;");
    }
    for args in kernel.args() {
        source.push_str(&args.wgsl());
    }
    source.push_str(COMMON);
    for library in kernel.facts().libraries {
        for text in library.texts() {
            source.push_str(text);
        }
    }
    source.push_str(kernel.body());
    source.push_str(&float_entry_points(kernel));
    source
}

/// Reflection of the shader modules with naga, for the tests: every module validates, and every
/// uniform it binds is a generated [`ArgsStruct`] with the layout of its Rust twin.
#[cfg(test)]
pub(crate) mod reflect {
    use wgpu::naga;

    use super::{ArgsStruct, Kernel, shader_source};

    /// The parsed module of `source` (panics with the compiler's message, under `what`, when it
    /// does not parse).
    pub(crate) fn parse(what: &str, source: &str) -> naga::Module {
        match naga::front::wgsl::parse_str(source) {
            Ok(m) => m,
            Err(e) => panic!("{what}: {}", e.emit_to_string(source)),
        }
    }

    /// The parsed module of `kernel`.
    pub(crate) fn module(kernel: Kernel) -> naga::Module {
        parse(&kernel.file(), &shader_source(kernel))
    }

    /// The uniforms of `module`: their binding and the name of their struct.
    pub(crate) fn uniform_structs(module: &naga::Module) -> Vec<(u32, String)> {
        module
            .global_variables
            .iter()
            .filter(|(_, var)| var.space == naga::AddressSpace::Uniform)
            .map(|(_, var)| {
                let binding = var.binding.as_ref().map_or(u32::MAX, |b| b.binding);
                let name = module.types[var.ty].name.clone().unwrap_or_default();
                (binding, name)
            })
            .collect()
    }

    /// Checks the WGSL struct named as `args` in `module` against the Rust struct: the same member
    /// names in the same order, every member a `u32` at offset `4·i` (uniform layout of an
    /// all-u32 struct), and the same total size.
    pub(crate) fn check_layout(module: &naga::Module, args: &ArgsStruct) -> Result<(), String> {
        let name = args.name;
        let (members, span) = module
            .types
            .iter()
            .find_map(|(_, ty)| match &ty.inner {
                naga::TypeInner::Struct { members, span } if ty.name.as_deref() == Some(name) => {
                    Some((members, *span))
                }
                _ => None,
            })
            .ok_or_else(|| format!("struct {name} is not in the shader"))?;
        let u32_scalar = naga::TypeInner::Scalar(naga::Scalar::U32);
        let found: Vec<(String, u32, bool)> = members
            .iter()
            .map(|m| {
                let is_u32 = module.types[m.ty].inner == u32_scalar;
                (m.name.clone().unwrap_or_default(), m.offset, is_u32)
            })
            .collect();
        let expected: Vec<(String, u32, bool)> = (0u32..)
            .zip(args.all_fields())
            .map(|(i, f)| (f.name.to_owned(), 4 * i, f.bytes == 4))
            .collect();
        if found != expected {
            return Err(format!(
                "struct {name}: the shader has (name, offset, u32) {found:?}, Rust has {expected:?}"
            ));
        }
        if usize::try_from(span).ok() != Some(args.bytes) {
            return Err(format!(
                "struct {name}: {span} bytes in the shader, {} in Rust",
                args.bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use wgpu::naga;

    use super::*;

    #[test]
    fn every_op_has_a_module_that_validates_with_naga() {
        for op in Op::ALL {
            let kernel = Kernel::of(op).expect("every op of the table has a kernel");
            assert_eq!(kernel.op(), op);
            assert_eq!(kernel.file(), format!("{}.wgsl", op.name()));
            let module = reflect::module(kernel);
            let mut validator = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::default(),
            );
            if let Err(e) = validator.validate(&module) {
                panic!(
                    "{}: {}",
                    kernel.file(),
                    e.emit_to_string(&shader_source(kernel))
                );
            }
            assert!(
                module
                    .entry_points
                    .iter()
                    .any(|e| e.name.starts_with(op.name())),
                "{}: no entry point named after the op",
                kernel.file()
            );
            for &FloatKernel { suffix, .. } in kernel.float_kernels() {
                for dtype in DType::FLOATS {
                    let name = entry(op, suffix, dtype);
                    assert!(
                        module.entry_points.iter().any(|e| e.name == name),
                        "{}: no entry point {name}",
                        kernel.file()
                    );
                }
            }
        }
        assert_eq!(Kernel::of(Op::Memory), None);
    }

    #[test]
    fn the_warm_up_list_is_every_entry_point_of_every_module() {
        for op in Op::ALL {
            let kernel = Kernel::of(op).expect("a contract op");
            let module = reflect::module(kernel);
            let declared: BTreeSet<String> =
                module.entry_points.iter().map(|e| e.name.clone()).collect();
            let listed: Vec<String> = kernel.entry_points(&DType::FLOATS);
            let unique: BTreeSet<String> = listed.iter().cloned().collect();
            assert_eq!(unique.len(), listed.len(), "{}: duplicates", kernel.file());
            assert_eq!(unique, declared, "{}: entry points", kernel.file());
        }
    }

    #[test]
    fn every_uniform_is_a_generated_args_struct() {
        for op in Op::ALL {
            let kernel = Kernel::of(op).expect("a contract op");
            let module = reflect::module(kernel);
            for args in kernel.args() {
                if let Err(e) = reflect::check_layout(&module, args) {
                    panic!("{}: {e}", kernel.file());
                }
            }
            let uniforms: BTreeSet<(u32, String)> =
                reflect::uniform_structs(&module).into_iter().collect();
            let generated: BTreeSet<(u32, String)> = kernel
                .args()
                .iter()
                .map(|a| (a.binding, a.name.to_owned()))
                .collect();
            assert_eq!(uniforms, generated, "{}: uniform structs", kernel.file());
        }
    }

    #[test]
    fn a_mismatched_struct_is_reported() {
        specula_backend_api::kernel_args! {
            /// A struct of two fields.
            struct PairArgs { rows: u32, vocab: u32 }
        }
        let args = ArgsStruct::of::<PairArgs, ()>(None, 0);
        let generated = reflect::parse("generated", &args.wgsl());
        assert_eq!(reflect::check_layout(&generated, &args), Ok(()));
        let swapped = reflect::parse("swapped", "struct PairArgs { vocab: u32, rows: u32 }");
        assert!(reflect::check_layout(&swapped, &args).is_err());
        let wide = reflect::parse("wide", "struct PairArgs { rows: u32, vocab: vec2<u32> }");
        assert!(reflect::check_layout(&wide, &args).is_err());
        let other = reflect::parse("other", "struct OtherArgs { rows: u32, vocab: u32 }");
        assert!(reflect::check_layout(&other, &args).is_err());
    }

    #[test]
    fn a_head_comes_first_in_the_struct_and_the_uniform() {
        specula_backend_api::kernel_args! {
            /// A row kernel's own arguments.
            struct HeadedArgs { input_off: u32, out_off: u32 }
        }
        let args = ArgsStruct::of::<HeadedArgs, RowHead>(None, 3);
        assert_eq!(
            args.wgsl(),
            "struct HeadedArgs {\n    rows: u32,\n    vocab: u32,\n    row0: u32,\n    \
             input_off: u32,\n    out_off: u32,\n}\n"
        );
        assert_eq!((args.bytes, args.binding), (20, 3));
        let generated = reflect::parse("generated", &args.wgsl());
        assert_eq!(reflect::check_layout(&generated, &args), Ok(()));
        let headless = reflect::parse(
            "headless",
            "struct HeadedArgs { input_off: u32, out_off: u32 }",
        );
        assert!(reflect::check_layout(&headless, &args).is_err());
    }

    #[test]
    fn the_batch_head_is_the_batch_shape() {
        let head = BatchHead::of(&BatchDims::new(6, 4, 3));
        assert_eq!(
            head,
            BatchHead {
                max_bsz: 6,
                real_bsz: 4,
                step_tokens: 3
            }
        );
        let args = ArgsStruct::of::<RowHead, BatchHead>(None, 0);
        let names: Vec<&str> = args.all_fields().map(|f| f.name).collect();
        assert_eq!(
            names,
            [
                "max_bsz",
                "real_bsz",
                "step_tokens",
                "rows",
                "vocab",
                "row0"
            ]
        );
    }

    #[test]
    fn the_prelude_carries_the_abi_constants() {
        let p = prelude();
        assert!(p.contains(&format!("PHILOX_M0: u32 = {}u", abi::PHILOX_M0)));
        assert!(p.contains("MIN_WEIGHT_KEY: u32 = 729808896u"));
    }

    #[test]
    fn the_prelude_carries_the_logits_constants() {
        let p = prelude();
        // The bounds of sanitize_logit: exactly 2^-76 and 2^64.
        assert_eq!(logit_weights::logit_tiny_bits(), 0x1980_0000);
        assert!(p.contains("LOGIT_TINY_BITS: u32 = 0x19800000u"));
        assert!(p.contains("LOGIT_HUGE_BITS: u32 = 0x5f800000u"));
        assert!(p.contains("GAP_LIMIT: u32 = 671088640u"));
        assert!(p.contains("LOG2E_Q63_HI: u32 = 3098164009u"));
        assert!(p.contains("EXP2_A6: u32 = 232901u"));
    }
}
