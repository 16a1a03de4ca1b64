//! The finish pipeline: the second half of a step, from the runner's scores to what each slot
//! emitted. One function per stage, in order:
//!
//! 1. `check_scores`: the scores have the plan's shape (`T_out ≤ R ≤ gather_rows` whole rows of
//!    `V`), logits when log-probabilities are configured, and REJECTION with drafts has the draft
//!    model's rows (draft logits only with target logits); every buffer the runner handed over
//!    belongs to the decoder's device and has a dtype (and length) its argument takes, an error
//!    naming the argument as the runner passed it (`check_buffers`). Decides the strategy the
//!    step runs and the rows verification reads.
//! 2. `prepare_scratch`: allocates the probability buffer on the first step that needs one and
//!    narrows the per-row buffers to the `R` rows.
//! 3. `softmax`: only for REJECTION given target logits and draft probabilities, whose rows must
//!    be of one kind: the target's probabilities at each row's temperature. Every other step
//!    samples from the logits themselves (`docs/semantics.md` §4b: exact integer weights, no
//!    softmax).
//! 4. `targets`: the strategy's target per row, from the logits at each row's temperature or
//!    from the probabilities: argmax (GREEDY), a top-k/top-p sample (TARGET_MATCH), top-p
//!    candidates (TOPP); REJECTION samples inside verification.
//! 5. `narrow_to_outputs`: the per-row buffers to the rows verification reads.
//! 6. `verify`: `verify_draft_tokens` decides each slot's accepted tokens.
//! 7. `logprobs`: `accept_logprobs` of the accepted tokens (when configured and a request of the
//!    step asks for them), before `update_state` turns prefill slots into decode slots.
//!
//! Verification reads the first `T_out` rows, except REJECTION with drafts, which reads all `R`
//! target rows: the runner's buffer cannot be narrowed, and `verify_draft_tokens` takes padded
//! per-row inputs (`rows > T_out`, never read past `T_out`) only without host slot lengths, so
//! those are passed only when `R == T_out`.
//!
//! [`verify_step`] runs stages 1–7 and returns a [`Verified`] token. Up to there the slot state is
//! untouched, so an error leaves the step planned and `finish` can be called again.
//!
//! 8. [`commit_on_device`] consumes the [`Verified`] token: `update_state` commits the step on the
//!    device, and the one transfer of the step's results starts: a [`Downloading`] value, which
//!    `Decoder::enqueue` keeps in its `PendingStep`. This is the point of no return: an error from
//!    here on ends the step.
//! 9. [`Downloading::wait`] (in `Decoder::collect`) waits once for the transfer and gives the
//!    [`Committed`] value; [`commit_on_host`] consumes it: each slot's emitted tokens, drafts
//!    accepted, log-probabilities and finish reason, into the slot table and the stats.

use specula_backend_api::ops::{
    CandidateInputs, CandidatesInputs, CandidatesOutputs, CandidatesParams, DecodeState, Logits,
    LogprobsInputs, LogprobsParams, OutputLayout, ProcessOutputs, ProcessParams, RejectionInputs,
    RowBlock, RowProcessing, RowShape, SampleInputs, SampleParams, Scores as RowScores,
    SoftmaxParams, StrategyInputs, UpdateStateInputs, UpdateStateParams, VerifyInputs,
    VerifyOutputs, VerifyParams, VerifySlotState,
};
use specula_backend_api::transfer::elements;
use specula_backend_api::{Buffer, DType, Device, DeviceExt, PendingDownload, Strategy, WriteAt};

use super::StepContext;
use super::slots::SlotTable;
use crate::buffers::{CandidateBuffers, ProcessedBuffers, Scratch, SlotBuffers, window, write_at};
use crate::config::SamplerConfig;
use crate::error::{Result, SamplerError};
use crate::step::{
    DecodeStats, Scores, SlotOutput, SlotPlan, StepOutput, StepPlan, StepScores, TokenLogprob,
};

/// The runner's scores, checked against the plan, and what follows from them.
struct Checked<'s> {
    /// `[R, V]` logits or probabilities.
    target: &'s Buffer,
    is_logits: bool,
    /// REJECTION with drafts: the draft model's rows (`None` otherwise).
    draft: Option<&'s Buffer>,
    /// The draft rows are compact: one per draft of the plan, in the plan's order.
    compact_draft: bool,
    /// The target's probabilities are computed by `softmax` (REJECTION with drafts, target
    /// logits, draft probabilities).
    softmax: bool,
    /// `R`.
    rows: usize,
    /// The rows verification reads: `R` for REJECTION with drafts, else `T_out`.
    verify_rows: usize,
    /// The strategy the step runs.
    strategy: Strategy,
    /// The rows go through `process_logits` first (`docs/semantics.md` §4c).
    processing: bool,
    /// The runner's token bitmask for the step.
    bitmask: Option<&'s Buffer>,
    /// `accept_logprobs` runs: log-probabilities are configured and a request of the step asks
    /// for them.
    logprobs: bool,
}

impl Checked<'_> {
    fn shape(&self, vocab: usize) -> RowShape {
        RowShape {
            rows: self.rows,
            vocab,
        }
    }
}

/// What the stages after the checks read besides the scratch buffers: the step, the slot
/// buffers, the checked scores and each row's temperature (the host copy).
#[derive(Clone, Copy)]
struct Stage<'a> {
    cx: &'a StepContext<'a>,
    state: &'a SlotBuffers,
    checked: &'a Checked<'a>,
    row_temperature: &'a [f32],
}

impl Stage<'_> {
    /// Every row of the step as one block.
    fn all_rows(&self) -> RowBlock {
        RowBlock {
            first: 0,
            rows: self.checked.rows,
        }
    }
}

/// Proof that stages 1–7 ran without error: the step is verified and nothing is committed yet.
/// Only [`verify_step`] makes one; [`commit_on_device`] consumes it.
pub(super) struct Verified {
    _sealed: (),
    /// The rows went through `process_logits` (their fallbacks tell masked rows).
    processed: bool,
    /// The targets were sampled by the fused call: a target of -1 tells a masked row.
    fused: bool,
    /// `accept_logprobs` ran.
    logprobs: bool,
}

/// A step committed on the device: what `update_state` left, downloaded. Only
/// [`commit_on_device`] makes one; [`commit_on_host`] consumes it. Once one exists (and from the
/// `update_state` call that precedes it) the step cannot be retried.
pub(super) struct Committed {
    /// The row fallbacks of a processed step (-1: every token of the row was masked).
    fallback: Option<Vec<i32>>,
    accept_tokens: Vec<i32>,
    accept_num: Vec<i32>,
    stop_flags: Vec<u8>,
    logprobs: Option<DownloadedLogprobs>,
}

// ----- before the commit -----

/// Stages 1–7: checks the scores and verifies the drafts, leaving the accepted tokens (and their
/// log-probabilities) in the scratch buffers.
pub(super) fn verify_step(
    cx: &StepContext<'_>,
    slots: &SlotTable,
    state: &SlotBuffers,
    sc: &mut Scratch,
    scores: StepScores<'_>,
) -> Result<Verified> {
    if let Some(sharding) = cx.sharding {
        return verify_sharded(cx, sharding, (slots, state), sc, scores);
    }
    let mut checked = check_scores(
        (cx.config, cx.width()),
        cx.plan,
        scores,
        wants_logprobs(cx, slots),
    )?;
    check_buffers(cx, &scores, checked.rows)?;
    checked.processing = processes(state, &checked);
    let row_temperature = row_temperatures(cx.plan, slots, checked.rows);
    prepare_scratch(cx, sc, &checked)?;
    let fused = checked.processing && fuses(cx, checked.strategy);
    let stage = Stage {
        cx,
        state,
        checked: &checked,
        row_temperature: &row_temperature,
    };
    match block_rows(cx, &checked) {
        _ if fused => fused_targets(stage, sc)?,
        Some(block_rows) => processed_targets_in_blocks(stage, sc, block_rows)?,
        None => {
            process(stage, sc, stage.all_rows())?;
            softmax(stage, sc)?;
            targets(stage, sc, stage.all_rows())?;
        }
    }
    narrow_to_outputs(cx, sc, &checked)?;
    verify(stage, slots, sc, None)?;
    logprobs(stage, sc)?;
    Ok(Verified {
        _sealed: (),
        processed: checked.processing,
        fused,
        logprobs: checked.logprobs,
    })
}

/// Whether `accept_logprobs` runs: log-probabilities are configured and a request of the step
/// asks for them.
fn wants_logprobs(cx: &StepContext<'_>, slots: &SlotTable) -> bool {
    cx.config.logprobs.is_some()
        && cx.plan.slots.iter().any(|p| {
            slots
                .get(p.slot)
                .is_some_and(|h| h.request.logprobs.is_some())
        })
}

/// Whether the step's rows go through `process_logits`: a request uses a parameter of §4c, or
/// the runner gave a bitmask.
fn processes(state: &SlotBuffers, checked: &Checked<'_>) -> bool {
    state
        .processing
        .as_ref()
        .is_some_and(|p| p.in_use() || checked.bitmask.is_some())
}

/// Stages 1–7 on one rank of a tensor-parallel decoder (`docs/semantics.md` §4d): the step is
/// first checked to be the same on every rank (its plan, requests and scores' shape), then
/// `process_logits` runs over the rank's slice, the strategy's targets come from the sharded
/// ops (written into the step's target buffers), verification runs replicated (REJECTION
/// through the sharded verification) and so do the log-probabilities (sharded).
fn verify_sharded(
    cx: &StepContext<'_>,
    sharding: &super::Sharding,
    (slots, state): (&SlotTable, &SlotBuffers),
    sc: &mut Scratch,
    scores: StepScores<'_>,
) -> Result<Verified> {
    let checked = check_scores(
        (cx.config, cx.width()),
        cx.plan,
        scores,
        wants_logprobs(cx, slots),
    )
    .and_then(|c| check_buffers(cx, &scores, c.rows).map(|()| c));
    let shape = match &checked {
        Ok(c) => Some(scores_fingerprint(
            (cx.device, cx.width()),
            c,
            processes(state, c),
        )?),
        Err(_) => None,
    };
    sharding.agree_on_step(cx.plan, slots, shape)?;
    let mut checked = checked?;
    checked.processing = processes(state, &checked);
    if checked.softmax {
        return Err(specula_shard::ShardError::InvalidArgument {
            what: "a tensor-parallel REJECTION step takes draft logits with target logits (the \
                   target's softmax is a float op: its probabilities could differ by rank)"
                .into(),
        }
        .into());
    }
    let row_temperature = row_temperatures(cx.plan, slots, checked.rows);
    prepare_scratch(cx, sc, &checked)?;
    let stage = Stage {
        cx,
        state,
        checked: &checked,
        row_temperature: &row_temperature,
    };
    process(stage, sc, stage.all_rows())?;
    let shard = sharding.shard(cx.device);
    let rows = step_rows(cx, &shard, slots, sc, &checked, &row_temperature)?;
    let scores = row_scores(
        &checked,
        None,
        sc.processed.as_ref(),
        &sc.row_temperature,
        &row_temperature,
    )?;
    let padding: Vec<bool> = (0..checked.rows).map(|r| r >= cx.plan.t_out()).collect();
    let candidates = sc.candidates.as_mut().map(|c| super::sharded::Candidates {
        ids: &mut c.ids,
        scores: &mut c.scores,
        lens: &mut c.lens,
        per_row: cx.config.candidates,
        padding: &padding,
    });
    super::sharded::targets(
        &shard,
        (checked.strategy, checked.processing),
        scores,
        &rows,
        (&mut sc.target_tokens, candidates),
    )?;
    narrow_to_outputs(cx, sc, &checked)?;
    verify(stage, slots, sc, Some(&rows))?;
    logprobs(stage, sc)?;
    Ok(Verified {
        _sealed: (),
        processed: checked.processing,
        fused: false,
        logprobs: checked.logprobs,
    })
}

/// A fingerprint of what a rank's scores are (their rows, kind and draft rows, the strategy,
/// whether they are processed and log-probabilities asked for) and of the runner's token
/// bitmask (its contents: every rank must pass the same, `docs/semantics.md` §4d).
fn scores_fingerprint(
    (device, width): (&dyn Device, usize),
    c: &Checked<'_>,
    processing: bool,
) -> Result<u64> {
    let bitmask = match c.bitmask {
        Some(mask) => {
            let words: Vec<u32> = device.download(mask)?;
            specula_shard::fingerprint(words.into_iter().map(u64::from))
        }
        None => 0,
    };
    Ok(specula_shard::fingerprint([
        c.rows as u64,
        u64::from(c.is_logits),
        c.draft
            .map_or(u64::MAX, |d| (d.len() / width.max(1)) as u64),
        u64::from(c.compact_draft),
        c.strategy as u64,
        u64::from(processing),
        u64::from(c.logprobs),
        c.bitmask.map_or(0, |m| m.len() as u64),
        bitmask,
    ]))
}

/// The host copies of the step's per-row parameters the sharded ops read (downloaded from the
/// per-row buffers `build_sampling_params` wrote), and under processing each row's min_p and
/// the whole rows' fallbacks (from the slices', one MAX), which then replace the slices' in the
/// fallback buffer the host reads after the step.
fn step_rows(
    cx: &StepContext<'_>,
    shard: &specula_shard::Shard<'_>,
    slots: &SlotTable,
    sc: &mut Scratch,
    checked: &Checked<'_>,
    row_temperature: &[f32],
) -> Result<super::sharded::StepRows> {
    let device = cx.device;
    let mut rows = super::sharded::StepRows {
        top_k: device.download(&sc.row_top_k)?,
        top_p: device.download(&sc.row_top_p)?,
        seed: device.download(&sc.row_seed)?,
        temperature: checked.is_logits.then(|| row_temperature.to_vec()),
        min_p: None,
        min_p_buffer: None,
        fallback: None,
    };
    let Some(processed) = sc.processed.as_mut().filter(|_| checked.processing) else {
        return Ok(rows);
    };
    let min_p: Vec<f32> = (0..checked.rows)
        .map(|r| {
            let slot = cx.plan.output_rows.get(r).map(|o| o.slot);
            slot.and_then(|b| slots.get(b))
                .map_or(0.0, |h| h.request.min_p)
        })
        .collect();
    let matrix = processed.rows.as_ref().ok_or_else(missing_processing)?;
    let scores = match checked.is_logits {
        true => RowScores::logits(matrix, &sc.row_temperature),
        false => RowScores::probs(matrix),
    };
    let fallback = specula_shard::row_fallbacks(shard, scores, &processed.fallback)?;
    device.write(&mut processed.fallback, &fallback)?;
    rows.min_p_buffer = Some(device.upload(&min_p)?);
    rows.min_p = Some(min_p);
    rows.fallback = Some(fallback);
    Ok(rows)
}

/// Stage 1: the scores fit the plan and the configuration (`logprobs`: a request of the step
/// asks for log-probabilities, which need logits).
fn check_scores<'s>(
    (config, width): (&SamplerConfig, usize),
    plan: &StepPlan,
    scores: StepScores<'s>,
    logprobs: bool,
) -> Result<Checked<'s>> {
    let target = scores.target.buffer();
    let is_logits = scores.target.is_logits();
    let rows = score_rows(width, plan, target)?;
    if logprobs && !is_logits {
        return Err(SamplerError::LogprobsNeedLogits);
    }
    let rejection = config.strategy == Strategy::Rejection && plan.drafts() > 0;
    let draft = if rejection {
        Some(check_draft(width, plan, scores)?)
    } else {
        None
    };
    Ok(Checked {
        target,
        is_logits,
        draft: draft.map(|d| d.buffer()),
        compact_draft: rejection && scores.compact_draft,
        softmax: is_logits && draft.is_some_and(|d| !d.is_logits()),
        rows,
        verify_rows: if rejection { rows } else { plan.t_out() },
        strategy: step_strategy(config.strategy, rejection),
        processing: false,
        bitmask: scores.bitmask,
        logprobs,
    })
}

/// Stage 1 too: every buffer the runner handed over belongs to the decoder's device and has the
/// dtype (and, for dense draft rows and the bitmask, the length) its argument takes, so that a
/// mistake is reported under the name the runner used (`StepScores::logits`,
/// `StepScores::with_bitmask`, ...) rather than as the refusal of an op the decoder calls.
fn check_buffers(cx: &StepContext<'_>, scores: &StepScores<'_>, rows: usize) -> Result<()> {
    const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];
    let vocab = cx.config.vocab;
    let target = match scores.target {
        Scores::Logits(_) => "StepScores::logits",
        Scores::Probs(_) => "StepScores::probs",
    };
    check_buffer(cx.device, target, scores.target.buffer(), FLOATS, None)?;
    let rejection = cx.config.strategy == Strategy::Rejection && cx.plan.drafts() > 0;
    if let (true, Some(draft)) = (rejection, scores.draft) {
        let argument = match (draft.is_logits(), scores.compact_draft) {
            (true, false) => "StepScores::with_draft",
            (true, true) => "StepScores::with_draft_rows",
            (false, false) => "StepScores::with_draft_probs",
            (false, true) => "StepScores::with_draft_probs_rows",
        };
        // Compact rows are counted by `check_draft`; dense ones are `[max_bsz · (S − 1), V]`.
        let dense = (!scores.compact_draft).then(|| {
            let rows = cx.config.max_bsz * cx.config.max_step_tokens.saturating_sub(1);
            let what = if cx.sharding.is_some() {
                "max_bsz · (S − 1) rows of the rank's slice of V"
            } else {
                "max_bsz · (S − 1) rows of V"
            };
            (rows * cx.width(), what)
        });
        check_buffer(cx.device, argument, draft.buffer(), FLOATS, dense)?;
    }
    if let Some(bitmask) = scores.bitmask {
        let len = (
            rows * vocab.div_ceil(32),
            "one row of ceil(V / 32) words per score row",
        );
        check_buffer(
            cx.device,
            "StepScores::with_bitmask",
            bitmask,
            &[DType::U32],
            Some(len),
        )?;
    }
    Ok(())
}

/// `buffer`, handed over as `argument`, belongs to `device`, has one of `dtypes` and, when
/// `len` is given, that many elements (with what that length is).
fn check_buffer(
    device: &dyn Device,
    argument: &'static str,
    buffer: &Buffer,
    dtypes: &[DType],
    len: Option<(usize, &str)>,
) -> Result<()> {
    let bad = |reason: String| Err(SamplerError::StepBuffer { argument, reason });
    if buffer.device() != device.id() {
        return bad(format!(
            "the buffer belongs to device {}, not to the decoder's device {} ({})",
            buffer.device().0,
            device.id().0,
            device.info().name
        ));
    }
    if !dtypes.contains(&buffer.dtype()) {
        let names: Vec<String> = dtypes.iter().map(ToString::to_string).collect();
        return bad(format!(
            "a {} buffer, expected {}",
            buffer.dtype(),
            names.join(" or ")
        ));
    }
    match len {
        Some((expected, what)) if buffer.len() != expected => bad(format!(
            "{} elements, expected {expected} ({what})",
            buffer.len()
        )),
        _ => Ok(()),
    }
}

/// `R`: the number of whole rows of `V` in `target`, within `T_out ..= gather_rows`.
fn score_rows(vocab: usize, plan: &StepPlan, target: &Buffer) -> Result<usize> {
    if !target.len().is_multiple_of(vocab) {
        return Err(SamplerError::ScoresShape {
            reason: format!(
                "{} elements is not a whole number of rows of V = {vocab}",
                target.len()
            ),
        });
    }
    let rows = target.len() / vocab;
    let t_out = plan.t_out();
    if rows < t_out || rows > plan.gather_rows {
        return Err(SamplerError::ScoresShape {
            reason: format!(
                "{rows} rows, expected T_out = {t_out} ..= gather_rows = {}",
                plan.gather_rows
            ),
        });
    }
    Ok(rows)
}

/// REJECTION with drafts: the draft model's rows are given (compact ones, one row of `V` per
/// draft of the plan), and draft logits come with target logits (draft probabilities go with
/// either).
fn check_draft<'s>(vocab: usize, plan: &StepPlan, scores: StepScores<'s>) -> Result<Scores<'s>> {
    let draft = scores.draft.ok_or(SamplerError::MissingDraftProbs)?;
    if draft.is_logits() && !scores.target.is_logits() {
        return Err(SamplerError::DraftLogitsNeedLogits);
    }
    let expected = plan.drafts().saturating_mul(vocab);
    if scores.compact_draft && draft.buffer().len() != expected {
        return Err(SamplerError::DraftRows {
            expected,
            actual: draft.buffer().len(),
        });
    }
    Ok(draft)
}

/// REJECTION with compact draft rows: writes the index of each draft's row
/// (`docs/semantics.md` §5.8.1) into the decoder's `[max_bsz · (S − 1)]` buffer (allocated on the
/// first such step): the plan's drafts in slot order, then draft order; -1 where a slot has no
/// such draft (never read).
fn write_draft_index(cx: &StepContext<'_>, sc: &mut Scratch, checked: &Checked<'_>) -> Result<()> {
    if !checked.compact_draft {
        return Ok(());
    }
    let per_slot = cx.config.max_step_tokens.saturating_sub(1);
    let index = &mut sc.draft_index_host;
    index.clear();
    index.resize(cx.config.max_bsz * per_slot, -1);
    let dense = cx
        .plan
        .slots
        .iter()
        .flat_map(|p| (0..p.drafts).map(move |i| p.slot * per_slot + i));
    for (row, at) in dense.enumerate() {
        if let Some(entry) = index.get_mut(at) {
            *entry = i32::try_from(row).unwrap_or(i32::MAX);
        }
    }
    if sc.draft_index.is_none() {
        sc.draft_index = Some(cx.device.alloc::<i32>(index.len())?);
    }
    if let Some(buffer) = sc.draft_index.as_mut() {
        cx.device.write(buffer, index.as_slice())?;
    }
    Ok(())
}

/// The strategy the step runs: with no drafts to test, REJECTION's phase 2 is exactly a
/// TARGET_MATCH sample.
fn step_strategy(strategy: Strategy, rejection: bool) -> Strategy {
    if strategy == Strategy::Rejection && !rejection {
        Strategy::TargetMatch
    } else {
        strategy
    }
}

/// Per-row temperatures on the host (for the ops' validation): each output row's request, 1.0
/// for padding rows.
fn row_temperatures(plan: &StepPlan, slots: &SlotTable, rows: usize) -> Vec<f32> {
    let temperature = slots.temperature();
    (0..rows)
        .map(|t| plan.output_rows.get(t).map_or(1.0, |r| temperature[r.slot]))
        .collect()
}

/// Stage 2: the probability buffer (allocated once, when a step first needs it) and the `R` rows
/// of the step.
fn prepare_scratch(cx: &StepContext<'_>, sc: &mut Scratch, checked: &Checked<'_>) -> Result<()> {
    let config = cx.config;
    if checked.softmax && sc.probs.is_none() {
        let capacity = config.max_bsz * config.max_step_tokens * config.vocab;
        sc.probs = Some(cx.device.alloc::<f32>(capacity)?);
    }
    if checked.processing && sc.processed.is_none() {
        let rows = processed_rows(cx);
        let with_rows = !fuses(cx, config.strategy);
        sc.processed = Some(ProcessedBuffers::new(
            cx.device,
            (rows, cx.width()),
            with_rows,
        )?);
    }
    sc.window_rows(checked.rows, config.vocab, config.candidates)
}

/// Stage 2b: `process_logits` of the `R` rows (`docs/semantics.md` §4c) when some request uses
/// a parameter or the runner gave a bitmask: every later stage but `logprobs` reads the
/// processed rows, and the sampling ops the row fallbacks.
fn process(stage: Stage<'_>, sc: &mut Scratch, block: RowBlock) -> Result<()> {
    let Stage { cx, checked, .. } = stage;
    if !checked.processing {
        return Ok(());
    }
    let (Some(p), Some(out)) = (stage.state.processing.as_ref(), sc.processed.as_mut()) else {
        return Err(missing_processing());
    };
    out.window_rows(block.rows, cx.width())?;
    let processed = out.rows.as_mut().ok_or_else(missing_processing)?;
    let layout = (&sc.cu_seqlens_q_output, &sc.batch_id_per_token_output);
    let (scores, processing) = step_processing(stage, p, layout, &sc.row_temperature);
    cx.device.process_logits(
        &processing.inputs(scores),
        &mut ProcessOutputs {
            processed,
            fallback: &mut out.fallback,
        },
        &ProcessParams {
            block: Some(block),
            slice: cx.sharding.map(|s| s.partition().mine()),
            ..processing.params(checked.shape(cx.config.vocab))
        },
    )?;
    Ok(())
}

/// The step's rows as the ops read them (logits at the rows' temperatures — on the device and
/// their host copies — or probabilities) and their processing (`layout`: the output layout's
/// `cu_seqlens_q_output` and `batch_id_per_token_output`).
fn step_processing<'b>(
    stage: Stage<'b>,
    p: &'b crate::processing::Processing,
    (cu, batch_id): (&'b Buffer, &'b Buffer),
    temperature: &'b Buffer,
) -> (RowScores<'b>, RowProcessing<'b>) {
    let Stage {
        cx, state, checked, ..
    } = stage;
    let scores = match checked.is_logits {
        true => RowScores::Logits(Logits {
            logits: checked.target,
            temperature,
            host_temperature: Some(stage.row_temperature),
        }),
        false => RowScores::Probs(checked.target),
    };
    let processing = RowProcessing {
        layout: OutputLayout {
            cu_seqlens_q_output: cu,
            batch_id_per_token_output: batch_id,
        },
        history: p.history(
            &state.token_ids_all,
            &state.prompt_lens,
            &state.step_idx,
            &state.draft_tokens,
        ),
        slots: p.slots(&state.end_tokens),
        bitmask: checked.bitmask,
        dims: cx.dims(),
        max_model_len: cx.config.max_model_len,
        host: None,
    };
    (scores, processing)
}

/// The rows of a block when the step processes and samples its rows a block at a time: the
/// device asks for blocks ([`Capabilities::row_block_bytes`], a CPU keeps a block of processed
/// rows in its caches for the sampling op that reads them), the rows are processed, and the
/// strategy samples each row on its own (not REJECTION, whose verification reads every row).
fn block_rows(cx: &StepContext<'_>, checked: &Checked<'_>) -> Option<usize> {
    if !checked.processing || checked.softmax || checked.strategy == Strategy::Rejection {
        return None;
    }
    let rows = row_block_rows(cx)?;
    (rows < checked.rows).then_some(rows)
}

/// The rows of the device's row block at this vocabulary (at least 1), if it asks for blocks.
fn row_block_rows(cx: &StepContext<'_>) -> Option<usize> {
    let bytes = cx.device.capabilities().row_block_bytes?;
    Some((bytes / (cx.config.vocab * size_of::<f32>())).max(1))
}

/// The rows of the processed-rows buffer: a block's where every processed step goes by blocks,
/// else every output row of a step.
fn processed_rows(cx: &StepContext<'_>) -> usize {
    let config = cx.config;
    let all = config.max_bsz * config.max_step_tokens;
    match (config.strategy, row_block_rows(cx)) {
        _ if cx.sharding.is_some() => all,
        (Strategy::Rejection, _) | (_, None) => all,
        // The fused call samples every row at once.
        (strategy, _) if fuses(cx, strategy) => all,
        (_, Some(block)) => block.min(all),
    }
}

/// Stages 2b and 4 a block of rows at a time: `process_logits` of a block, then the strategy's
/// targets of the block from the processed rows while they are in the device's caches. The
/// per-row buffers read the block's window during its targets and every row again afterwards,
/// whatever the outcome.
fn processed_targets_in_blocks(
    stage: Stage<'_>,
    sc: &mut Scratch,
    block_rows: usize,
) -> Result<()> {
    let Stage { cx, checked, .. } = stage;
    let (vocab, candidates) = (cx.config.vocab, cx.config.candidates);
    let mut done = Ok(());
    for first in (0..checked.rows).step_by(block_rows) {
        let block = RowBlock {
            first,
            rows: block_rows.min(checked.rows - first),
        };
        done = sc
            .window_rows(checked.rows, vocab, candidates)
            .and_then(|()| process(stage, sc, block))
            .and_then(|()| sc.window_block(block, candidates))
            .and_then(|()| targets(stage, sc, block));
        if done.is_err() {
            break;
        }
    }
    sc.window_rows(checked.rows, vocab, candidates)?;
    done
}

/// Whether the device samples processed rows itself ([`Capabilities::fused_processing`]) for
/// the strategy: TARGET_MATCH and GREEDY, whose targets are `top_k_top_p_sample` draws.
fn fuses(cx: &StepContext<'_>, strategy: Strategy) -> bool {
    cx.sharding.is_none() && cx.device.capabilities().fused_processing && fused_strategy(strategy)
}

/// The strategies whose processed targets the fused call samples.
fn fused_strategy(strategy: Strategy) -> bool {
    matches!(strategy, Strategy::TargetMatch | Strategy::Greedy)
}

/// Stages 2b and 4 at once on a device that fuses them: the targets of every row are sampled
/// from the rows `process_logits` makes (`docs/semantics.md` §5.12), with no processed rows.
/// GREEDY is the `top_k = 1` sample, as in [`targets`].
fn fused_targets(stage: Stage<'_>, sc: &mut Scratch) -> Result<()> {
    let Stage { cx, checked, .. } = stage;
    let (Some(p), Some(out)) = (stage.state.processing.as_ref(), sc.processed.as_mut()) else {
        return Err(missing_processing());
    };
    out.window_rows(checked.rows, cx.config.vocab)?;
    let top_k = match checked.strategy {
        Strategy::Greedy => &out.ones,
        _ => &sc.row_top_k,
    };
    let layout = (&sc.cu_seqlens_q_output, &sc.batch_id_per_token_output);
    let (scores, processing) = step_processing(stage, p, layout, &sc.row_temperature);
    cx.device.top_k_top_p_sample_processed(
        &SampleInputs {
            scores,
            top_k,
            top_p: &sc.row_top_p,
            seed: &sc.row_seed,
            fallback: None,
        },
        &processing,
        &mut sc.target_tokens,
        &SampleParams {
            shape: checked.shape(cx.config.vocab),
            host_top_p: None,
        },
    )?;
    Ok(())
}

/// Processing without its buffers (cannot happen: they are allocated before the step).
fn missing_processing() -> SamplerError {
    SamplerError::ScoresShape {
        reason: "no logits-processing buffers".into(),
    }
}

/// Stage 3: `softmax` of the target logits with each row's temperature, when REJECTION verifies
/// them against draft probabilities (nothing otherwise).
fn softmax(stage: Stage<'_>, sc: &mut Scratch) -> Result<()> {
    let Stage { cx, checked, .. } = stage;
    if !checked.softmax {
        return Ok(());
    }
    let probs = sc.probs.as_mut().ok_or_else(missing_probs)?;
    let source = match (checked.processing, sc.processed.as_ref()) {
        (true, Some(p)) => p.rows.as_ref().ok_or_else(missing_processing)?,
        _ => checked.target,
    };
    cx.device.softmax(
        source,
        &sc.row_temperature,
        probs,
        &SoftmaxParams {
            shape: checked.shape(cx.config.vocab),
            host_temperature: Some(stage.row_temperature),
        },
    )?;
    Ok(())
}

/// The softmax output missing when a step computes one (cannot happen: `prepare_scratch`
/// allocates it).
fn missing_probs() -> SamplerError {
    SamplerError::ScoresShape {
        reason: "no probability buffer".into(),
    }
}

/// The rows the targets and REJECTION read: the softmax output when the step computes one, the
/// runner's logits at each row's temperature (`temperature` on the device, `host_temperature` its
/// host copy), or the runner's probabilities.
fn row_scores<'b>(
    checked: &Checked<'b>,
    probs: Option<&'b Buffer>,
    processed: Option<&'b ProcessedBuffers>,
    temperature: &'b Buffer,
    host_temperature: &'b [f32],
) -> Result<RowScores<'b>> {
    let rows = match (checked.processing, processed) {
        (true, Some(p)) => match &p.rows {
            Some(rows) => rows,
            // Sampled fused: only REJECTION reads the rows again, and it never fuses.
            None if fused_strategy(checked.strategy) => checked.target,
            None => return Err(missing_processing()),
        },
        (true, None) => return Err(missing_processing()),
        (false, _) => checked.target,
    };
    Ok(match (checked.softmax, checked.is_logits) {
        (true, _) => RowScores::Probs(probs.ok_or_else(missing_probs)?),
        (false, true) => RowScores::Logits(Logits {
            logits: rows,
            temperature,
            host_temperature: Some(host_temperature),
        }),
        (false, false) => RowScores::Probs(rows),
    })
}

/// The row fallbacks of the sampling ops, when the rows are processed.
fn fallback<'b>(
    checked: &Checked<'_>,
    processed: Option<&'b ProcessedBuffers>,
) -> Option<&'b Buffer> {
    processed
        .filter(|_| checked.processing)
        .map(|p| &p.fallback)
}

/// Stage 4: the strategy's target for every row.
fn targets(stage: Stage<'_>, sc: &mut Scratch, block: RowBlock) -> Result<()> {
    let Stage { cx, checked, .. } = stage;
    let shape = RowShape {
        rows: block.rows,
        vocab: cx.config.vocab,
    };
    let scores = row_scores(
        checked,
        sc.probs.as_ref(),
        sc.processed.as_ref(),
        &sc.row_temperature,
        &stage.row_temperature[block.first..block.first + block.rows],
    )?;
    let fallback = fallback(checked, sc.processed.as_ref());
    let top_k = match (
        checked.strategy,
        sc.processed.as_ref().filter(|_| checked.processing),
    ) {
        (Strategy::Greedy, None) => {
            cx.device
                .argmax(scores.matrix(), &mut sc.target_tokens, &shape)?;
            return Ok(());
        }
        // Under processing a masked row has no argmax: GREEDY is the equal `top_k = 1` sample,
        // which yields the row's fallback.
        (Strategy::Greedy, Some(p)) => &p.ones,
        (Strategy::TargetMatch, _) => &sc.row_top_k,
        (Strategy::TopP, _) => {
            return top_p_candidates(
                cx,
                (scores, fallback),
                &sc.row_top_p,
                &mut sc.batch_id_per_token_output,
                sc.candidates.as_mut(),
                (shape, block.first),
            );
        }
        (Strategy::Rejection, _) => return Ok(()),
    };
    cx.device.top_k_top_p_sample(
        &SampleInputs {
            scores,
            top_k,
            top_p: &sc.row_top_p,
            seed: &sc.row_seed,
            fallback,
        },
        &mut sc.target_tokens,
        &SampleParams {
            shape,
            host_top_p: None,
        },
    )?;
    Ok(())
}

/// TOPP's target: `top_p_candidates` over the rows `first .. first + shape.rows` (`batch_ids`
/// is narrowed to them for the call and back to `gather_rows` after it, whatever its outcome).
fn top_p_candidates(
    cx: &StepContext<'_>,
    (scores, fallback): (RowScores<'_>, Option<&Buffer>),
    top_p: &Buffer,
    batch_ids: &mut Buffer,
    candidates: Option<&mut CandidateBuffers>,
    (shape, first): (RowShape, usize),
) -> Result<()> {
    let Some(c) = candidates else {
        return Err(missing_candidates());
    };
    batch_ids.set_window(first, shape.rows)?;
    let done = cx.device.top_p_candidates(
        &CandidatesInputs {
            scores,
            top_p,
            batch_id_per_token_output: Some(&*batch_ids),
            fallback,
        },
        &mut CandidatesOutputs {
            ids: &mut c.ids,
            scores: &mut c.scores,
            lens: &mut c.lens,
        },
        &CandidatesParams {
            shape,
            candidates: cx.config.candidates,
            host_top_p: None,
        },
    );
    window(batch_ids, cx.plan.gather_rows)?;
    done?;
    Ok(())
}

/// TOPP without its candidate buffers (cannot happen: they are allocated for TOPP).
fn missing_candidates() -> SamplerError {
    SamplerError::Config {
        field: "strategy",
        reason: "topp candidate buffers missing".into(),
    }
}

/// Stage 5: the per-row buffers verification reads, narrowed to its rows (the `R` rows stay for
/// REJECTION with drafts).
fn narrow_to_outputs(cx: &StepContext<'_>, sc: &mut Scratch, checked: &Checked<'_>) -> Result<()> {
    let rows = checked.verify_rows;
    window(&mut sc.row_seed, rows)?;
    window(&mut sc.row_top_k, rows)?;
    window(&mut sc.row_top_p, rows)?;
    window(&mut sc.target_tokens, rows)?;
    if let Some(c) = sc.candidates.as_mut() {
        window(&mut c.ids, rows * cx.config.candidates)?;
        window(&mut c.scores, rows * cx.config.candidates)?;
        window(&mut c.lens, rows)?;
    }
    Ok(())
}

/// What verification reads of the targets.
struct Targets<'b> {
    tokens: &'b Buffer,
    candidates: Option<&'b CandidateBuffers>,
    scores: RowScores<'b>,
    top_k: &'b Buffer,
    top_p: &'b Buffer,
    /// The rows' fallbacks when they are processed.
    fallback: Option<&'b Buffer>,
    /// REJECTION's index of compact draft rows.
    draft_index: Option<&'b Buffer>,
}

/// Stage 6: `verify_draft_tokens` against the rows `checked.verify_rows` says, with the host slot
/// lengths when those are the `T_out` output rows.
fn verify(
    stage: Stage<'_>,
    slots: &SlotTable,
    sc: &mut Scratch,
    sharded: Option<&super::sharded::StepRows>,
) -> Result<()> {
    let Stage { cx, checked, .. } = stage;
    write_draft_index(cx, sc, checked)?;
    let targets = Targets {
        tokens: &sc.target_tokens,
        candidates: sc.candidates.as_ref(),
        scores: row_scores(
            checked,
            sc.probs.as_ref(),
            sc.processed.as_ref(),
            &sc.row_temperature,
            stage.row_temperature,
        )?,
        top_k: &sc.row_top_k,
        top_p: &sc.row_top_p,
        // A sharded REJECTION takes the whole rows' fallbacks with its target extras.
        fallback: fallback(checked, sc.processed.as_ref()).filter(|_| sharded.is_none()),
        draft_index: sc.draft_index.as_ref().filter(|_| checked.compact_draft),
    };
    let strategy = strategy_inputs(cx.config, checked, &targets)?;
    let rows = checked.verify_rows;
    let shard = cx.sharding.map(|s| s.shard(cx.device));
    let run =
        |inputs: &VerifyInputs<'_>, out: &mut VerifyOutputs<'_>, params: &VerifyParams<'_>| {
            match (&shard, sharded) {
                (Some(shard), Some(rows)) => {
                    specula_shard::verify_draft_tokens(shard, inputs, rows.extras(), out, params)?;
                }
                _ => cx.device.verify_draft_tokens(inputs, out, params)?,
            }
            Ok::<(), SamplerError>(())
        };
    run(
        &VerifyInputs {
            draft_tokens: &stage.state.draft_tokens,
            lens: stage.state.lens(),
            cu_seqlens_q_output: &sc.cu_seqlens_q_output,
            state: verify_slot_state(stage.state),
            seeds: &sc.row_seed,
            strategy,
        },
        &mut VerifyOutputs {
            accept_tokens: &mut sc.accept_tokens,
            accept_num: &mut sc.accept_num,
        },
        &VerifyParams {
            dims: cx.dims(),
            rows,
            vocab: cx.config.vocab,
            accept_all: cx.config.accept_all,
            reject_all: cx.config.reject_all,
            host: (rows == cx.plan.t_out()).then(|| slots.host_lens()),
        },
    )
}

/// The strategy's inputs to verification.
fn strategy_inputs<'b>(
    config: &SamplerConfig,
    checked: &Checked<'b>,
    targets: &Targets<'b>,
) -> Result<StrategyInputs<'b>> {
    Ok(match checked.strategy {
        Strategy::Greedy => StrategyInputs::Greedy {
            target_tokens: targets.tokens,
        },
        Strategy::TargetMatch => StrategyInputs::TargetMatch {
            target_tokens: targets.tokens,
        },
        Strategy::TopP => {
            let c = targets.candidates.ok_or_else(missing_candidates)?;
            StrategyInputs::TopP(CandidateInputs {
                candidate_ids: &c.ids,
                candidate_scores: &c.scores,
                candidate_lens: &c.lens,
                candidates: config.candidates,
            })
        }
        Strategy::Rejection => StrategyInputs::Rejection(RejectionInputs {
            target: targets.scores,
            draft: checked.draft.ok_or(SamplerError::MissingDraftProbs)?,
            top_k: targets.top_k,
            top_p: targets.top_p,
            fallback: targets.fallback,
            draft_index: targets.draft_index,
        }),
    })
}

/// The slot state verification reads.
fn verify_slot_state(st: &SlotBuffers) -> VerifySlotState<'_> {
    VerifySlotState {
        stop_flags: &st.stop_flags,
        is_block_step: &st.is_block_step,
        reasoning_status: &st.reasoning_status,
        step_idx: &st.step_idx,
        max_dec_len: &st.max_dec_len,
        end_tokens: &st.end_tokens,
    }
}

/// Stage 7: `accept_logprobs` of the accepted tokens, when configured.
fn logprobs(stage: Stage<'_>, sc: &mut Scratch) -> Result<()> {
    let Stage { cx, checked, .. } = stage;
    let Some(lp) = sc.logprobs.as_mut().filter(|_| checked.logprobs) else {
        return Ok(());
    };
    let inputs = LogprobsInputs {
        logits: checked.target,
        temperature: &sc.row_temperature,
        accept_tokens: &sc.accept_tokens,
        accept_num: &sc.accept_num,
        seq_lens_encoder: &stage.state.seq_lens_encoder,
        cu_seqlens_q_output: &sc.cu_seqlens_q_output,
    };
    let params = LogprobsParams {
        dims: cx.dims(),
        shape: checked.shape(cx.config.vocab),
        top_k: lp.top_k,
        host_temperature: Some(stage.row_temperature),
    };
    match cx.sharding {
        Some(s) => specula_shard::accept_logprobs(
            &s.shard(cx.device),
            &inputs,
            &mut lp.out.outputs(),
            &params,
        )?,
        None => cx
            .device
            .accept_logprobs(&inputs, &mut lp.out.outputs(), &params)?,
    }
    Ok(())
}

// ----- the commit -----

/// Stage 8, the point of no return: `update_state` commits the verified step on the device, then
/// the download of its results starts (one transfer of every buffer the host reads), without
/// waiting for it.
pub(super) fn commit_on_device(
    cx: &StepContext<'_>,
    state: &mut SlotBuffers,
    sc: &mut Scratch,
    verified: Verified,
) -> Result<Downloading> {
    let Verified {
        _sealed: (),
        processed,
        fused,
        logprobs,
    } = verified;
    update_state(cx, state, sc)?;
    start_download(cx.device, state, sc, (processed, fused), logprobs)
}

/// `update_state`: the accepted tokens into each slot's history, lengths, seeds and stop flags.
fn update_state(cx: &StepContext<'_>, st: &mut SlotBuffers, sc: &mut Scratch) -> Result<()> {
    cx.device.update_state(
        &UpdateStateInputs {
            accept_tokens: &sc.accept_tokens,
            is_block_step: &st.is_block_step,
            prompt_lens: &st.prompt_lens,
            max_dec_len: &st.max_dec_len,
            end_tokens: &st.end_tokens,
        },
        &mut DecodeState {
            accept_num: &mut sc.accept_num,
            stop_flags: &mut st.stop_flags,
            token_ids_all: &mut st.token_ids_all,
            step_idx: &mut st.step_idx,
            infer_seed: &mut st.infer_seed,
            draft_tokens: &mut st.draft_tokens,
            seq_lens_encoder: &mut st.seq_lens_encoder,
            seq_lens_decoder: &mut st.seq_lens_decoder,
            token_counts: st.processing.as_mut().map(|p| &mut p.token_counts),
        },
        &UpdateStateParams {
            dims: cx.dims(),
            max_model_len: cx.config.max_model_len,
            vocab: cx.config.vocab,
        },
    )?;
    Ok(())
}

/// A committed step whose results are on their way to the host: one [`PendingDownload`] of the
/// accepted tokens, their counts, the stop flags, the row fallbacks of a processed step and (when
/// `accept_logprobs` ran) the log-probabilities. Only [`commit_on_device`] makes one;
/// [`Downloading::wait`] turns it into the [`Committed`] value. The step cannot be retried.
#[derive(Debug)]
pub(super) struct Downloading {
    pending: PendingDownload,
    processed: bool,
    /// `K` of the log-probability buffers, when they are downloaded.
    logprobs_top_k: Option<usize>,
}

/// Starts the one download of the committed step's results (see [`Downloading`]).
fn start_download(
    device: &dyn Device,
    st: &SlotBuffers,
    sc: &Scratch,
    (processed, fused): (bool, bool),
    logprobs: bool,
) -> Result<Downloading> {
    let mut srcs = vec![&sc.accept_tokens, &sc.accept_num, &st.stop_flags];
    let fallback = match (processed, &sc.processed) {
        // A fused target is -1 exactly where the row's fallback is: every token masked.
        (true, _) if fused => Some(&sc.target_tokens),
        (true, Some(p)) => Some(&p.fallback),
        _ => None,
    };
    srcs.extend(fallback);
    let lp = sc.logprobs.as_ref().filter(|_| logprobs);
    if let Some(lp) = lp {
        let out = &lp.out;
        srcs.extend([
            &out.cu_accept,
            &out.logprobs,
            &out.ranks,
            &out.top_ids,
            &out.top_logprobs,
        ]);
    }
    Ok(Downloading {
        pending: device.start_download(&srcs)?,
        processed: fallback.is_some(),
        logprobs_top_k: lp.map(|lp| lp.top_k),
    })
}

impl Downloading {
    /// Number of buffers in the step's one transfer (each was a blocking download of its own
    /// before the transfers were batched).
    pub(super) fn buffers(&self) -> usize {
        self.pending.len()
    }

    /// Waits (once) for the step's results and sorts the bytes into a [`Committed`] value, in
    /// the order [`start_download`] asked for them.
    pub(super) fn wait(self) -> Result<Committed> {
        let mut bytes = self.pending.wait()?.into_iter();
        let mut next = || bytes.next().unwrap_or_default();
        let accept_tokens = elements(&next());
        let accept_num = elements(&next());
        let stop_flags = next();
        let fallback = self.processed.then(|| elements(&next()));
        let logprobs = self.logprobs_top_k.map(|top_k| DownloadedLogprobs {
            top_k,
            cu_accept: elements(&next()),
            logprobs: elements(&next()),
            ranks: elements(&next()),
            top_ids: elements(&next()),
            top_logprobs: elements(&next()),
        });
        Ok(Committed {
            fallback,
            accept_tokens,
            accept_num,
            stop_flags,
            logprobs,
        })
    }
}

/// What [`commit_on_host`] leaves for the device: the stop flags to write back when the host
/// ended a request the device still runs (`docs/semantics.md` §8).
pub(super) struct HostCommit {
    /// What the step produced.
    pub output: StepOutput,
    /// `Some`: the step's stop flags with every host-stopped slot set, to be written whole.
    pub stop_flags: Option<Vec<u8>>,
    /// The slots whose emitted tokens the host cut, with the `infer_seed` of their last kept
    /// token's successor (the device advanced past the cut tokens).
    pub seeds: Vec<(usize, u64)>,
}

/// Stage 9: what each slot of the plan emitted, taken into the slot table and the stats. A slot
/// the host ends (a request's stop token, or `max_dec_len` outside FastDeploy's mode) keeps its
/// tokens up to the one that ends it, and is flagged to be stopped on the device.
pub(super) fn commit_on_host(
    cx: &StepContext<'_>,
    slots: &mut SlotTable,
    stats: &mut DecodeStats,
    mut committed: Committed,
) -> HostCommit {
    let mut output = StepOutput {
        step: cx.plan.step,
        slots: Vec::with_capacity(cx.plan.slots.len()),
        exchanged: None,
    };
    let (mut host_stopped, mut seeds) = (false, Vec::new());
    for slot_plan in &cx.plan.slots {
        let b = slot_plan.slot;
        let Some((slot_output, stop)) = commit_slot(cx.config, slot_plan, slots, &committed) else {
            continue;
        };
        if stop {
            committed.stop_flags[b] = 1;
            host_stopped = true;
        }
        if slot_output.tokens.len() < committed.tokens(b, cx.config.max_step_tokens).len()
            && let Some(host) = slots.get(b)
        {
            let request_seed = crate::seeds::request_seed(host.request.seed);
            let emitted = host.generated().len() as u64;
            seeds.push((b, crate::seeds::infer_seed_after(request_seed, emitted)));
        }
        stats.tokens_emitted += slot_output.tokens.len() as u64;
        stats.drafts_proposed += slot_output.drafts_proposed as u64;
        stats.drafts_accepted += slot_output.drafts_accepted as u64;
        output.slots.push(slot_output);
    }
    stats.steps += 1;
    HostCommit {
        output,
        stop_flags: host_stopped.then_some(committed.stop_flags),
        seeds,
    }
}

/// Writes back the stop flags of the slots the host stopped, so no op touches them again, and
/// the `infer_seed` of the slots whose tokens it cut, so the device holds the seed of the next
/// token after the kept ones: one batched write, plus one write per further cut slot when the
/// host cut the tokens of several slots in one step (a buffer takes one window per batch).
pub(super) fn stop_on_device(
    device: &dyn Device,
    state: &mut SlotBuffers,
    host: &HostCommit,
) -> Result<()> {
    let (first_seed, more_seeds) = match host.seeds.split_first() {
        Some((&(slot, seed), more)) => (Some((slot, [seed])), more),
        None => (None, &[][..]),
    };
    let mut writes = Vec::new();
    if let Some(stop_flags) = &host.stop_flags {
        writes.push(WriteAt::new(&mut state.stop_flags, 0, stop_flags));
    }
    if let Some((slot, seed)) = &first_seed {
        writes.push(WriteAt::new(&mut state.infer_seed, *slot, seed));
    }
    device.write_many(&mut writes)?;
    for &(slot, seed) in more_seeds {
        write_at(device, &mut state.infer_seed, slot, &[seed])?;
    }
    Ok(())
}

/// One slot's emitted tokens (accepted drafts, then the correction or bonus token), cut where
/// the host ends the request, into its [`SlotHost`](super::slots::SlotHost). Also says whether
/// the host stopped a slot the device still runs. `None` when the slot is empty.
fn commit_slot(
    config: &SamplerConfig,
    slot_plan: &SlotPlan,
    slots: &mut SlotTable,
    committed: &Committed,
) -> Option<(SlotOutput, bool)> {
    let b = slot_plan.slot;
    let mut tokens = committed.tokens(b, config.max_step_tokens);
    let device_stopped = committed.stop_flags[b] != 0;
    // The last token comes from the slot's row `n − 1`; a row with every token masked yields
    // none, and verification ends the slot with `end_tokens[0]`.
    let mut masked = committed.fallback.as_ref().is_some_and(|f| {
        let row = (slot_plan.rows.start + tokens.len()).checked_sub(1);
        row.and_then(|r| f.get(r)) == Some(&-1)
    });
    let host_stop = slots.get(b)?.host_stop(&tokens, config);
    if let Some(keep) = host_stop
        && keep < tokens.len()
    {
        tokens.truncate(keep);
        masked = false;
    }
    let drafts_accepted = tokens
        .iter()
        .zip(slots.drafts(b, slot_plan.drafts))
        .take_while(|(t, d)| t == d)
        .count();
    let host = slots.get_mut(b)?;
    let logprobs = match (&committed.logprobs, host.request.logprobs) {
        (Some(lp), Some(k)) => Some(lp.for_slot(b, &tokens, k)),
        _ => None,
    };
    host.accept(
        &tokens,
        device_stopped || host_stop.is_some(),
        masked,
        config,
    );
    let output = SlotOutput {
        slot: b,
        tokens,
        drafts_proposed: slot_plan.drafts,
        drafts_accepted,
        finished: host.finished,
        logprobs,
    };
    Some((output, host_stop.is_some() && !device_stopped))
}

impl Committed {
    /// The tokens slot `b` emitted: the first `accept_num[b]` (at most `S`) of its row.
    fn tokens(&self, b: usize, max_step_tokens: usize) -> Vec<i32> {
        let s = max_step_tokens;
        let n = usize::try_from(self.accept_num[b]).unwrap_or(0).min(s);
        self.accept_tokens[b * s..b * s + n].to_vec()
    }
}

/// The outputs of `accept_logprobs`, on the host.
struct DownloadedLogprobs {
    top_k: usize,
    cu_accept: Vec<i32>,
    logprobs: Vec<f32>,
    ranks: Vec<i32>,
    top_ids: Vec<i32>,
    top_logprobs: Vec<f32>,
}

impl DownloadedLogprobs {
    /// The log-probabilities of the `tokens` slot `slot` emitted, with the top `k ≤ K`
    /// alternatives each.
    fn for_slot(&self, slot: usize, tokens: &[i32], k: usize) -> Vec<TokenLogprob> {
        let start = self
            .cu_accept
            .get(slot)
            .and_then(|&c| usize::try_from(c).ok())
            .unwrap_or(0);
        tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| self.token(start + i, token, k))
            .collect()
    }

    /// Accepted token `p` of the step (`token`), with its top `k ≤ K` alternatives.
    fn token(&self, p: usize, token: i32, k: usize) -> TokenLogprob {
        let top = (0..k.min(self.top_k))
            .filter_map(|j| {
                let id = *self.top_ids.get(p * self.top_k + j)?;
                let lp = *self.top_logprobs.get(p * self.top_k + j)?;
                Some((id, lp))
            })
            .collect();
        TokenLogprob {
            token,
            logprob: self.logprobs.get(p).copied().unwrap_or(f32::NEG_INFINITY),
            rank: self.ranks.get(p).copied().unwrap_or(0),
            top,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry;
    use crate::step::OutputRow;

    #[test]
    fn rejection_without_drafts_runs_target_match() {
        assert_eq!(
            step_strategy(Strategy::Rejection, false),
            Strategy::TargetMatch
        );
        assert_eq!(
            step_strategy(Strategy::Rejection, true),
            Strategy::Rejection
        );
        for strategy in [Strategy::Greedy, Strategy::TargetMatch, Strategy::TopP] {
            assert_eq!(step_strategy(strategy, false), strategy);
        }
    }

    #[test]
    fn scores_are_whole_rows_between_t_out_and_gather_rows() {
        let device = registry::open("cpu").expect("cpu");
        let plan = StepPlan {
            gather_rows: 4,
            output_rows: vec![
                OutputRow {
                    slot: 0,
                    input_index: 0,
                    position: 0,
                };
                2
            ],
            ..StepPlan::default()
        };
        let rows = |n: usize| device.upload(&vec![0.0f32; n]).expect("upload");
        assert_eq!(score_rows(8, &plan, &rows(16)).expect("2 rows"), 2);
        assert_eq!(score_rows(8, &plan, &rows(32)).expect("4 rows"), 4);
        for bad in [8, 17, 40] {
            assert!(matches!(
                score_rows(8, &plan, &rows(bad)),
                Err(SamplerError::ScoresShape { .. })
            ));
        }
    }

    /// A plan of one slot decoding one draft: `T_out = 2`, `gather_rows = 3`.
    fn plan_with_a_draft() -> StepPlan {
        let row = |input_index| OutputRow {
            slot: 0,
            input_index,
            position: input_index,
        };
        StepPlan {
            gather_rows: 3,
            output_rows: vec![row(0), row(1)],
            slots: vec![SlotPlan {
                slot: 0,
                kind: crate::step::SlotStepKind::Decode,
                inputs: 0..2,
                start_position: 0,
                drafts: 1,
                rows: 0..2,
            }],
            ..StepPlan::default()
        }
    }

    #[test]
    fn rejection_drafts_are_of_the_target_kind_and_verified_against_every_row() {
        let device = registry::open("cpu").expect("cpu");
        let config = SamplerConfig {
            max_step_tokens: 3,
            ..SamplerConfig::new(Strategy::Rejection, 1, 8, 16, vec![0])
        };
        let plan = plan_with_a_draft();
        let target = device.upload(&[0.0f32; 24]).expect("upload");
        let draft = device.upload(&[0.0f32; 16]).expect("upload");
        let check = |scores| check_scores((&config, config.vocab), &plan, scores, false);
        assert!(matches!(
            check(StepScores::logits(&target)),
            Err(SamplerError::MissingDraftProbs)
        ));
        let mixed = StepScores {
            target: Scores::Probs(&target),
            draft: Some(Scores::Logits(&draft)),
            compact_draft: false,
            bitmask: None,
        };
        assert!(matches!(
            check(mixed),
            Err(SamplerError::DraftLogitsNeedLogits)
        ));
        for (scores, softmax) in [
            (StepScores::logits(&target).with_draft(&draft), false),
            (StepScores::logits(&target).with_draft_probs(&draft), true),
            (StepScores::probs(&target).with_draft(&draft), false),
            (StepScores::probs(&target).with_draft_probs(&draft), false),
        ] {
            let checked = check(scores).expect("checked");
            assert_eq!(checked.softmax, softmax);
            assert_eq!((checked.rows, checked.verify_rows), (3, 3));
            assert_eq!(checked.strategy, Strategy::Rejection);
            assert!(checked.draft.is_some());
            assert!(!checked.compact_draft);
        }
        // Compact rows: one row of V per draft of the plan (1 here), not the dense 2.
        let one_row = device.upload(&[0.0f32; 8]).expect("upload");
        let compact = check(StepScores::logits(&target).with_draft_rows(&one_row));
        assert!(compact.expect("one row per draft").compact_draft);
        let dense_as_compact = check(StepScores::logits(&target).with_draft_probs_rows(&draft));
        assert!(matches!(
            dense_as_compact,
            Err(SamplerError::DraftRows {
                expected: 8,
                actual: 16
            })
        ));
        let target_match = SamplerConfig {
            strategy: Strategy::TargetMatch,
            ..config.clone()
        };
        let checked = check_scores(
            (&target_match, target_match.vocab),
            &plan,
            StepScores::logits(&target),
            false,
        )
        .expect("checked");
        assert_eq!((checked.rows, checked.verify_rows), (3, 2));
        assert!(!checked.softmax && checked.draft.is_none());
    }
}
