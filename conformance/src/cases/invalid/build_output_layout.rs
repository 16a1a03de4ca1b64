//! `invalid::` cases of `build_output_layout`.

use specula_backend_api::DType;

use super::Break::{Foreign, HostDtype, Long, Short};
use super::{batch, broken, dims_cases, host_lens_cases, reject};
use crate::case::ErrorKind::ShapeMismatch;
use crate::case::Dims;
use crate::cases::Case;
use crate::cases::build_output_layout::Params;

/// The batch's lengths with `dims` and `rows` (of `batch_id_per_token_output`) as the
/// parameters.
fn with(dims: Dims, rows: usize) -> Case {
    batch().with_lens(Case::new("baseline", Params { dims, rows }))
}

/// The valid call every case breaks: `rows` = `real_bsz · S`.
fn baseline() -> Case {
    let b = batch();
    with(b.dims, b.capacity())
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![baseline()]
}

/// Every `invalid::` case of `build_output_layout`.
pub(super) fn cases() -> Vec<Case> {
    let base = baseline();
    let b = batch();
    let mut out = broken(
        &base,
        &[
            ("seq_lens_this_time", &[HostDtype(DType::F32)]),
            ("seq_lens_encoder", &[HostDtype(DType::U32)]),
            ("seq_lens_this_time", &[Short]),
            ("seq_lens_encoder", &[Long]),
            ("seq_lens_this_time", &[Foreign]),
            ("seq_lens_encoder", &[Foreign]),
        ],
    );
    out.push(reject(
        "batch_id_per_token_output_below_real_bsz_s",
        with(b.dims, b.capacity() - 1),
        ShapeMismatch,
        "batch_id_per_token_output",
    ));
    out.extend(dims_cases(|dims| with(dims, b.capacity()), 4));
    out.extend(host_lens_cases(&base));
    out
}
