//! `invalid::` cases of `verify_draft_tokens`: the shared inputs on TARGET_MATCH, each strategy's
//! own inputs on its baseline.

use specula_backend_api::abi::MAX_CANDIDATES;
use specula_backend_api::{DType, Strategy};

use super::Break::{Dtype, Empty, Foreign, HostDtype, Long, Short};
use super::{
    CANDIDATES, END_TOKENS, VOCAB, batch, broken, dims_cases, foreign, host_lens_cases, prob_rows,
    reject, too_long, too_short, vocab_cases, wrong_dtype,
};
use crate::case::ErrorKind::{InvalidArgument, ShapeMismatch};
use crate::case::Dims;
use crate::cases::{Case, CaseParams};
use crate::cases::generate::{f32s, i32s, u8s, u64s};
use crate::cases::verify_draft_tokens::Params;

/// The scalar parameters of a call over the batch: `rows` per-row inputs, `C` = [`CANDIDATES`].
fn params(dims: Dims, rows: usize, vocab: usize, strategy: Strategy) -> Params {
    Params {
        dims,
        rows,
        vocab,
        strategy: strategy.name().to_owned(),
        candidates: CANDIDATES,
        accept_all: false,
        reject_all: false,
        logits: false,
        draft_rows: None,
    }
}

/// The per-row inputs of `strategy` for `rows` output rows (`draft_rows` draft probability rows
/// of REJECTION).
fn strategy_inputs(case: Case, strategy: Strategy, rows: usize, draft_rows: usize) -> Case {
    match strategy {
        Strategy::Greedy | Strategy::TargetMatch => {
            let targets: Vec<i32> = (0..rows).map(|r| [2, 3, 1, 4][r % 4]).collect();
            case.with("target_tokens", i32s(&targets))
        }
        Strategy::TopP => {
            let ids: Vec<i32> = (0..rows * CANDIDATES)
                .map(|i| ((i / CANDIDATES + i % CANDIDATES) % VOCAB) as i32)
                .collect();
            let scores: Vec<f32> = (0..rows).flat_map(|_| [0.4, 0.3, 0.2, 0.1]).collect();
            case.with("candidate_ids", i32s(&ids))
                .with("candidate_scores", f32s(&scores))
                .with("candidate_lens", i32s(&vec![2; rows]))
        }
        Strategy::Rejection => case
            .with("target_probs", prob_rows(rows, VOCAB))
            .with("draft_probs", prob_rows(draft_rows, VOCAB))
            .with("top_k", i32s(&vec![0; rows]))
            .with("top_p", f32s(&vec![1.0; rows])),
    }
}

/// A call of `strategy` over the batch with `dims`, `rows` and `vocab` as the parameters and
/// `rows` per-row inputs.
fn with(dims: Dims, rows: usize, vocab: usize, strategy: Strategy) -> Case {
    let b = batch();
    let d = b.dims;
    let seeds: Vec<u64> = (0..rows as u64).map(|r| 100 + 4 * r).collect();
    let mut draft_tokens = vec![0; d.max_bsz * d.max_step_tokens];
    draft_tokens[..4].copy_from_slice(&[5, 2, 3, 7]);
    let case = b
        .with_lens(Case::new("baseline", params(dims, rows, vocab, strategy)))
        .with("draft_tokens", i32s(&draft_tokens))
        .with("cu_seqlens_q_output", i32s(&b.cu_seqlens_q_output()))
        .with("stop_flags", u8s(&vec![0; d.max_bsz]))
        .with("is_block_step", u8s(&vec![0; d.max_bsz]))
        .with("reasoning_status", i32s(&vec![0; d.max_bsz]))
        .with("step_idx", i32s(&[4, 0, 0, 0]))
        .with("max_dec_len", i32s(&vec![100; d.max_bsz]))
        .with("end_tokens", i32s(&END_TOKENS))
        .with("seeds", u64s(&seeds));
    let draft_rows = d.max_bsz * (d.max_step_tokens - 1);
    strategy_inputs(case, strategy, rows, draft_rows)
}

/// The valid call of `strategy` over the batch (`rows` = `T_out`).
fn baseline(strategy: Strategy) -> Case {
    let b = batch();
    with(b.dims, b.t_out(), VOCAB, strategy)
}

/// REJECTION's baseline with compact draft rows: 2 rows, the index alternating between them.
fn compact_baseline() -> Case {
    let b = batch();
    let dense_rows = b.dims.max_bsz * (b.dims.max_step_tokens - 1);
    let index: Vec<i32> = (0..dense_rows as i32).map(|r| r % 2).collect();
    let mut base = baseline(Strategy::Rejection)
        .with("draft_probs", prob_rows(2, VOCAB))
        .with("draft_index", i32s(&index));
    if let CaseParams::VerifyDraftTokens(p) = &mut base.params {
        p.draft_rows = Some(2);
    }
    base
}

/// The valid calls the cases break, one per strategy and REJECTION's compact form.
#[cfg(test)]
pub(super) fn baselines() -> Vec<Case> {
    let mut out: Vec<Case> = Strategy::ALL.into_iter().map(baseline).collect();
    out.push(compact_baseline());
    out
}

/// `invalid::<strategy>_<what>`: `case` renamed after its strategy.
fn named(strategy: Strategy, case: Case) -> Case {
    let what = case.name.trim_start_matches("invalid::");
    let name = format!("invalid::{strategy}_{what}");
    Case { name, ..case }
}

/// The cases of the inputs every strategy shares, on TARGET_MATCH.
fn shared_cases() -> Vec<Case> {
    let base = baseline(Strategy::TargetMatch);
    broken(
        &base,
        &[
            ("draft_tokens", &[Dtype(DType::F32), Long]),
            ("seq_lens_this_time", &[HostDtype(DType::U32)]),
            ("seq_lens_encoder", &[Short]),
            ("seq_lens_this_time", &[Foreign]),
            ("cu_seqlens_q_output", &[Short]),
            ("stop_flags", &[Dtype(DType::I32)]),
            ("is_block_step", &[Short]),
            ("reasoning_status", &[Dtype(DType::U8)]),
            ("step_idx", &[Foreign]),
            ("max_dec_len", &[Long]),
            ("end_tokens", &[Empty, Dtype(DType::U32), Foreign]),
            ("seeds", &[Dtype(DType::U32), Short, Foreign]),
        ],
    )
}

/// The cases of GREEDY's and TARGET_MATCH's `target_tokens`.
fn target_tokens_cases() -> Vec<Case> {
    let greedy = baseline(Strategy::Greedy);
    let target_match = baseline(Strategy::TargetMatch);
    vec![
        named(
            Strategy::Greedy,
            wrong_dtype(&greedy, "target_tokens", DType::F32),
        ),
        named(
            Strategy::TargetMatch,
            too_short(&target_match, "target_tokens"),
        ),
        named(
            Strategy::TargetMatch,
            foreign(&target_match, "target_tokens"),
        ),
    ]
}

/// The cases of TOPP's candidates and of `C`.
fn topp_cases() -> Vec<Case> {
    let base = baseline(Strategy::TopP);
    let b = batch();
    let with_candidates = |candidates| {
        let params = Params {
            candidates,
            ..params(b.dims, b.t_out(), VOCAB, Strategy::TopP)
        };
        Case {
            params: params.into(),
            ..base.clone()
        }
    };
    let candidates = broken(
        &base,
        &[
            ("candidate_ids", &[Dtype(DType::U32)]),
            ("candidate_scores", &[Dtype(DType::I32)]),
            ("candidate_lens", &[Dtype(DType::F32), Short]),
            ("candidate_scores", &[Foreign]),
        ],
    );
    let mut out: Vec<Case> = candidates
        .into_iter()
        .map(|case| named(Strategy::TopP, case))
        .collect();
    out.extend([
        reject(
            "topp_candidates_zero",
            with_candidates(0),
            InvalidArgument,
            "candidates",
        ),
        reject(
            "topp_candidates_above_128",
            with_candidates(MAX_CANDIDATES + 1),
            InvalidArgument,
            "candidates",
        ),
        reject(
            "topp_candidates_above_tensors",
            with_candidates(CANDIDATES + 1),
            ShapeMismatch,
            "candidate_ids",
        ),
    ]);
    out
}

/// The cases of REJECTION's probabilities (`rows` target rows, `max_bsz · (S − 1)` draft rows,
/// one `V`) and filter.
fn rejection_cases() -> Vec<Case> {
    let base = baseline(Strategy::Rejection);
    let b = batch();
    let draft_rows = b.dims.max_bsz * (b.dims.max_step_tokens - 1);
    let with_draft = |rows, vocab| base.clone().with("draft_probs", prob_rows(rows, vocab));
    let draft = |what, case| reject(what, case, ShapeMismatch, "draft_probs");
    let rejection = |case| named(Strategy::Rejection, case);
    vec![
        reject(
            "rejection_target_probs_one_row_more",
            base.clone()
                .with("target_probs", prob_rows(b.t_out() + 1, VOCAB)),
            ShapeMismatch,
            "target_probs",
        ),
        rejection(foreign(&base, "target_probs")),
        rejection(wrong_dtype(&base, "target_probs", DType::I32)),
        draft(
            "rejection_draft_probs_one_row_short",
            with_draft(draft_rows - 1, VOCAB),
        ),
        draft(
            "rejection_draft_probs_t_out_rows",
            with_draft(b.t_out(), VOCAB),
        ),
        draft(
            "rejection_draft_probs_other_vocab",
            with_draft(draft_rows, VOCAB + 1),
        ),
        rejection(wrong_dtype(&base, "draft_probs", DType::I32)),
        rejection(too_short(&base, "top_k")),
        rejection(wrong_dtype(&base, "top_p", DType::U32)),
    ]
    .into_iter()
    .chain(compact_rejection_cases())
    .collect()
}

/// The cases of REJECTION's compact draft rows (`docs/semantics.md` §5.8.1): a `draft_index` of
/// another dtype or length, and draft rows that are not a whole number `≥ 1` of rows of `V`.
fn compact_rejection_cases() -> Vec<Case> {
    let base = compact_baseline();
    let rows = |what, len: usize| {
        let case = base.clone().with("draft_probs", f32s(&vec![0.125; len]));
        reject(what, case, InvalidArgument, "draft_probs")
    };
    let rejection = |case| named(Strategy::Rejection, case);
    vec![
        rejection(wrong_dtype(&base, "draft_index", DType::U32)),
        rejection(too_short(&base, "draft_index")),
        rejection(too_long(&base, "draft_index")),
        rows("rejection_compact_draft_probs_not_whole_rows", 2 * VOCAB + 3),
        rows("rejection_compact_draft_probs_no_row", 0),
        rows("rejection_compact_draft_probs_part_of_a_row", VOCAB - 1),
    ]
}

/// `rows` = the capacity `real_bsz · S` instead of `T_out`, with per-row inputs to match: host
/// lengths require `T_out`.
fn rows_cases() -> Vec<Case> {
    let b = batch();
    Strategy::ALL
        .into_iter()
        .map(|strategy| {
            let case = with(b.dims, b.capacity(), VOCAB, strategy);
            let what = format!("{strategy}_rows_not_t_out");
            reject(&what, case, InvalidArgument, "rows")
        })
        .collect()
}

/// Every `invalid::` case of `verify_draft_tokens`.
pub(super) fn cases() -> Vec<Case> {
    let b = batch();
    let mut out = shared_cases();
    out.extend(target_tokens_cases());
    out.extend(topp_cases());
    out.extend(rejection_cases());
    out.extend(rows_cases());
    out.extend(vocab_cases(|vocab| {
        with(b.dims, b.t_out(), vocab, Strategy::TargetMatch)
    }));
    // The runner sizes `accept_tokens` as `max_bsz · S`: the `S > i32::MAX` case has no slots.
    let target_match = |dims| with(dims, b.t_out(), VOCAB, Strategy::TargetMatch);
    out.extend(dims_cases(target_match, 0));
    out.extend(host_lens_cases(&baseline(Strategy::TargetMatch)));
    out
}
