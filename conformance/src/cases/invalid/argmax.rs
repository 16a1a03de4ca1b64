//! `invalid::` cases of `argmax`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, Short};
use super::{VOCAB, batch, logit_rows};
use crate::cases::Case;
use crate::cases::argmax::Params;

vocab_op_entries!(
    with_vocab,
    &[("input", &[Dtype(DType::I32), Short, Foreign])],
    |_| Vec::new(),
);

/// `T_out` rows of logits, with `vocab` as the parameter.
fn with_vocab(vocab: usize) -> Case {
    let rows = batch().t_out();
    Case::new("baseline", Params { rows, vocab }).with("input", logit_rows(rows, VOCAB))
}
