//! `accept_logprobs` (`shaders/accept_logprobs.wgsl`): the packing dispatch (one invocation), then
//! one workgroup per packed entry, one dispatch per logits chunk.

use specula_backend_api::ops::AcceptLogprobsCall;
use specula_backend_api::{Op, Result};

use super::{Binder, chunks_or_empty, u};
use crate::WgpuDevice;
use crate::kernels::{BatchHead, Entry, FloatKernel, Kernel, KernelFacts, Library};

specula_backend_api::kernel_args! {
    /// `accept_logprobs_pack_i32`, after its [`BatchHead`]: the packed offsets and one (token,
    /// source row) entry per accepted token.
    pub(crate) struct AcceptLogprobsPackArgs {
        rows: u32,
        accept_tokens_off: u32,
        accept_num_off: u32,
        encoder_off: u32,
        cu_out_off: u32,
        cu_accept_off: u32,
    }

    /// `accept_logprobs_<dtype>`: the entries whose source row lies in `row_lo .. row_hi`.
    pub(crate) struct AcceptLogprobsArgs {
        entries: u32,
        vocab: u32,
        top_k: u32,
        first_chunk: u32,
        row_lo: u32,
        row_hi: u32,
        logits_off: u32,
        temperature_off: u32,
        token_ids_off: u32,
        logprobs_off: u32,
        ranks_off: u32,
        top_ids_off: u32,
        top_logprobs_off: u32,
    }
}

/// `accept_logprobs_pack_i32`.
const PACK: Entry<AcceptLogprobsPackArgs, BatchHead> =
    Entry::new(Kernel::AcceptLogprobs, Some("pack"), 9);
/// `accept_logprobs_<dtype>`.
const SCORE: Entry<AcceptLogprobsArgs> = Entry::new(Kernel::AcceptLogprobs, None, 0);

/// The facts of `shaders/accept_logprobs.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts {
    libraries: &[Library::Select, Library::RowStats],
    float_kernels: &[FloatKernel {
        suffix: None,
        groups: "p.entries",
    }],
    args: &[PACK.args(), SCORE.args()],
    constants: &[],
};

/// Records and submits the packing dispatch and one scoring dispatch per logits chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: AcceptLogprobsCall<'_, '_>) -> Result<()> {
    let op = Op::AcceptLogprobs;
    let (inputs, out, params, &dtype) = call.parts();
    let dims = &params.dims;
    let shape = &params.shape;
    let entries = dims.max_bsz * dims.max_step_tokens;
    // Two words per entry: the token and its source row.
    let scratch = device.scratch("logprobs entries", (entries * 8) as u64)?;

    let mut b = Binder::new(device, op);
    b.scratch(15, &scratch);
    let args = AcceptLogprobsPackArgs {
        rows: u(shape.rows),
        accept_tokens_off: b.buffer(10, inputs.accept_tokens)?,
        accept_num_off: b.buffer(11, inputs.accept_num)?,
        encoder_off: b.buffer(12, inputs.seq_lens_encoder)?,
        cu_out_off: b.buffer(13, inputs.cu_seqlens_q_output)?,
        cu_accept_off: b.buffer(14, out.cu_accept)?,
    };
    let mut dispatches = vec![b.batch_dispatch(&PACK, dims, &args, 1)];

    for (i, &chunk) in chunks_or_empty(device, inputs.logits, shape.rows, shape.vocab)
        .iter()
        .enumerate()
    {
        let mut b = Binder::new(device, op);
        b.scratch(3, &scratch);
        let args = AcceptLogprobsArgs {
            entries: u(entries),
            vocab: u(shape.vocab),
            top_k: u(params.top_k),
            first_chunk: u32::from(i == 0),
            row_lo: u(chunk.0),
            row_hi: u(chunk.1),
            logits_off: b.rows(1, inputs.logits, shape.vocab, chunk)?,
            temperature_off: b.buffer(2, inputs.temperature)?,
            token_ids_off: b.buffer(4, out.token_ids)?,
            logprobs_off: b.buffer(5, out.logprobs)?,
            ranks_off: b.buffer(6, out.ranks)?,
            top_ids_off: b.buffer(7, out.top_ids)?,
            top_logprobs_off: b.buffer(8, out.top_logprobs)?,
        };
        dispatches.push(b.dispatch(&SCORE, dtype, &args, args.entries));
    }
    device.gpu.run(op, dispatches)
}
