//! `invalid::` cases of `argmax`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, Short};
use super::{VOCAB, batch, logit_rows, vocab_op_cases};
use crate::cases::Case;
use crate::cases::argmax::Params;

/// `T_out` rows of logits, with `vocab` as the parameter.
fn with_vocab(vocab: usize) -> Case {
    let rows = batch().t_out();
    Case::new("baseline", Params { rows, vocab }).with("input", logit_rows(rows, VOCAB))
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with_vocab(VOCAB)]
}

/// Every `invalid::` case of `argmax`.
pub(super) fn cases() -> Vec<Case> {
    let (_, out) = vocab_op_cases(with_vocab, &[("input", &[Dtype(DType::I32), Short, Foreign])]);
    out
}
