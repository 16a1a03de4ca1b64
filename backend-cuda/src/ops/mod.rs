//! One module per op, named as the op, beside its kernel file `kernels/<op>.cu`: each declares
//! what is known about that file (`KERNEL`: the shared headers it is built on, its entry points,
//! its element-type instances, its argument struct, declared here with
//! [`cuda_args!`](crate::args::cuda_args) and generated into the file's source), which
//! [`KernelFile::facts`](crate::kernels::KernelFile::facts) collects from the op table, and turns a
//! validated call into the op's argument block (window pointers and sizes) and launches the
//! kernels. Validation, the tracing span and the zero-row rule are the front's
//! ([`specula_backend_api::Device`]): a module here only runs when its op has something to do.

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

use specula_backend_api::{Op, Result};

use crate::error::CudaError;
use crate::kernels::{KernelFacts, KernelFile};
use crate::launch;

/// Collects the `KERNEL` of every op module from the op table.
macro_rules! kernel_facts {
    ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        impl KernelFile {
            /// What the op's host code (`ops/<op>.rs`, its `KERNEL`) declares about this file:
            /// its headers, entry points, instances and argument structs. Generated from the op
            /// table, so an op without its facts does not compile.
            pub const fn facts(self) -> &'static KernelFacts {
                match self {
                    $(KernelFile::$variant => &$name::KERNEL,)*
                }
            }
        }
    };
}

specula_backend_api::for_each_op!(kernel_facts);

/// A size as a `u32` kernel argument, or an error naming it.
pub(crate) fn to_u32(op: Op, what: &'static str, value: usize) -> Result<u32> {
    u32::try_from(value).map_err(|_| CudaError::TooLarge { what }.into_api(op.name()))
}

/// A grid dimension x of `value` blocks.
pub(crate) fn grid_x(op: Op, value: usize) -> Result<u32> {
    if value > launch::MAX_GRID_X {
        return Err(CudaError::TooLarge { what: "grid" }.into_api(op.name()));
    }
    to_u32(op, "grid", value)
}

/// A flag as a `u32` kernel argument.
pub(crate) fn flag(b: bool) -> u32 {
    u32::from(b)
}
