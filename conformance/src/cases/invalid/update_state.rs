//! `invalid::` cases of `update_state` (no host copies: every error is in a buffer or a
//! parameter). Only the read-only inputs can be foreign: the runner allocates the in/out state on
//! the device under test.

use specula_backend_api::DType;

use super::Break::{Dtype, Empty, Foreign, Long, Short};
use super::{END_TOKENS, MAX_MODEL_LEN, batch, broken, dims_cases, reject};
use crate::case::ErrorKind::InvalidArgument;
use crate::case::Dims;
use crate::cases::Case;
use crate::cases::generate::{i32s, u8s, u64s};
use crate::cases::update_state::Params;

/// The end of a step over the batch (slot 0 emitted 2 tokens, the prefill slot 1), with `dims`
/// and `max_model_len` as the parameters.
fn with(dims: Dims, max_model_len: usize) -> Case {
    let d = batch().dims;
    let n = d.max_bsz;
    let mut accept_tokens = vec![-1; n * d.max_step_tokens];
    accept_tokens[..4].copy_from_slice(&[2, 3, -1, 4]);
    let mut token_ids_all = vec![-1; n * MAX_MODEL_LEN];
    token_ids_all[..8].copy_from_slice(&[1, 2, 3, 4, 1, 2, 3, 4]);
    token_ids_all[MAX_MODEL_LEN..MAX_MODEL_LEN + 5].copy_from_slice(&[5, 4, 3, 2, 1]);
    let mut draft_tokens = vec![0; n * d.max_step_tokens];
    draft_tokens[..4].copy_from_slice(&[5, 2, 3, 7]);
    Case::new(
        "baseline",
        Params {
            dims,
            max_model_len,
            vocab: None,
        },
    )
    .with("accept_tokens", i32s(&accept_tokens))
    .with("is_block_step", u8s(&vec![0; n]))
    .with("prompt_lens", i32s(&[4, 5, 0, 0]))
    .with("max_dec_len", i32s(&vec![100; n]))
    .with("end_tokens", i32s(&END_TOKENS))
    .with("accept_num", i32s(&[2, 1, 0, 0]))
    .with("stop_flags", u8s(&vec![0; n]))
    .with("token_ids_all", i32s(&token_ids_all))
    .with("step_idx", i32s(&[4, 0, 0, 0]))
    .with("infer_seed", u64s(&[100, 200, 300, 400]))
    .with("draft_tokens", i32s(&draft_tokens))
    .with("seq_lens_encoder", i32s(&[0, 5, 0, 0]))
    .with("seq_lens_decoder", i32s(&[8, 0, 0, 0]))
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with(batch().dims, MAX_MODEL_LEN)]
}

/// Every `invalid::` case of `update_state`.
pub(super) fn cases() -> Vec<Case> {
    let d = batch().dims;
    let base = with(d, MAX_MODEL_LEN);
    // max_bsz · S = 2^70: the product fails before any buffer is looked at.
    let huge = Dims {
        max_bsz: 1 << 40,
        real_bsz: d.real_bsz,
        max_step_tokens: 1 << 30,
    };
    let mut out = broken(
        &base,
        &[
            ("accept_tokens", &[Dtype(DType::F32), Short, Foreign]),
            ("is_block_step", &[Dtype(DType::I32)]),
            ("prompt_lens", &[Long, Foreign]),
            ("max_dec_len", &[Short, Foreign]),
            ("end_tokens", &[Empty, Foreign]),
            ("accept_num", &[Dtype(DType::U32)]),
            ("stop_flags", &[Long]),
            ("token_ids_all", &[Long]),
            ("step_idx", &[Dtype(DType::F32)]),
            ("infer_seed", &[Dtype(DType::U32)]),
            ("draft_tokens", &[Short]),
            ("seq_lens_encoder", &[Dtype(DType::U32)]),
            ("seq_lens_decoder", &[Short]),
        ],
    );
    out.extend([
        reject(
            "accept_tokens_size_overflows",
            with(huge, MAX_MODEL_LEN),
            InvalidArgument,
            "accept_tokens",
        ),
        reject(
            "token_ids_all_size_overflows",
            with(d, usize::MAX),
            InvalidArgument,
            "token_ids_all",
        ),
    ]);
    out.extend(dims_cases(|dims| with(dims, MAX_MODEL_LEN), 4));
    out.extend(counts_cases(&base));
    out
}

/// The optional token counts: the wrong length or dtype, and a zero vocabulary.
fn counts_cases(base: &Case) -> Vec<Case> {
    let n = batch().dims.max_bsz;
    let with_counts = |vocab: usize, len: usize| {
        let mut case = base.clone().with("token_counts", i32s(&vec![0; len]));
        if let crate::cases::CaseParams::UpdateState(p) = &mut case.params {
            p.vocab = Some(vocab);
        }
        case
    };
    let mut out = broken(
        &with_counts(5, n * 5),
        &[("token_counts", &[Dtype(DType::F32), Short])],
    );
    out.push(reject(
        "token_counts_vocab_zero",
        with_counts(0, 0),
        InvalidArgument,
        "vocab",
    ));
    out
}
