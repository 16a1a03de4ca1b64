//! `invalid::` cases of `gather_next_token`.

use specula_backend_api::DType;

use super::Break::{Dtype, Foreign, HostDtype, Long, Short};
use super::{HIDDEN, batch, broken, dims_cases, foreign, host_lens_cases, reject, resized};
use crate::case::ErrorKind::{InvalidArgument, ShapeMismatch};
use crate::case::Dims;
use crate::cases::Case;
use crate::cases::gather_next_token::Params;
use crate::cases::generate::{float_tensor, i32s};

/// The batch's packed hidden states (one row per input token) and layout, speculative (one
/// output row per layout row), with `dims`, `token_num` and `hidden` as the parameters.
fn with(dims: Dims, token_num: usize, hidden: usize) -> Case {
    let b = batch();
    let rows = b.token_num();
    let values: Vec<f32> = (0..rows * HIDDEN).map(|i| i as f32).collect();
    let params = Params {
        dims,
        token_num,
        hidden,
        is_speculative: true,
    };
    b.with_lens(Case::new("baseline", params))
        .with(
            "hidden_states",
            float_tensor(DType::F32, &[rows, HIDDEN], &values),
        )
        .with("cu_seqlens_q", i32s(&b.cu_seqlens_q()))
        .with("cu_seqlens_q_output", i32s(&b.cu_seqlens_q_output()))
        .with("batch_id_per_token_output", i32s(&b.batch_id(b.capacity())))
}

/// The valid call every case breaks.
fn baseline() -> Case {
    let b = batch();
    with(b.dims, b.token_num(), HIDDEN)
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![baseline()]
}

/// `token_num` other than the packed tokens of the host lengths, with hidden states to match.
fn token_num_case(what: &str, token_num: usize) -> Case {
    let b = batch();
    let case = resized(
        &with(b.dims, token_num, HIDDEN),
        "hidden_states",
        token_num * HIDDEN,
    );
    reject(what, case, InvalidArgument, "token_num")
}

/// The cases of the buffers: dtype, length, device, a layout below `real_bsz · S` rows.
fn buffer_cases(base: &Case) -> Vec<Case> {
    let batch_id = "batch_id_per_token_output";
    let mut out = broken(
        base,
        &[
            ("hidden_states", &[Long, Foreign]),
            ("cu_seqlens_q", &[Dtype(DType::F32), Long, Foreign]),
            ("seq_lens_this_time", &[HostDtype(DType::F32)]),
            ("seq_lens_encoder", &[Short]),
            ("cu_seqlens_q_output", &[Short, Foreign]),
            (batch_id, &[Dtype(DType::U32)]),
        ],
    );
    out.push(reject(
        "batch_id_per_token_output_below_real_bsz_s",
        resized(base, batch_id, batch().t_out()),
        ShapeMismatch,
        batch_id,
    ));
    out.push(foreign(base, batch_id));
    out
}

/// The cases of `hidden` and `token_num`, and sizes that overflow.
fn size_cases() -> Vec<Case> {
    let b = batch();
    let huge_batch = Dims {
        max_bsz: usize::MAX,
        real_bsz: usize::MAX,
        max_step_tokens: 1,
    };
    vec![
        reject(
            "hidden_zero",
            with(b.dims, b.token_num(), 0),
            InvalidArgument,
            "hidden",
        ),
        token_num_case("token_num_below_host_sum", b.token_num() - 1),
        token_num_case("token_num_above_host_sum", b.token_num() + 1),
        reject(
            "hidden_states_size_overflows",
            with(b.dims, usize::MAX, HIDDEN),
            InvalidArgument,
            "hidden_states",
        ),
        // `real_bsz + 1` must not be computed before the `[max_bsz]` buffers are checked.
        reject(
            "batch_dims_usize_max",
            with(huge_batch, b.token_num(), HIDDEN),
            ShapeMismatch,
            "seq_lens_this_time",
        ),
    ]
}

/// Every `invalid::` case of `gather_next_token`.
pub(super) fn cases() -> Vec<Case> {
    let base = baseline();
    let token_num = batch().token_num();
    let mut out = buffer_cases(&base);
    out.extend(size_cases());
    out.extend(dims_cases(|dims| with(dims, token_num, HIDDEN), 4));
    out.extend(host_lens_cases(&base));
    out
}
