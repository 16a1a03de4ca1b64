//! `update_state` (`shaders/update_state.wgsl`): one dispatch, one invocation per slot.

use specula_backend_api::ops::UpdateStateCall;
use specula_backend_api::{Op, Result};

use super::{Binder, groups_for, u};
use crate::WgpuDevice;
use crate::kernels::{BatchHead, Entry, Kernel, KernelFacts, SLOT_WG};

specula_backend_api::kernel_args! {
    /// `update_state_i32`, after its [`BatchHead`]: the shape, the number of end tokens and the
    /// offset of every buffer.
    pub(crate) struct UpdateStateArgs {
        max_model_len: u32,
        end_count: u32,
        accept_tokens_off: u32,
        is_block_off: u32,
        prompt_lens_off: u32,
        max_dec_len_off: u32,
        end_tokens_off: u32,
        accept_num_off: u32,
        stop_flags_off: u32,
        token_ids_all_off: u32,
        step_idx_off: u32,
        infer_seed_off: u32,
        draft_tokens_off: u32,
        encoder_off: u32,
        decoder_off: u32,
        vocab: u32,
        has_counts: u32,
        counts_off: u32,
    }
}

/// `update_state_i32`.
const UPDATE: Entry<UpdateStateArgs, BatchHead> = Entry::new(Kernel::UpdateState, None, 0);

/// The facts of `shaders/update_state.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::batch(&[UPDATE.args()]);

/// Records and submits the dispatch.
pub(crate) fn run(device: &WgpuDevice, mut call: UpdateStateCall<'_, '_>) -> Result<()> {
    let op = Op::UpdateState;
    let (inputs, state, params, ()) = call.parts();
    let dims = &params.dims;
    let mut b = Binder::new(device, op);
    let args = UpdateStateArgs {
        max_model_len: u(params.max_model_len),
        end_count: u(inputs.end_tokens.len()),
        accept_tokens_off: b.buffer(1, inputs.accept_tokens)?,
        is_block_off: b.buffer(2, inputs.is_block_step)?,
        prompt_lens_off: b.buffer(3, inputs.prompt_lens)?,
        max_dec_len_off: b.buffer(4, inputs.max_dec_len)?,
        end_tokens_off: b.buffer(5, inputs.end_tokens)?,
        accept_num_off: b.buffer(6, state.accept_num)?,
        stop_flags_off: b.buffer(7, state.stop_flags)?,
        token_ids_all_off: b.buffer(8, state.token_ids_all)?,
        step_idx_off: b.buffer(9, state.step_idx)?,
        infer_seed_off: b.buffer(10, state.infer_seed)?,
        draft_tokens_off: b.buffer(11, state.draft_tokens)?,
        encoder_off: b.buffer(12, state.seq_lens_encoder)?,
        decoder_off: b.buffer(13, state.seq_lens_decoder)?,
        vocab: u(params.vocab),
        has_counts: u32::from(state.token_counts.is_some()),
        counts_off: b.optional(14, state.token_counts.as_deref())?,
    };
    let d = b.batch_dispatch(&UPDATE, dims, &args, groups_for(dims.real_bsz, SLOT_WG));
    device.gpu.run(op, vec![d])
}
