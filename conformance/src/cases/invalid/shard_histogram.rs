//! `invalid::` cases of `shard_histogram`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, Long, Short};
use super::{VOCAB, batch, broken, logit_rows, reject};
use crate::cases::Case;
use crate::case::ErrorKind::InvalidArgument;
use crate::cases::generate::{f32s, u64s};
use crate::cases::shard_histogram::Params;
use crate::cases::sharded_rows::{Slice, SliceRows};

/// `T_out` logits rows of `slice` in the first round, `shift` as the parameter.
fn with(slice: Slice, shift: u32) -> Case {
    let rows = batch().t_out();
    let params = Params { shard: SliceRows::new(rows, slice, true), shift };
    Case::new("baseline", params)
        .with("logits", logit_rows(rows, slice.len.max(1)))
        .with("temperature", f32s(&[1.0, 0.7, 0.0, 2.5]))
        .with("row_key", u64s(&[1 << 51; 4]))
        .with("prefix", u64s(&[0; 4]))
        .with("floor", u64s(&[0; 4]))
}

fn with_slice(slice: Slice) -> Case {
    with(slice, 44)
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with_slice(Slice::new(0, VOCAB, VOCAB))]
}

/// Every `invalid::` case of `shard_histogram`.
pub(super) fn cases() -> Vec<Case> {
    let slice = Slice::new(0, VOCAB, VOCAB);
    let base = with_slice(slice);
    let mut out = broken(
        &base,
        &[
            ("logits", &[Dtype(DType::U32), Short]),
            ("temperature", &[Short]),
            ("row_key", &[Long]),
            ("prefix", &[Dtype(DType::I32), Short, Foreign]),
            ("floor", &[Dtype(DType::F32), Long]),
        ],
    );
    out.extend(super::slice_cases(with_slice));
    out.push(reject("shift_above_56", with(slice, 57), InvalidArgument, "shift"));
    out
}
