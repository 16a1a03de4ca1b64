//! `gather_next_token` (`docs/semantics.md` §5.2, `kernels/gather_next_token.cl`): one cluster per output row,
//! a bit copy.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::GatherNextTokenCall;
use specula_backend_api::{DType, Op, Result};

use super::{ArgsStruct, count, flag, program};
use crate::runtime::{KernelBuffers, ProgramKey, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `gather_next_token_<dtype>`.
    pub(crate) struct GatherNextTokenArgs {
        token_num: u64,
        hidden: u64,
        real_bsz: u32,
        max_step_tokens: u32,
        rows: u32,
        is_speculative: u32,
    }
}

/// The argument structs of `kernels/gather_next_token.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<GatherNextTokenArgs>()];

/// The unsigned integer type of a dtype's size (`ELEM`): the kernel moves bits, not values.
fn elem_type(dtype: DType) -> &'static str {
    match dtype.size_bytes() {
        1 => "uchar",
        2 => "ushort",
        8 => "ulong",
        _ => "uint",
    }
}

/// The program and entry point (`gather_next_token_<dtype>`) of hidden states of `dtype`.
fn gather_program(dtype: DType) -> (ProgramKey, String) {
    let entry = Op::GatherNextToken.entry_point(dtype);
    let key = program(
        Op::GatherNextToken,
        &[("ENTRY", &entry), ("ELEM", elem_type(dtype))],
    );
    (key, entry)
}

/// Launches `gather_next_token_<dtype>`.
pub(crate) fn run(runtime: &Runtime, mut call: GatherNextTokenCall<'_>) -> Result<()> {
    let (inputs, out, params, rows) = call.parts();
    let (key, entry) = gather_program(inputs.hidden_states.dtype());
    let (lens, layout) = (&inputs.lens, &inputs.layout);
    let buffers = KernelBuffers::of(&[
        inputs.hidden_states,
        inputs.cu_seqlens_q,
        lens.seq_lens_this_time,
        lens.seq_lens_encoder,
        layout.cu_seqlens_q_output,
        layout.batch_id_per_token_output,
        out,
    ])?;
    let args = GatherNextTokenArgs {
        token_num: params.token_num as u64,
        hidden: params.hidden as u64,
        real_bsz: count(params.dims.real_bsz),
        max_step_tokens: count(params.dims.max_step_tokens),
        rows: count(*rows),
        is_speculative: flag(params.is_speculative),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per dtype (the copy moves bits of any dtype; what the
/// warm-up builds).
pub(crate) fn programs(_plan: &WarmUp) -> Vec<super::Program> {
    DType::ALL
        .into_iter()
        .map(|dtype| super::single(gather_program(dtype)))
        .collect()
}
