//! The op table: every op of the contract, named once.
//!
//! [`for_each_op!`](crate::for_each_op) hands the table to a macro, so the [`Op`] enum here, the
//! kernel registries of the accelerated backends (`kernels/<op>.cu`, `kernels/<op>.cl`,
//! `shaders/<op>.wgsl`) and the conformance case registry are all generated from this one list: an
//! op added here without a kernel file or a case module does not compile.

use crate::DType;

/// How a backend's outputs of an op are held to the reference (`docs/semantics.md` §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Exactness {
    /// Every output is bit-identical on every backend (`==`).
    Exact,
    /// Every output is a float compared within a per-dtype tolerance.
    Float,
    /// Ids, counts and ranks are exact; the log-probability values are float.
    Mixed,
}

/// One row of the op table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSpec {
    /// The snake_case name: the method of [`Device`](crate::Device), the stem of every kernel
    /// file (`<name>.cu`, `<name>.cl`, `<name>.wgsl`), the host file of every backend
    /// (`ops/<name>.rs`) and the conformance case module.
    pub name: &'static str,
    /// Its section in `docs/semantics.md`.
    pub section: &'static str,
    /// How its outputs are compared.
    pub exactness: Exactness,
    /// One line: what it computes.
    pub summary: &'static str,
}

/// Calls `$callback! { $(Variant name "section" Exactness "summary",)* }` with the op table.
///
/// Backends use it to derive their kernel registries, the conformance crate its case registry;
/// `backend-api` derives [`Op`], [`AnyCall`](crate::backend::AnyCall) and
/// [`dispatch_ops!`](crate::dispatch_ops) from it.
///
/// ```
/// macro_rules! count_ops {
///     ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
///         [$(stringify!($name)),*].len()
///     };
/// }
/// assert_eq!(specula_backend_api::for_each_op!(count_ops), specula_backend_api::Op::ALL.len());
/// ```
#[macro_export]
macro_rules! for_each_op {
    ($($callback:tt)+) => {
        $crate::__op_table! { [] $($callback)+ }
    };
}

/// The op table itself: `__op_table!([prefix] callback)` calls `callback! { prefix TABLE }`.
#[doc(hidden)]
#[macro_export]
macro_rules! __op_table {
    ([$($prefix:tt)*] $($callback:tt)+) => {
        $($callback)+ ! {
            $($prefix)*
            BuildOutputLayout build_output_layout "5.1" Exact
                "the output layout: rows per slot, prefix sums, the slot of each output row",
            GatherNextToken gather_next_token "5.2" Exact
                "the hidden-state row each output row predicts from (a bit-exact copy)",
            BuildSamplingParams build_sampling_params "5.3" Exact
                "per-slot top_p, top_k, temperature and seeds expanded per output row",
            Argmax argmax "5.4" Exact
                "per-row argmax: NaN lowest, -0 == +0, ties to the lowest id",
            Softmax softmax "5.5" Float
                "probabilities of logits / temperature",
            TopKTopPSample top_k_top_p_sample "5.6" Exact
                "exact top-k/top-p sampling with per-row seeds",
            TopPCandidates top_p_candidates "5.7" Exact
                "the first C tokens in rank order and the top-p prefix length",
            VerifyDraftTokens verify_draft_tokens "5.8" Exact
                "verify drafts and emit the correction or bonus token",
            UpdateState update_state "5.9" Exact
                "append the emitted tokens and advance the per-slot state",
            NgramMatch ngram_match "5.10" Exact
                "propose drafts by n-gram lookup in the prompt and the history",
            AcceptLogprobs accept_logprobs "5.11" Mixed
                "log-probabilities, ranks and top-K of the accepted tokens",
            ProcessLogits process_logits "5.12" Exact
                "penalties, bans, bias, masks and min_p applied to each row from its own history",
            ShardKey shard_key "5.13" Exact
                "sharded rows: the slice's largest rank key, or the key of a given token",
            ShardRecords shard_records "5.14" Exact
                "sharded rows: the slice's first K tokens in rank order as (key, weight) records",
            ShardHistogram shard_histogram "5.15" Exact
                "sharded rows: counts and masses of the next 8 key bits within a chosen prefix",
            ShardWalk shard_walk "5.16" Exact
                "sharded rows: the kept (or residual) mass of the slice and the walk from an offset",
            ShardExpSum shard_exp_sum "5.17" Float
                "sharded rows: the slice's sum of exp((l - m) / T) under the whole row's maximum",
        }
    };
}

/// The op table's gated entries: `__gated_op_table!([prefix] callback)` calls
/// `callback! { prefix $(Variant name BaseOp capability "section" "summary",)* }`.
///
/// A gated entry is an op in the table's sense — a [`Device`](crate::Device) method, validated
/// once by the front, an [`AnyCall`](crate::backend::AnyCall) variant a backend receives through
/// [`Backend::run`](crate::Backend::run) — that a device runs itself only when its
/// [`Capabilities`](crate::Capabilities) field `capability` is set. On any other device the front
/// runs the entry's fallback, `ops::<name>::fallback` (a composition of ops of the table), so
/// every device answers it and no backend writes it twice. Errors name `BaseOp`. A backend that
/// sets the capability routes the entry to its host code in
/// [`dispatch_ops!`](crate::dispatch_ops) (`dispatch_ops!(self, call; Variant => path)`).
#[doc(hidden)]
#[macro_export]
macro_rules! __gated_op_table {
    ([$($prefix:tt)*] $($callback:tt)+) => {
        $($callback)+ ! {
            $($prefix)*
            TopKTopPSampleProcessed top_k_top_p_sample_processed TopKTopPSample fused_processing "5.12"
                "top_k_top_p_sample of the rows process_logits makes, the processing applied as the sampling pass reads them",
        }
    };
}

macro_rules! define_ops {
    ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        /// The ops of the contract (plus the memory operations), for errors, spans and trial
        /// names. Generated from the op table ([`for_each_op!`](crate::for_each_op)).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op {
            /// Allocation, upload, write, download.
            Memory,
            $(
                #[doc = concat!("`", stringify!($name), "` (`docs/semantics.md` §", $section, "): ", $summary, ".")]
                $variant,
            )*
        }

        impl Op {
            /// Every op of the contract, in table order (memory operations excluded).
            pub const ALL: [Op; [$(stringify!($variant)),*].len()] = [$(Op::$variant),*];

            /// The op's row of the table; `None` for [`Op::Memory`].
            pub const fn spec(self) -> Option<&'static OpSpec> {
                match self {
                    Op::Memory => None,
                    $(Op::$variant => Some(&OpSpec {
                        name: stringify!($name),
                        section: $section,
                        exactness: Exactness::$exact,
                        summary: $summary,
                    }),)*
                }
            }

            /// The snake_case name, as in kernel file names and entry points (`memory` for
            /// [`Op::Memory`]).
            pub const fn name(self) -> &'static str {
                match self.spec() {
                    Some(spec) => spec.name,
                    None => "memory",
                }
            }
        }
    };
}

impl_named!(Op, "op");

for_each_op!(define_ops);

impl Op {
    /// How the op's outputs are compared ([`Exactness::Exact`] for [`Op::Memory`]).
    pub const fn exactness(self) -> Exactness {
        match self.spec() {
            Some(spec) => spec.exactness,
            None => Exactness::Exact,
        }
    }

    /// Whether the op is one of the per-rank ops of sharded rows (`docs/semantics.md` §4d), which
    /// a device runs when [`Capabilities::sharded`](crate::Capabilities::sharded) is set.
    pub const fn is_sharded(self) -> bool {
        matches!(
            self,
            Op::ShardKey | Op::ShardRecords | Op::ShardHistogram | Op::ShardWalk | Op::ShardExpSum
        )
    }

    /// The kernel entry-point name for this op and dtype, identical on every backend
    /// (`top_k_top_p_sample_f32`).
    pub fn entry_point(self, dtype: DType) -> String {
        format!("{}_{}", self.name(), dtype.name())
    }

    /// The op's kernel file with extension `ext` (`top_k_top_p_sample.cu`).
    pub fn kernel_file(self, ext: &str) -> String {
        format!("{}.{ext}", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut names: Vec<_> = Op::ALL.map(Op::name).to_vec();
        for op in Op::ALL {
            assert_eq!(op.name().parse::<Op>().ok(), Some(op));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Op::ALL.len());
        assert!("memory".parse::<Op>().is_err());
    }

    #[test]
    fn sections_follow_the_table_order() {
        for (i, op) in Op::ALL.into_iter().enumerate() {
            let spec = op.spec().expect("a contract op");
            assert_eq!(spec.section, format!("5.{}", i + 1), "{op}");
        }
        assert_eq!(Op::Softmax.exactness(), Exactness::Float);
        assert_eq!(Op::AcceptLogprobs.exactness(), Exactness::Mixed);
    }
}
