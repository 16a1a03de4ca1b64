//! `invalid::` cases of `top_k_top_p_sample`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, HostDtype, Long, Short};
use super::{VOCAB, batch, host_top_p_cases, prob_rows, reject};
use crate::case::ErrorKind::InvalidArgument;
use crate::cases::process_logits::golden_setups;
use crate::cases::top_k_top_p_sample::processed_case;
use crate::cases::Case;
use crate::cases::generate::{f32s, i32s, u64s};
use crate::cases::top_k_top_p_sample::Params;

vocab_op_entries!(
    with_vocab,
    &[
        ("probs", &[Dtype(DType::I32), Short, Foreign]),
        ("top_k", &[Dtype(DType::F32), Short]),
        ("top_p", &[HostDtype(DType::U32), Long]),
        ("seed", &[Dtype(DType::U32), Short, Foreign]),
    ],
    |base| {
        let mut out = host_top_p_cases(base, 2);
        out.push(processed_with_fallback());
        out
    },
);

/// `T_out` rows of probabilities with per-row `top_k`, `top_p` and seeds, with `vocab` as the
/// parameter.
fn with_vocab(vocab: usize) -> Case {
    let rows = batch().t_out();
    Case::new(
        "baseline",
        Params {
            rows,
            vocab,
            logits: false,
            processing: None,
        },
    )
    .with("probs", prob_rows(rows, VOCAB))
    .with("top_k", i32s(&[0, 2, 3, 8]))
    .with("top_p", f32s(&[0.9, 0.5, 1.0, 0.7]))
    .with("seed", u64s(&[100, 104, 108, 200]))
}

/// The fused sampling of processed rows given a `fallback` input: the processing makes the
/// fallbacks, so the call is rejected (`docs/semantics.md` §5.12).
fn processed_with_fallback() -> Case {
    let [base, ..] = golden_setups();
    let case = processed_case("fallback".to_owned(), &base).with("fallback", i32s(&[0, 1]));
    reject("processed_with_fallback", case, InvalidArgument, "fallback")
}
