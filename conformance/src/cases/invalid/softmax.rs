//! `invalid::` cases of `softmax`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, HostDtype, Long};
use super::{VOCAB, batch, host_temperature_cases, logit_rows, vocab_op_cases};
use crate::cases::Case;
use crate::cases::generate::f32s;
use crate::cases::softmax::Params;

/// `T_out` rows of logits and their temperatures (0 included), with `vocab` as the parameter.
fn with_vocab(vocab: usize) -> Case {
    let rows = batch().t_out();
    Case::new("baseline", Params { rows, vocab })
        .with("logits", logit_rows(rows, VOCAB))
        .with("temperature", f32s(&[1.0, 0.5, 0.0, 2.0]))
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with_vocab(VOCAB)]
}

/// Every `invalid::` case of `softmax`.
pub(super) fn cases() -> Vec<Case> {
    let (base, mut out) = vocab_op_cases(
        with_vocab,
        &[
            ("logits", &[Dtype(DType::U32), Long, Foreign]),
            ("temperature", &[HostDtype(DType::I32), Long, Foreign]),
        ],
    );
    out.extend(host_temperature_cases(&base, 1));
    out
}
