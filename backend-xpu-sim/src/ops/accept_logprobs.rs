//! `accept_logprobs` (`docs/semantics.md` §5.11, `kernels/accept_logprobs.cl`), two kernels:
//! `accept_logprobs_pack` (cluster 0 packs the accepted tokens and writes `cu_accept`; it runs on
//! every call, even one without rows, since the front never skips this op), then
//! `accept_logprobs_<dtype>` (one cluster per packed entry scores it).

use specula_backend_api::Result;
use specula_backend_api::WarmUp;
use specula_backend_api::ops::AcceptLogprobsCall;

use super::{ArgsStruct, count, float_program, scratch_i32};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `accept_logprobs_pack`.
    pub(crate) struct AcceptLogprobsPackArgs {
        max_bsz: u32,
        real_bsz: u32,
        max_step_tokens: u32,
        rows: u32,
    }

    /// The parameters of `accept_logprobs_<dtype>`.
    pub(crate) struct AcceptLogprobsArgs {
        entries: u32,
        vocab: u32,
        top_k: u32,
    }
}

/// The argument structs of `kernels/accept_logprobs.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[
    ArgsStruct::of::<AcceptLogprobsPackArgs>(),
    ArgsStruct::of::<AcceptLogprobsArgs>(),
];

/// The kernel that packs the accepted tokens (in the program of each float dtype).
const PACK: &str = "accept_logprobs_pack";

/// Launches the pack, then the scoring; the source row of each packed entry passes between them
/// in a scratch buffer.
pub(crate) fn run(runtime: &Runtime, mut call: AcceptLogprobsCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, dtype) = call.parts();
    let dims = &params.dims;
    let entries = dims.max_bsz.saturating_mul(dims.max_step_tokens);
    let (key, entry) = float_program(specula_backend_api::Op::AcceptLogprobs, *dtype);
    let entry_row = scratch_i32(runtime, entries)?;
    let mut buffers = KernelBuffers::default();
    buffers
        .bind(&[
            inputs.accept_tokens,
            inputs.accept_num,
            inputs.seq_lens_encoder,
            inputs.cu_seqlens_q_output,
            out.cu_accept,
            out.token_ids,
        ])?
        .bind_scratch(&entry_row);
    let pack = AcceptLogprobsPackArgs {
        max_bsz: count(dims.max_bsz),
        real_bsz: count(dims.real_bsz),
        max_step_tokens: count(dims.max_step_tokens),
        rows: count(params.shape.rows),
    };
    runtime.launch(&key, PACK, &buffers, &pack)?;
    let mut buffers = KernelBuffers::default();
    buffers
        .bind(&[inputs.logits, inputs.temperature, out.token_ids])?
        .bind_scratch(&entry_row)
        .bind(&[out.logprobs, out.ranks, out.top_ids, out.top_logprobs])?;
    let score = AcceptLogprobsArgs {
        entries: count(entries),
        vocab: count(params.shape.vocab),
        top_k: count(params.top_k),
    };
    runtime.launch(&key, &entry, &buffers, &score)
}

/// The programs `run` may launch, one per float dtype, each with the pack and the scoring kernel
/// (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    let mut programs = super::float_programs(specula_backend_api::Op::AcceptLogprobs, plan);
    for (_, kernels) in &mut programs {
        kernels.insert(0, PACK.to_owned());
    }
    programs
}
