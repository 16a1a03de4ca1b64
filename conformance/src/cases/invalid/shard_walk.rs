//! `invalid::` cases of `shard_walk`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, Short};
use super::{VOCAB, batch, broken, prob_rows, reject};
use crate::cases::Case;
use crate::case::ErrorKind::InvalidArgument;
use crate::cases::generate::{i32s, u64s};
use crate::cases::shard_walk::Params;
use crate::cases::sharded_rows::{Slice, SliceRows};

/// `T_out` probability rows of `slice` with REJECTION's residual against 2 draft rows.
fn with_slice(slice: Slice) -> Case {
    let rows = batch().t_out();
    let params = Params { shard: SliceRows::new(rows, slice, false), draft_rows: 2 };
    Case::new("baseline", params)
        .with("probs", prob_rows(rows, slice.len.max(1)))
        .with("row_key", u64s(&[1 << 51; 4]))
        .with("threshold", u64s(&[0, 1 << 50, 0, 1 << 51]))
        .with("offset", u64s(&[0, 1 << 30, u64::MAX, 7]))
        .with("draft", prob_rows(2, slice.len.max(1)))
        .with("draft_key", u64s(&[1 << 51; 2]))
        .with("draft_row", i32s(&[0, 1, 1, 0]))
        .with("target_mass", u64s(&[1 << 40; 4]))
        .with("draft_mass", u64s(&[1 << 40; 4]))
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with_slice(Slice::new(1, 6, VOCAB))]
}

/// Every `invalid::` case of `shard_walk`.
pub(super) fn cases() -> Vec<Case> {
    let base = with_slice(Slice::new(1, 6, VOCAB));
    let mut out = broken(
        &base,
        &[
            ("probs", &[Short, Foreign]),
            ("threshold", &[Dtype(DType::I32), Short]),
            ("offset", &[Dtype(DType::F32), Foreign]),
            ("draft", &[Dtype(DType::BF16)]),
            ("draft_key", &[Short]),
            ("draft_row", &[Dtype(DType::U64), Short]),
            ("target_mass", &[Short]),
            ("draft_mass", &[Dtype(DType::I32)]),
        ],
    );
    let mut ragged = super::resized(&base, "draft", 6 * 2 - 1);
    ragged.params = base.params.clone();
    out.push(reject("draft_not_whole_rows", ragged, InvalidArgument, "draft"));
    out.extend(super::slice_cases(with_slice));
    out
}
