//! `invalid::` cases of `shard_key`.

use specula_backend_api::DType;
use specula_backend_api::shard::KeyOrder;

use super::Break::{Dtype, Foreign, Short};
use super::{VOCAB, batch, broken, logit_rows, reject};
use crate::cases::Case;
use crate::case::ErrorKind::InvalidArgument;
use crate::cases::generate::{f32s, i32s};
use crate::cases::shard_key::Params;
use crate::cases::sharded_rows::{Slice, SliceRows};

/// `T_out` logits rows of `slice`, with per-row ids.
fn with_slice(slice: Slice) -> Case {
    let rows = batch().t_out();
    let params = Params { shard: SliceRows::new(rows, slice, true), order: KeyOrder::Rank };
    Case::new("baseline", params)
        .with("logits", logit_rows(rows, slice.len.max(1)))
        .with("temperature", f32s(&vec![1.0; rows]))
        .with("ids", i32s(&[0, 3, 5, 7]))
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with_slice(Slice::new(3, 4, VOCAB))]
}

/// Every `invalid::` case of `shard_key`.
pub(super) fn cases() -> Vec<Case> {
    let base = with_slice(Slice::new(3, 4, VOCAB));
    let mut out = broken(
        &base,
        &[
            ("logits", &[Dtype(DType::I32), Short, Foreign]),
            ("ids", &[Dtype(DType::U32), Short]),
        ],
    );
    out.extend(super::slice_cases(with_slice));
    out.push(reject("slice_len_zero", with_slice(Slice::new(3, 0, VOCAB)), InvalidArgument, "slice"));
    out
}
