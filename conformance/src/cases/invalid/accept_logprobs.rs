//! `invalid::` cases of `accept_logprobs`.

use specula_backend_api::DType;
use specula_backend_api::abi::MAX_LOGPROBS_TOP_K;

use super::Break::{Dtype, Foreign, HostDtype, Long, Short};
use super::{
    LOGPROBS_TOP_K, VOCAB, batch, broken, dims_cases, host_temperature_cases, logit_rows, reject,
    vocab_cases,
};
use crate::case::ErrorKind::InvalidArgument;
use crate::case::Dims;
use crate::cases::Case;
use crate::cases::accept_logprobs::Params;
use crate::cases::generate::{f32s, i32s};

/// The scalar parameters of a call over the batch.
struct Scalars {
    dims: Dims,
    rows: usize,
    vocab: usize,
    top_k: usize,
}

/// What verification accepted for the batch (slot 0: 2 tokens, the prefill slot 1: 1) and the
/// `T_out` logit rows, with `scalars` as the parameters.
fn with(scalars: Scalars) -> Case {
    let b = batch();
    let d = b.dims;
    let mut accept_tokens = vec![-1; d.max_bsz * d.max_step_tokens];
    accept_tokens[..4].copy_from_slice(&[2, 3, -1, 4]);
    let Scalars {
        dims,
        rows,
        vocab,
        top_k,
    } = scalars;
    Case::new(
        "baseline",
        Params {
            dims,
            rows,
            vocab,
            top_k,
        },
    )
    .with("logits", logit_rows(b.t_out(), VOCAB))
    .with("temperature", f32s(&[1.0, 1.0, 0.5, 0.0]))
    .with("accept_tokens", i32s(&accept_tokens))
    .with("accept_num", i32s(&[2, 1, 0, 0]))
    .with("seq_lens_encoder", i32s(&b.encoder))
    .with("cu_seqlens_q_output", i32s(&b.cu_seqlens_q_output()))
}

/// The baseline's parameters.
fn scalars() -> Scalars {
    let b = batch();
    Scalars {
        dims: b.dims,
        rows: b.t_out(),
        vocab: VOCAB,
        top_k: LOGPROBS_TOP_K,
    }
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with(scalars())]
}

/// Every `invalid::` case of `accept_logprobs`.
pub(super) fn cases() -> Vec<Case> {
    let base = with(scalars());
    let mut out = broken(
        &base,
        &[
            ("logits", &[Dtype(DType::I32), Short, Foreign]),
            ("temperature", &[HostDtype(DType::U32), Long, Foreign]),
            ("accept_tokens", &[Short]),
            ("accept_num", &[Dtype(DType::U32), Foreign]),
            ("seq_lens_encoder", &[Dtype(DType::U32)]),
            ("cu_seqlens_q_output", &[Short]),
        ],
    );
    out.extend([
        reject(
            "top_k_above_64",
            with(Scalars {
                top_k: MAX_LOGPROBS_TOP_K + 1,
                ..scalars()
            }),
            InvalidArgument,
            "top_k",
        ),
        reject(
            "logits_size_overflows",
            with(Scalars {
                rows: usize::MAX,
                ..scalars()
            }),
            InvalidArgument,
            "logits",
        ),
    ]);
    out.extend(vocab_cases(|vocab| with(Scalars { vocab, ..scalars() })));
    out.extend(host_temperature_cases(&base, 2));
    // The runner sizes the packed outputs `max_bsz · S`: the `S > i32::MAX` case has no slots.
    out.extend(dims_cases(|dims| with(Scalars { dims, ..scalars() }), 0));
    out
}
