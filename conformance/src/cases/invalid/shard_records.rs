//! `invalid::` cases of `shard_records`.

use specula_backend_api::DType;
use specula_backend_api::shard::KeyOrder;

use super::Break::{Dtype, Foreign, Short};
use super::{VOCAB, batch, broken, prob_rows, reject};
use crate::cases::Case;
use crate::case::ErrorKind::InvalidArgument;
use crate::cases::generate::{f32s, u64s};
use crate::cases::shard_records::Params;
use crate::cases::sharded_rows::{Slice, SliceRows};

/// `T_out` probability rows of `slice` with their row keys and min_p, `records` per row.
fn with(slice: Slice, records: usize) -> Case {
    let rows = batch().t_out();
    let params = Params { shard: SliceRows::new(rows, slice, false), records, order: KeyOrder::Rank };
    Case::new("baseline", params)
        .with("probs", prob_rows(rows, slice.len.max(1)))
        .with("row_key", u64s(&[1 << 60; 4]))
        .with("min_p", f32s(&[0.0, 0.1, 0.0, 0.5]))
}

fn with_slice(slice: Slice) -> Case {
    with(slice, 3)
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with_slice(Slice::new(2, 5, VOCAB))]
}

/// Every `invalid::` case of `shard_records`.
pub(super) fn cases() -> Vec<Case> {
    let slice = Slice::new(2, 5, VOCAB);
    let base = with_slice(slice);
    let mut out = broken(
        &base,
        &[
            ("probs", &[Dtype(DType::U64), Short, Foreign]),
            ("row_key", &[Dtype(DType::I32), Short, Foreign]),
            ("min_p", &[Dtype(DType::U32), Short]),
        ],
    );
    out.extend(super::slice_cases(with_slice));
    out.push(reject("records_zero", with(slice, 0), InvalidArgument, "records"));
    out.push(reject("records_above_1024", with(slice, 1025), InvalidArgument, "records"));
    out
}
