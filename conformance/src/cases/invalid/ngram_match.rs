//! `invalid::` cases of `ngram_match` (no host copies: every error is in a buffer or a
//! parameter). Only the read-only inputs can be foreign: the runner allocates `draft_tokens` and
//! `seq_lens_this_time` (in/out) on the device under test.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, Long, Short};
use super::{MAX_MODEL_LEN, batch, broken, dims_cases, reject};
use crate::case::ErrorKind::InvalidArgument;
use crate::case::Dims;
use crate::cases::Case;
use crate::cases::generate::i32s;
use crate::cases::ngram_match::Params;

/// Slot 0 decodes with a history that repeats its prompt, slot 1 prefills; n-grams of 1 ..= 3.
fn with(dims: Dims, max_model_len: usize, min_ngram_size: usize, max_ngram_size: usize) -> Case {
    let d = batch().dims;
    let n = d.max_bsz;
    let mut token_ids_all = vec![-1; n * MAX_MODEL_LEN];
    token_ids_all[..10].copy_from_slice(&[10, 20, 30, 40, 50, 60, 10, 20, 30, 40]);
    let mut draft_tokens = vec![0; n * d.max_step_tokens];
    draft_tokens[0] = 40;
    let params = Params {
        dims,
        max_model_len,
        max_ngram_size,
        min_ngram_size,
        threshold: 128,
    };
    Case::new("baseline", params)
        .with("token_ids_all", i32s(&token_ids_all))
        .with("prompt_lens", i32s(&[6, 5, 0, 0]))
        .with("step_idx", i32s(&[4, 0, 0, 0]))
        .with("draft_token_num", i32s(&vec![2; n]))
        .with("seq_lens_encoder", i32s(&[0, 5, 0, 0]))
        .with("max_dec_len", i32s(&vec![10; n]))
        .with("draft_tokens", i32s(&draft_tokens))
        .with("seq_lens_this_time", i32s(&[1, 5, 0, 0]))
}

/// The valid call every case breaks.
fn baseline() -> Case {
    with(batch().dims, MAX_MODEL_LEN, 1, 3)
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![baseline()]
}

/// Every `invalid::` case of `ngram_match`.
pub(super) fn cases() -> Vec<Case> {
    let d = batch().dims;
    let base = baseline();
    let ngram = |what, min, max| {
        let case = with(d, MAX_MODEL_LEN, min, max);
        reject(what, case, InvalidArgument, "min_ngram_size")
    };
    let mut out = broken(
        &base,
        &[
            ("token_ids_all", &[Dtype(DType::U32), Short, Foreign]),
            ("prompt_lens", &[Dtype(DType::F32)]),
            ("step_idx", &[Foreign]),
            ("draft_token_num", &[Long]),
            ("seq_lens_encoder", &[Dtype(DType::U32)]),
            ("max_dec_len", &[Short, Foreign]),
            ("draft_tokens", &[Short]),
            ("seq_lens_this_time", &[Dtype(DType::F32), Long]),
        ],
    );
    out.extend([
        ngram("min_ngram_size_zero", 0, 3),
        ngram("min_ngram_size_above_max", 4, 3),
        ngram("max_ngram_size_zero", 1, 0),
        reject(
            "token_ids_all_size_overflows",
            with(d, usize::MAX, 1, 3),
            InvalidArgument,
            "token_ids_all",
        ),
    ]);
    out.extend(dims_cases(|dims| with(dims, MAX_MODEL_LEN, 1, 3), 4));
    out
}
