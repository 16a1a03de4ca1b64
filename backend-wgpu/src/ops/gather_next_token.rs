//! `gather_next_token` (`shaders/gather_next_token.wgsl`): one dispatch per chunk of input rows
//! (one in practice), a byte-exact copy per output word.

use specula_backend_api::ops::GatherNextTokenCall;
use specula_backend_api::{Op, Result};

use super::{Binder, chunks_or_empty, element_groups, u};
use crate::WgpuDevice;
use crate::kernels::{BatchHead, Entry, Kernel, KernelFacts};

specula_backend_api::kernel_args! {
    /// `gather_next_token_i32`, after its [`BatchHead`]: the output window in bytes and words, the
    /// input chunk, the layout.
    pub(crate) struct GatherNextTokenArgs {
        row_bytes: u32,
        out_byte_off: u32,
        out_bytes: u32,
        out_first_word: u32,
        out_words: u32,
        in_byte_off: u32,
        in_row_lo: u32,
        in_row_hi: u32,
        first_chunk: u32,
        token_num: u32,
        is_speculative: u32,
        cu_q_off: u32,
        this_time_off: u32,
        encoder_off: u32,
        cu_out_off: u32,
        batch_id_off: u32,
    }
}

/// `gather_next_token_i32`.
const GATHER: Entry<GatherNextTokenArgs, BatchHead> = Entry::new(Kernel::GatherNextToken, None, 0);

/// The facts of `shaders/gather_next_token.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::batch(&[GATHER.args()]);

/// Records and submits one dispatch per input chunk; with no input rows at all there is still a
/// zero-filling pass.
pub(crate) fn run(device: &WgpuDevice, mut call: GatherNextTokenCall<'_>) -> Result<()> {
    let op = Op::GatherNextToken;
    let (inputs, out, params, &rows) = call.parts();
    let dims = &params.dims;
    let es = inputs.hidden_states.dtype().size_bytes();
    // Offsets of 8-byte elements are in words, of smaller elements in elements (`Bound::index`).
    let unit = if es == 8 { 4 } else { es };
    let row_bytes = params.hidden * es;
    let out_bound = device.gpu.bind(op, out)?;
    let out_bytes = rows * row_bytes;
    let out_byte_off = out_bound.index as usize * unit;
    let first_word = out_byte_off / 4;
    let words = (out_byte_off + out_bytes).div_ceil(4) - first_word;
    let mut dispatches = Vec::new();
    let chunks = chunks_or_empty(
        device,
        inputs.hidden_states,
        params.token_num,
        params.hidden,
    );
    for (i, &(lo, hi)) in chunks.iter().enumerate() {
        let mut b = Binder::new(device, op);
        let in_off = b.rows(1, inputs.hidden_states, params.hidden, (lo, hi))?;
        b.bound(7, out_bound.clone());
        let args = GatherNextTokenArgs {
            row_bytes: u(row_bytes),
            out_byte_off: u(out_byte_off),
            out_bytes: u(out_bytes),
            out_first_word: u(first_word),
            out_words: u(words),
            in_byte_off: u(in_off as usize * unit),
            in_row_lo: u(lo),
            in_row_hi: u(hi),
            first_chunk: u32::from(i == 0),
            token_num: u(params.token_num),
            is_speculative: u32::from(params.is_speculative),
            cu_q_off: b.buffer(2, inputs.cu_seqlens_q)?,
            this_time_off: b.buffer(3, inputs.lens.seq_lens_this_time)?,
            encoder_off: b.buffer(4, inputs.lens.seq_lens_encoder)?,
            cu_out_off: b.buffer(5, inputs.layout.cu_seqlens_q_output)?,
            batch_id_off: b.buffer(6, inputs.layout.batch_id_per_token_output)?,
        };
        dispatches.push(b.batch_dispatch(&GATHER, dims, &args, element_groups(words)));
    }
    device.gpu.run(op, dispatches)
}
