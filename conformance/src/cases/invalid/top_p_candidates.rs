//! `invalid::` cases of `top_p_candidates`.

use specula_backend_api::DType;
use specula_backend_api::abi::MAX_CANDIDATES;

use super::Break::{Dtype, Foreign, HostDtype, Short};
use super::{CANDIDATES, VOCAB, batch, broken, host_top_p_cases, prob_rows, reject, vocab_cases};
use crate::cases::Case;
use crate::case::ErrorKind::InvalidArgument;
use crate::cases::generate::{f32s, i32s};
use crate::cases::top_p_candidates::Params;

/// The padded output rows of the batch (`real_bsz · S`, padding marked by
/// `batch_id_per_token_output`), with `vocab` and `candidates` as the parameters.
fn with(vocab: usize, candidates: usize) -> Case {
    let b = batch();
    let rows = b.capacity();
    let top_p: Vec<f32> = (0..rows).map(|r| [0.9, 0.5, 1.0][r % 3]).collect();
    let params = Params {
        rows,
        vocab,
        candidates,
        logits: false,
    };
    Case::new("baseline", params)
        .with("probs", prob_rows(rows, VOCAB))
        .with("top_p", f32s(&top_p))
        .with("batch_id_per_token_output", i32s(&b.batch_id(rows)))
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with(VOCAB, CANDIDATES)]
}

/// Every `invalid::` case of `top_p_candidates`.
pub(super) fn cases() -> Vec<Case> {
    let base = with(VOCAB, CANDIDATES);
    let mut out = broken(
        &base,
        &[
            ("probs", &[Dtype(DType::I32), Short, Foreign]),
            ("top_p", &[HostDtype(DType::U32), Short, Foreign]),
            (
                "batch_id_per_token_output",
                &[Dtype(DType::F32), Short, Foreign],
            ),
        ],
    );
    out.extend([
        reject(
            "candidates_zero",
            with(VOCAB, 0),
            InvalidArgument,
            "candidates",
        ),
        reject(
            "candidates_above_128",
            with(VOCAB, MAX_CANDIDATES + 1),
            InvalidArgument,
            "candidates",
        ),
    ]);
    out.extend(vocab_cases(|vocab| with(vocab, CANDIDATES)));
    out.extend(host_top_p_cases(&base, 8));
    out
}
