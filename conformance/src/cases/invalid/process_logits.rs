//! `invalid::` cases of `process_logits`: every buffer's dtype, length and device, the shapes of
//! the optional masks, and the host-side values §6 forbids (non-finite or out-of-range penalties,
//! ids outside the vocabulary, malformed bad words).

use specula_backend_api::DType;
use specula_backend_api::ops::process_logits::mask_words;

use super::Break::{Dtype, Empty, Foreign, HostDtype, Long, Short};
use super::{VOCAB, bad_entry, batch, broken, dims_cases, reject, vocab_cases};
use crate::case::ErrorKind::{InvalidArgument, ShapeMismatch};
use crate::case::Dims;
use crate::cases::Case;
use crate::cases::process_logits::Setup;

/// The output rows of the batch (capacity `real_bsz · S`) with every parameter on, processed as
/// logits; `dims` and `vocab` are the parameters.
fn with(dims: Dims, vocab: usize) -> Case {
    let mut setup = baseline_setup();
    setup.batch.dims = dims;
    let mut case = setup.case("baseline".into());
    if let crate::cases::CaseParams::ProcessLogits(p) = &mut case.params {
        p.vocab = vocab;
    }
    case
}

/// The host inputs of the baseline.
fn baseline_setup() -> Setup {
    let b = batch();
    let rows = b.capacity();
    let n = b.dims.max_bsz;
    let words = mask_words(VOCAB);
    Setup {
        batch: b.clone(),
        vocab: VOCAB,
        max_model_len: 16,
        rows,
        dtype: DType::F32,
        scores: (0..rows * VOCAB).map(|i| (i % 7) as f32 - 3.0).collect(),
        temperature: Some(vec![1.0; rows]),
        batch_id: b.batch_id(rows),
        cu_out: b.cu_seqlens_q_output(),
        token_ids_all: (0..n * 16).map(|i| (i % VOCAB) as i32).collect(),
        prompt_lens: vec![4, 5, 0, 0],
        step_idx: vec![4, 0, 0, 0],
        draft_tokens: vec![1; n * b.dims.max_step_tokens],
        token_counts: vec![1; n * VOCAB],
        prompt_mask: vec![0b1011; n * words],
        penalties: [1.2, 1.0 / 1.2, 0.5, 0.25, 0.1].repeat(n),
        min_tokens: vec![6, 0, 0, 0],
        end_tokens: vec![7],
        bias_offsets: vec![0, 2, 2, 2, 2],
        bias_ids: vec![3, 5],
        bias_values: vec![-1.5, 2.0],
        bad_word_offsets: vec![0, 5, 5, 5, 5],
        bad_words: vec![1, 4, 2, 1, 2],
        allowed: Some(vec![0xff; n * words]),
        bitmask: Some(vec![0xfe; rows * words]),
    }
}

/// The valid call every case breaks.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    vec![with(batch().dims, VOCAB)]
}

/// Every `invalid::` case of `process_logits`.
pub(super) fn cases() -> Vec<Case> {
    let base = with(batch().dims, VOCAB);
    let mut out = broken(
        &base,
        &[
            ("logits", &[Dtype(DType::I32), Short, Foreign]),
            ("temperature", &[HostDtype(DType::U32), Short]),
            ("cu_seqlens_q_output", &[Dtype(DType::F32), Short, Long]),
            ("batch_id_per_token_output", &[Short, Foreign]),
            ("token_ids_all", &[Dtype(DType::U32), Short]),
            ("prompt_lens", &[Short]),
            ("step_idx", &[Long]),
            ("draft_tokens", &[Short, Foreign]),
            ("token_counts", &[Dtype(DType::F32), Short]),
            ("prompt_mask", &[Dtype(DType::I32), Long]),
            ("penalties", &[HostDtype(DType::I32), Short]),
            ("min_tokens", &[Short]),
            ("end_tokens", &[Empty]),
            ("bias_offsets", &[Short]),
            ("bias_ids", &[Empty]),
            ("bias_values", &[Long]),
            ("bad_word_offsets", &[Long]),
            ("bad_words", &[Empty, Foreign]),
            ("allowed", &[Short, Dtype(DType::I32)]),
            ("bitmask", &[Long, Foreign]),
        ],
    );
    let host = |what: &str, name: &str, index: usize, value: f32| {
        bad_entry(&base, what, name, index, value)
    };
    out.extend([
        host("repetition_zero", "penalties", 0, 0.0),
        host("repetition_negative", "penalties", 5, -1.0),
        host("frequency_nan", "penalties", 2, f32::NAN),
        host("presence_infinite", "penalties", 3, f32::INFINITY),
        host("min_p_above_one", "penalties", 4, 1.5),
        host("min_p_negative", "penalties", 9, -0.1),
        host("bias_value_infinite", "bias_values", 1, f32::NEG_INFINITY),
    ]);
    let id = |what: &str, name: &str, index: usize, value: i32| {
        bad_entry(&base, what, name, index, value)
    };
    out.extend([
        id("bias_id_negative", "bias_ids", 0, -1),
        id("bias_id_at_vocab", "bias_ids", 1, VOCAB as i32),
        id("bad_word_token_at_vocab", "bad_words", 3, VOCAB as i32),
        id("bad_word_length_zero", "bad_words", 0, 0),
        id("bad_word_length_past_the_list", "bad_words", 2, 3),
    ]);
    // More rows than the layout holds: the scores, temperatures and bitmask hold one row past
    // `batch_id_per_token_output` (whose length is the layout's capacity), so that every other
    // check passes and the capacity check is the one that refuses the rows' buffer.
    let mut st = baseline_setup();
    st.rows += 1;
    st.scores.extend((0..VOCAB).map(|v| v as f32));
    if let Some(t) = st.temperature.as_mut() {
        t.push(1.0);
    }
    if let Some(m) = st.bitmask.as_mut() {
        m.extend(std::iter::repeat_n(u32::MAX, mask_words(VOCAB)));
    }
    out.push(reject(
        "rows_above_layout_capacity",
        st.case("baseline".into()),
        ShapeMismatch,
        "logits",
    ));
    // A block past the last row.
    let mut block = base.clone();
    if let crate::cases::CaseParams::ProcessLogits(p) = &mut block.params {
        p.block = Some((p.rows - 1, 2));
    }
    out.push(reject("block_past_the_rows", block, InvalidArgument, "block"));
    // A slice of the ids (§4d) past the vocabulary, and an empty one.
    for (what, slice) in [("slice_past_the_vocab", (2, VOCAB)), ("slice_empty", (0, 0))] {
        let mut sliced = base.clone();
        if let crate::cases::CaseParams::ProcessLogits(p) = &mut sliced.params {
            p.slice = Some(slice);
        }
        out.push(reject(what, sliced, InvalidArgument, "slice"));
    }
    out.extend(vocab_cases(|vocab| with(batch().dims, vocab)));
    out.extend(dims_cases(|dims| with(dims, VOCAB), 0));
    out
}
