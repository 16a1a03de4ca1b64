//! `invalid::` cases of `softmax`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, HostDtype, Long};
use super::{VOCAB, batch, host_temperature_cases, logit_rows};
use crate::cases::Case;
use crate::cases::generate::f32s;
use crate::cases::softmax::Params;

vocab_op_entries!(
    with_vocab,
    &[
        ("logits", &[Dtype(DType::U32), Long, Foreign]),
        ("temperature", &[HostDtype(DType::I32), Long, Foreign]),
    ],
    |base| host_temperature_cases(base, 1),
);

/// `T_out` rows of logits and their temperatures (0 included), with `vocab` as the parameter.
fn with_vocab(vocab: usize) -> Case {
    let rows = batch().t_out();
    Case::new("baseline", Params { rows, vocab })
        .with("logits", logit_rows(rows, VOCAB))
        .with("temperature", f32s(&[1.0, 0.5, 0.0, 2.0]))
}
