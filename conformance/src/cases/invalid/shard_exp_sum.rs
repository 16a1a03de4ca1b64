//! `invalid::` cases of `shard_exp_sum`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, Short};
use super::{VOCAB, batch, broken, logit_rows};
use crate::cases::Case;
use crate::cases::generate::{f32s, u64s};
use crate::cases::shard_exp_sum::Params;
use crate::cases::sharded_rows::Slice;

/// `T_out` logits rows of `slice` with their row keys.
fn with_slice(slice: Slice) -> Case {
    let rows = batch().t_out();
    Case::new("baseline", Params { rows, slice })
        .with("logits", logit_rows(rows, slice.len.max(1)))
        .with("temperature", f32s(&[1.0, 0.7, 0.0, 2.5]))
        .with("row_key", u64s(&[1 << 51; 4]))
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with_slice(Slice::new(4, 4, VOCAB))]
}

/// Every `invalid::` case of `shard_exp_sum`.
pub(super) fn cases() -> Vec<Case> {
    let base = with_slice(Slice::new(4, 4, VOCAB));
    let mut out = broken(
        &base,
        &[
            ("logits", &[Dtype(DType::I32), Short, Foreign]),
            ("temperature", &[Dtype(DType::F16), Short]),
            ("row_key", &[Dtype(DType::I32), Short]),
        ],
    );
    out.extend(super::slice_cases(with_slice));
    out
}
