//! `invalid::` cases of `build_sampling_params`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, HostDtype, Long, Short};
use super::{
    batch, broken, dims_cases, host_lens_cases, host_temperature_cases, host_top_p_cases, reject,
    resized,
};
use crate::case::ErrorKind::ShapeMismatch;
use crate::case::Dims;
use crate::cases::Case;
use crate::cases::build_sampling_params::Params;
use crate::cases::generate::{f32s, i32s, u64s};

/// Per-slot sampling parameters (a temperature of 0 included) and the batch's lengths and
/// layout, with `dims` as the parameter.
fn with(dims: Dims) -> Case {
    let b = batch();
    b.with_lens(Case::new("baseline", Params { dims }))
        .with("top_p", f32s(&[0.9, 0.8, 0.7, 1.0]))
        .with("top_k", i32s(&[0, 2, 3, 4]))
        .with("temperature", f32s(&[1.0, 0.7, 0.0, 1.0]))
        .with("infer_seed", u64s(&[100, 200, 300, 400]))
        .with("cu_seqlens_q_output", i32s(&b.cu_seqlens_q_output()))
        .with("batch_id_per_token_output", i32s(&b.batch_id(b.capacity())))
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with(batch().dims)]
}

/// Every `invalid::` case of `build_sampling_params`.
pub(super) fn cases() -> Vec<Case> {
    let base = with(batch().dims);
    let batch_id = "batch_id_per_token_output";
    let mut out = broken(
        &base,
        &[
            ("top_p", &[HostDtype(DType::U32)]),
            ("temperature", &[HostDtype(DType::I32)]),
            ("seq_lens_encoder", &[HostDtype(DType::F32)]),
            ("top_p", &[Short]),
            ("temperature", &[Long]),
            ("top_k", &[Dtype(DType::U32), Short]),
            ("infer_seed", &[Dtype(DType::I32), Foreign]),
            ("seq_lens_this_time", &[Foreign]),
            ("cu_seqlens_q_output", &[Long, Foreign]),
            (batch_id, &[Dtype(DType::F32)]),
        ],
    );
    out.push(reject(
        "batch_id_per_token_output_below_real_bsz_s",
        resized(&base, batch_id, batch().t_out()),
        ShapeMismatch,
        batch_id,
    ));
    out.extend(dims_cases(with, 4));
    out.extend(host_lens_cases(&base));
    out.extend(host_top_p_cases(&base, 0));
    out.extend(host_temperature_cases(&base, 3));
    out
}
