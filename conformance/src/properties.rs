//! End-to-end properties every backend must keep, checked through the sampler's [`Decoder`] and
//! through the ops directly:
//!
//! - `spec_equals_plain::{target_match, greedy}`: speculative decoding with the n-gram proposer
//!   (S = 4 … 6) emits token for token what plain decoding (S = 1) emits, for a toy target model
//!   whose logits are a pure function of the prefix, in mixed batches where prefills arrive at
//!   different steps (`docs/semantics.md` §1, "Speculative == non-speculative"); the runner hands
//!   the decoder probabilities (its own `softmax` on the device, at each request's temperature);
//! - `spec_equals_plain::logits::{target_match, greedy}`: the same, the runner handing the decoder
//!   its logits, which it samples from directly (`docs/semantics.md` §4b);
//! - `logits_sampling_frequencies`: `top_k_top_p_sample` of logits rows at T = 1 (no top-k, no
//!   top-p) draws each token with softmax's frequencies (a chi-square test);
//! - `rejection_preserves_target` and `rejection_preserves_target::logits`: the first token
//!   REJECTION emits is distributed as the target's filtered distribution, whatever the draft
//!   distribution, from probability rows and from logits rows (a chi-square test);
//! - `first_in_rank_is_the_argmax::logits`: over random and hostile logits rows — many of them
//!   with logits beyond `2^64` or below `2^-76` that read as one value (`docs/semantics.md` §4b
//!   step 1) — a T = 0 sample, a top_k = 1 sample and the first T = 0 candidate are the row's
//!   `argmax` (on every row with a logit above −inf; at T = 0 with at most one +inf);
//! - `first_in_rank_is_the_argmax::processed`: the same rows through `process_logits` with every
//!   parameter off come back as they were (NaN as −inf), their fallback is the argmax, and the fused
//!   processed sample at T = 0 is the argmax (`docs/semantics.md` §4c);
//! - `batch_invariance::requests` and `batch_invariance::rows`: a request's tokens, and a row's
//!   sampled token, candidates and argmax, do not depend on the rest of the batch
//!   (`docs/semantics.md` §1, "No hidden state");
//! - `invalid_memory_arguments`: memory operations (alloc, upload, write, download) reject bad
//!   arguments in the validating front with the documented error, write nothing and never abort
//!   (the ops' rejections are the `invalid::` cases).
//!
//! The chi-square tests draw with fixed seeds, so each verdict is deterministic (and, the draws
//! being exact, the same on every backend); the threshold is the critical value at p = 0.001.
//! Properties that weigh logits rows ([`Property::logits`]) run only on backends whose
//! `Capabilities::logits` holds, and are skipped with the reason elsewhere.

use std::sync::Arc;

use specula_backend_api::abi::MAX_INFER_SEED;
use specula_backend_api::ops::{RowShape, SoftmaxParams};
use specula_backend_api::{Buffer, DType, Device, DeviceExt, Op, Strategy};
use specula_sampler::arrivals::{Arrival, serve};
use specula_sampler::{
    Decoder, FinishReason, NgramConfig, Request, SamplerConfig, SamplingParams, StepError,
    StepPlan, StepScores,
};

use crate::case::ErrorKind::{
    DeviceMismatch, DtypeMismatch, InvalidArgument, OutOfMemory, ShapeMismatch,
};
use crate::case::{ErrorKind, ExpectedError};
use crate::cases::generate::{
    Batch, FLOAT_DTYPES, Rng, dims, f32s, float_tensor, hostile_logit_rows, i32s, logit_row, mix,
    prob_row, round_to, sample_index, softmax_f64,
};
use crate::cases::run_case;
use crate::cases::{Case, CaseParams};
use crate::cases::{
    Size, argmax, process_logits, top_k_top_p_sample, top_p_candidates, verify_draft_tokens,
};
use crate::tensor::HostTensor;

/// A named end-to-end property.
#[derive(Clone, Copy, Debug)]
pub struct Property {
    /// Trial name segment, e.g. `spec_equals_plain::target_match`.
    pub name: &'static str,
    /// It has ops weigh logits rows (`docs/semantics.md` §4b), so it runs only where
    /// `Capabilities::logits` holds.
    pub logits: bool,
    /// It processes logits (`docs/semantics.md` §4c), so it runs only where
    /// `Capabilities::processing` holds.
    pub processing: bool,
    /// Checks the property on a device; `Err` explains the failure.
    pub check: fn(&Arc<dyn Device>, crate::cases::Size) -> Result<(), String>,
}

impl Property {
    /// The capability `device` lacks for this property (`logits processing`, `logits rows`), if
    /// any: the suite then skips it as unsupported.
    pub fn missing_capability(&self, device: &dyn Device) -> Option<&'static str> {
        let capabilities = device.capabilities();
        if self.processing && !capabilities.processing {
            return Some("logits processing");
        }
        (self.logits && !capabilities.logits).then_some("logits rows")
    }
}

/// Every property.
pub fn properties() -> Vec<Property> {
    use RowKind::{Logits, MaskedLogits, Probs};
    vec![
        Property {
            name: "spec_equals_plain::target_match",
            logits: false,
            processing: false,
            check: |device, size| spec_equals_plain(device, size, Strategy::TargetMatch, Probs),
        },
        Property {
            name: "spec_equals_plain::greedy",
            logits: false,
            processing: false,
            check: |device, size| spec_equals_plain(device, size, Strategy::Greedy, Probs),
        },
        Property {
            name: "spec_equals_plain::logits::target_match",
            logits: true,
            processing: false,
            check: |device, size| spec_equals_plain(device, size, Strategy::TargetMatch, Logits),
        },
        // GREEDY's targets are the `argmax` of the logits, which every backend takes.
        Property {
            name: "spec_equals_plain::logits::greedy",
            logits: false,
            processing: false,
            check: |device, size| spec_equals_plain(device, size, Strategy::Greedy, Logits),
        },
        Property {
            name: "spec_equals_plain::processed::target_match",
            logits: true,
            processing: true,
            check: |device, size| {
                spec_equals_plain(device, size, Strategy::TargetMatch, MaskedLogits)
            },
        },
        Property {
            name: "spec_equals_plain::processed::greedy",
            logits: true,
            processing: true,
            check: |device, size| spec_equals_plain(device, size, Strategy::Greedy, MaskedLogits),
        },
        Property {
            name: "logits_sampling_frequencies",
            logits: true,
            processing: false,
            check: logits_sampling_frequencies,
        },
        Property {
            name: "first_in_rank_is_the_argmax::logits",
            logits: true,
            processing: false,
            check: first_in_rank_is_the_argmax,
        },
        Property {
            name: "first_in_rank_is_the_argmax::processed",
            logits: true,
            processing: true,
            check: processed_first_in_rank_is_the_argmax,
        },
        Property {
            name: "rejection_preserves_target",
            logits: false,
            processing: false,
            check: rejection_preserves_target,
        },
        Property {
            name: "rejection_preserves_target::logits",
            logits: true,
            processing: false,
            check: rejection_from_logits_preserves_target,
        },
        Property {
            name: "batch_invariance::requests",
            logits: false,
            processing: false,
            check: batch_invariance_requests,
        },
        Property {
            name: "batch_invariance::rows",
            logits: false,
            processing: false,
            check: batch_invariance_rows,
        },
        Property {
            name: "invalid_memory_arguments",
            logits: false,
            processing: false,
            check: invalid_memory_arguments,
        },
    ]
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

// ---------------------------------------------------------------------------------------------
// The toy target model and the runner loop.

/// Width of the toy model's hidden state.
const HIDDEN: usize = 3;
/// Vocabulary of the toy model.
const VOCAB: usize = 61;
/// End tokens of every decoder configuration.
const END_TOKENS: [i32; 2] = [0, 17];

/// Next-token logits that are a pure function of the prefix: most mass on a deterministic successor
/// of the last token (short cycles, so n-gram drafts are often right), a prefix-dependent rival (so
/// they are often wrong too). The hidden state of a prefix is exact in f32, so a runner can pass it
/// through `gather_next_token` and apply the "LM head" afterwards.
struct ToyModel;

impl ToyModel {
    fn successor(token: i32) -> i32 {
        let token = token.rem_euclid(VOCAB as i32);
        let base = token / 6 * 6;
        let len = (VOCAB as i32 - base).min(6);
        base + (token - base + 1) % len
    }

    fn hidden(prefix: &[i32]) -> [f32; HIDDEN] {
        let mut h: u64 = 0xCBF2_9CE4_8422_2325;
        for &t in prefix {
            h = mix(h ^ t as u64);
        }
        let h = h & 0xFFFF_FFFF_FFFF;
        let last = prefix.last().copied().unwrap_or(0);
        [(h & 0xFF_FFFF) as f32, (h >> 24) as f32, last as f32]
    }

    fn lm_head(hidden: &[f32]) -> Vec<f32> {
        let h = hidden[0] as u64 | ((hidden[1] as u64) << 24);
        let last = hidden[2] as i32;
        let unit = |x: u64| (x >> 40) as f32 / (1u64 << 24) as f32;
        let mut logits: Vec<f32> = (0..VOCAB)
            .map(|v| unit(mix(h ^ (v as u64).wrapping_mul(0x1234_5677))))
            .collect();
        logits[Self::successor(last) as usize] += 5.0;
        let rival = (mix(h.wrapping_add(1)) % VOCAB as u64) as usize;
        logits[rival] += unit(mix(h.wrapping_add(2))) * 6.5;
        logits
    }
}

/// How the runner computes its logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forward {
    /// From each output row's prefix on the host.
    Prefix,
    /// Hidden states per packed token, gathered on the device, LM head on every gathered row.
    Gather,
}

/// What the runner hands the decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowKind {
    /// Probabilities: the runner's own `softmax` of its logits on the device, at each output
    /// row's temperature (1 for padding rows).
    Probs,
    /// The logits themselves.
    Logits,
    /// The logits with a token bitmask ([`runner_bitmask`]), for requests that use every
    /// parameter of `docs/semantics.md` §4c ([`with_processing`]).
    MaskedLogits,
}

/// The runner's structured-output mask of an output row whose context has `len` tokens: bans
/// `v` when `(v + len) % 11 == 0`.
fn runner_bitmask(len: usize) -> Vec<u32> {
    let mut mask = vec![0u32; VOCAB.div_ceil(32)];
    for v in (0..VOCAB).filter(|v| !(v + len).is_multiple_of(11)) {
        mask[v / 32] |= 1 << (v % 32);
    }
    mask
}

/// `request` with every parameter of `docs/semantics.md` §4c on, aimed at the toy model's
/// favoured chain so that each changes what is emitted.
fn with_processing(rng: &mut Rng, request: Request) -> Request {
    let last = request.prompt[request.prompt.len() - 1];
    let next = ToyModel::successor(last);
    let token = |rng: &mut Rng| rng.range(1, VOCAB - 1) as i32;
    let params = request
        .params()
        .with_repetition_penalty(rng.pick(&[1.3, 0.8, 1.1, 2.0]))
        .with_frequency_presence(rng.pick(&[0.0, 0.4, 1.5]), rng.pick(&[0.0, 0.3, -0.2]))
        .with_min_p(rng.pick(&[0.0, 0.05, 0.2]))
        .with_min_tokens(rng.range(0, 5));
    let bias = vec![(next, rng.pick(&[-3.0, 2.0])), (token(rng), 1.5)];
    let bad_words = vec![
        vec![token(rng)],
        vec![next, ToyModel::successor(next)],
        vec![last, next, ToyModel::successor(next)],
    ];
    let request = request
        .with_params(params)
        .with_logit_bias(bias)
        .with_bad_words(bad_words);
    match rng.below(2) {
        0 => request.with_allowed_token_ids((0..VOCAB as i32).filter(|v| v % 7 != 3).collect()),
        _ => request,
    }
}

/// Generated tokens and finish reasons per arrival, and the decoder's counters.
struct RunResult {
    tokens: Vec<Vec<i32>>,
    finished: Vec<Option<FinishReason>>,
    steps: u64,
    proposed: u64,
    accepted: u64,
}

/// The runner's forward pass for the current plan: `[R, V]` logits.
fn forward(
    device: &dyn Device,
    decoder: &Decoder,
    plan: &StepPlan,
    mode: Forward,
) -> Result<Buffer, String> {
    match mode {
        Forward::Prefix => {
            let mut rows = Vec::with_capacity(plan.t_out() * VOCAB);
            for t in 0..plan.t_out() {
                rows.extend(ToyModel::lm_head(&ToyModel::hidden(
                    &decoder.row_prefix(t).map_err(err)?,
                )));
            }
            device.upload(&rows).map_err(err)
        }
        Forward::Gather => {
            let (token_num, gather_rows) = (plan.token_num(), plan.gather_rows);
            let mut hidden = Vec::with_capacity(token_num * HIDDEN);
            for j in 0..token_num {
                hidden.extend(ToyModel::hidden(&decoder.input_prefix(j).map_err(err)?));
            }
            let hidden = device.upload(&hidden).map_err(err)?;
            let mut gathered = device.alloc::<f32>(gather_rows * HIDDEN).map_err(err)?;
            decoder
                .gather_next_token(&hidden, HIDDEN, &mut gathered)
                .map_err(err)?;
            let gathered: Vec<f32> = device.download(&gathered).map_err(err)?;
            let mut rows = Vec::with_capacity(gather_rows * VOCAB);
            for h in gathered.chunks_exact(HIDDEN) {
                rows.extend(ToyModel::lm_head(h));
            }
            device.upload(&rows).map_err(err)
        }
    }
}

/// `softmax` of the runner's `[R, V]` logits at each output row's temperature (1 for padding
/// rows), on the device.
fn runner_softmax(
    device: &dyn Device,
    decoder: &Decoder,
    plan: &StepPlan,
    logits: &Buffer,
) -> Result<Buffer, String> {
    let rows = logits.len() / VOCAB;
    let temperature: Vec<f32> = (0..rows)
        .map(|t| match plan.output_rows.get(t) {
            Some(row) => decoder.request(row.slot).map_or(1.0, |r| r.temperature),
            None => 1.0,
        })
        .collect();
    let mut probs = device.alloc::<f32>(rows * VOCAB).map_err(err)?;
    device
        .softmax(
            logits,
            &device.upload(&temperature).map_err(err)?,
            &mut probs,
            &SoftmaxParams {
                shape: RowShape { rows, vocab: VOCAB },
                host_temperature: Some(&temperature),
            },
        )
        .map_err(err)?;
    Ok(probs)
}

/// Finishes the planned step with the runner's logits, handed over as `kind` says.
fn finish(
    device: &dyn Device,
    decoder: &mut Decoder,
    plan: &StepPlan,
    logits: &Buffer,
    kind: RowKind,
) -> Result<specula_sampler::StepOutput, String> {
    match kind {
        RowKind::Logits => decoder.finish(StepScores::logits(logits)).map_err(err),
        RowKind::MaskedLogits => {
            let mut rows = Vec::new();
            for t in 0..plan.t_out() {
                rows.extend(runner_bitmask(decoder.row_prefix(t).map_err(err)?.len()));
            }
            // Rows past T_out (Gather mode) are not sampled from: any mask will do.
            rows.resize((logits.len() / VOCAB) * VOCAB.div_ceil(32), u32::MAX);
            let bitmask = device.upload(&rows).map_err(err)?;
            let scores = StepScores::logits(logits).with_bitmask(&bitmask);
            decoder.finish(scores).map_err(err)
        }
        RowKind::Probs => {
            let probs = runner_softmax(device, decoder, plan, logits)?;
            decoder.finish(StepScores::probs(&probs)).map_err(err)
        }
    }
}

/// Runs arrivals through a decoder ([`serve`]), the runner's step forwarding in `mode` and
/// handing the scores over as `kind` says.
fn run(
    device: &Arc<dyn Device>,
    config: &SamplerConfig,
    arrivals: &[Arrival],
    mode: Forward,
    kind: RowKind,
) -> Result<RunResult, String> {
    let mut decoder = Decoder::new(device.clone(), config.clone()).map_err(err)?;
    let served = serve(&mut decoder, arrivals, |decoder| {
        let plan = decoder.plan()?;
        if plan.is_empty() {
            return Ok(None);
        }
        let logits = forward(device.as_ref(), decoder, &plan, mode).map_err(StepError::Forward)?;
        let output = finish(device.as_ref(), decoder, &plan, &logits, kind);
        output.map(Some).map_err(StepError::Forward)
    })
    .map_err(err)?;
    let stats = decoder.stats();
    Ok(RunResult {
        tokens: served.generated,
        finished: served.finished,
        steps: stats.steps,
        proposed: stats.drafts_proposed,
        accepted: stats.drafts_accepted,
    })
}

/// A prompt that mostly follows the model's favoured chain, so n-gram lookups find matches.
fn prompt(rng: &mut Rng, len: usize) -> Vec<i32> {
    let mut prompt = vec![rng.range(1, VOCAB - 1) as i32];
    while prompt.len() < len {
        let last = prompt[prompt.len() - 1];
        let next = if rng.below(5) == 0 {
            rng.range(1, VOCAB - 1) as i32
        } else {
            ToyModel::successor(last)
        };
        prompt.push(next);
    }
    prompt
}

/// Requests with varied sampling parameters and seeds (some near 2^63), arriving over time.
fn arrivals(rng: &mut Rng, count: usize, max_prompt: usize) -> Vec<Arrival> {
    let mut step = 0;
    (0..count)
        .map(|_| {
            step += rng.below(4) as u64;
            let len = rng.range(1, max_prompt);
            let seed = match rng.below(5) {
                0 => u64::MAX - rng.below(4) as u64,
                1 => MAX_INFER_SEED - rng.below(12) as u64,
                _ => rng.next_u64(),
            };
            let request = Request::new(prompt(rng, len))
                // In the order of the draws: top_p, top_k, temperature.
                .with_params(
                    SamplingParams::default()
                        .with_seed(seed)
                        .with_top_p(rng.pick(&[1.0, 1.0, 0.95, 0.7, 0.3]))
                        .with_top_k(rng.pick(&[0, 0, 1, 3, 10, 1000]))
                        .with_temperature(rng.pick(&[0.0, 0.4, 0.8, 1.0, 1.5])),
                )
                .with_max_dec_len(rng.range(1, 50));
            Arrival { step, request }
        })
        .collect()
}

fn plain_config(strategy: Strategy, max_bsz: usize, max_model_len: usize) -> SamplerConfig {
    SamplerConfig::new(strategy, max_bsz, VOCAB, max_model_len, END_TOKENS.to_vec())
}

fn spec_config(
    rng: &mut Rng,
    strategy: Strategy,
    max_bsz: usize,
    max_model_len: usize,
    s: usize,
) -> SamplerConfig {
    let max_ngram_size = rng.range(1, 4);
    let ngram = NgramConfig {
        max_ngram_size,
        min_ngram_size: rng.range(1, max_ngram_size),
        // Sometimes a tight global budget, so some slots get fewer drafts than they could.
        threshold: if rng.below(3) == 0 {
            rng.range(NgramConfig::MIN_THRESHOLD, 12)
        } else {
            128
        },
    };
    plain_config(strategy, max_bsz, max_model_len).with_ngram(s, ngram)
}

fn same_tokens(
    label: &str,
    arrivals: &[Arrival],
    a: &RunResult,
    b: &RunResult,
) -> Result<(), String> {
    for (i, arrival) in arrivals.iter().enumerate() {
        if a.tokens[i] != b.tokens[i] || a.finished[i] != b.finished[i] {
            return Err(format!(
                "{label}: request {i} ({:?}) differs:\n  {:?} ({:?})\n  {:?} ({:?})",
                arrival.request, a.tokens[i], a.finished[i], b.tokens[i], b.finished[i]
            ));
        }
    }
    Ok(())
}

/// Speculative (S = 4 … 6, n-gram drafts) and plain (S = 1) decoding emit the same tokens, the
/// runner handing the decoder rows of `kind`.
fn spec_equals_plain(
    device: &Arc<dyn Device>,
    size: Size,
    strategy: Strategy,
    kind: RowKind,
) -> Result<(), String> {
    let cases = if size == Size::Quick { 6 } else { 40 };
    let (mut plain_steps, mut spec_steps, mut proposed, mut accepted) = (0, 0, 0, 0);
    for case in 0..cases {
        let mut rng = Rng::new(&format!("spec_equals_plain/{strategy}"), case);
        let max_bsz = rng.range(1, 4);
        let max_model_len = rng.range(16, 80);
        let s = rng.range(4, 6);
        let count = rng.range(2, 6);
        let mut arrivals = arrivals(&mut rng, count, 12);
        if kind == RowKind::MaskedLogits {
            for arrival in arrivals.iter_mut() {
                arrival.request = with_processing(&mut rng, arrival.request.clone());
            }
        }
        let spec = spec_config(&mut rng, strategy, max_bsz, max_model_len, s);
        let plain = plain_config(strategy, max_bsz, max_model_len);
        let mode = if case % 2 == 0 {
            Forward::Prefix
        } else {
            Forward::Gather
        };
        let a = run(device, &plain, &arrivals, mode, kind)?;
        let b = run(device, &spec, &arrivals, mode, kind)?;
        let label =
            format!("case {case} (bsz {max_bsz}, S {s}, max_model_len {max_model_len}, {mode:?})");
        same_tokens(&label, &arrivals, &a, &b)?;
        plain_steps += a.steps;
        spec_steps += b.steps;
        proposed += b.proposed;
        accepted += b.accepted;
    }
    if spec_steps >= plain_steps || accepted == 0 || accepted == proposed {
        return Err(format!(
            "the property was not exercised: {plain_steps} plain steps, {spec_steps} speculative, \
             {accepted}/{proposed} drafts accepted"
        ));
    }
    Ok(())
}

/// A request alone gives the tokens it gets in a mixed batch.
fn batch_invariance_requests(device: &Arc<dyn Device>, size: Size) -> Result<(), String> {
    let cases = if size == Size::Quick { 3 } else { 12 };
    for case in 0..cases {
        let mut rng = Rng::new("batch_invariance/requests", case);
        let strategy = if case % 2 == 0 {
            Strategy::TargetMatch
        } else {
            Strategy::Greedy
        };
        let arrivals = arrivals(&mut rng, 5, 10);
        let config = if case % 3 == 0 {
            plain_config(strategy, 4, 40)
        } else {
            spec_config(&mut rng, strategy, 4, 40, 5)
        };
        let batched = run(device, &config, &arrivals, Forward::Gather, RowKind::Probs)?;
        for (i, arrival) in arrivals.iter().enumerate() {
            let alone = [Arrival {
                step: 0,
                request: arrival.request.clone(),
            }];
            let single = SamplerConfig {
                max_bsz: 1,
                ..config.clone()
            };
            let solo = run(device, &single, &alone, Forward::Prefix, RowKind::Probs)?;
            if solo.tokens[0] != batched.tokens[i] {
                return Err(format!(
                    "case {case}: request {i} alone {:?}, in a batch {:?}",
                    solo.tokens[0], batched.tokens[i]
                ));
            }
        }
    }
    Ok(())
}

/// A row's sampled token, candidates and argmax do not depend on the other rows of the call.
fn batch_invariance_rows(device: &Arc<dyn Device>, size: Size) -> Result<(), String> {
    let (rows, vocab) = if size == Size::Quick {
        (12, 4099)
    } else {
        (48, 32000)
    };
    let mut rng = Rng::new("batch_invariance/rows", 0);
    for dtype in FLOAT_DTYPES {
        let probs: Vec<Vec<f32>> = (0..rows).map(|_| prob_row(&mut rng, vocab)).collect();
        let top_k: Vec<i32> = (0..rows)
            .map(|_| rng.pick(&[0, 1, 5, 50, vocab as i32]))
            .collect();
        let top_p: Vec<f32> = (0..rows)
            .map(|_| rng.pick(&[1.0, 0.9, 0.5, 0.99]))
            .collect();
        let seed: Vec<u64> = (0..rows).map(|_| rng.next_u64() % MAX_INFER_SEED).collect();
        // The cases of the rows `idx`, in that order.
        let flat = |idx: &[usize]| -> Vec<f32> {
            idx.iter().flat_map(|&r| probs[r].iter().copied()).collect()
        };
        let sample = |idx: &[usize]| -> Case {
            let (k, p, s) = (pick(&top_k, idx), pick(&top_p, idx), pick(&seed, idx));
            top_k_top_p_sample::case("sample".into(), dtype, vocab, &flat(idx), &k, &p, &s)
        };
        let candidates = |idx: &[usize]| -> Case {
            let p = pick(&top_p, idx);
            top_p_candidates::case("candidates".into(), dtype, vocab, 16, &flat(idx), &p, None)
        };
        let argmax = |idx: &[usize]| -> Case {
            argmax::case("argmax".into(), dtype, idx.len(), vocab, &flat(idx))
        };
        let all: Vec<usize> = (0..rows).collect();
        // The rows in another order, each twice: a different batch around every row.
        let shuffled: Vec<usize> = (0..2 * rows).map(|k| (k * 7 + 3) % rows).collect();
        for (op, build, outputs) in [
            (
                "top_k_top_p_sample",
                &sample as &dyn Fn(&[usize]) -> Case,
                &["tokens"][..],
            ),
            ("top_p_candidates", &candidates, &["ids", "scores", "lens"]),
            ("argmax", &argmax, &["out"]),
        ] {
            let batched = run_case(device.as_ref(), &build(&all)).map_err(err)?;
            let other = run_case(device.as_ref(), &build(&shuffled)).map_err(err)?;
            for r in 0..rows {
                let alone = run_case(device.as_ref(), &build(&[r])).map_err(err)?;
                for name in outputs {
                    let per_row = |t: &HostTensor, k: usize| -> Vec<u8> {
                        let n = t.bytes.len() / t.shape[0];
                        t.bytes[k * n..(k + 1) * n].to_vec()
                    };
                    let (Some(a), Some(b), Some(c)) = (
                        alone.tensors.get(*name),
                        batched.tensors.get(*name),
                        other.tensors.get(*name),
                    ) else {
                        return Err(format!("{op}: output {name} missing"));
                    };
                    let reference = per_row(a, 0);
                    let positions = std::iter::once((b, r)).chain(
                        shuffled
                            .iter()
                            .enumerate()
                            .filter(|(_, x)| **x == r)
                            .map(|(k, _)| (c, k)),
                    );
                    for (t, k) in positions {
                        if per_row(t, k) != reference {
                            return Err(format!(
                                "{op} {dtype}: row {r} alone differs from row {k} of a batch ({name})"
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The first token in rank order is the argmax (`docs/semantics.md` §4b step 1).

/// Logits rows for the rank-order properties: ordinary rows, hostile rows, and rows whose
/// largest logits read as one value — beyond `±2^64` (clamped) or below `2^-76` in magnitude
/// (flushed to +0, subnormals included) — with ties, −0 and +0, NaN and ±inf among them.
fn rank_probe_rows(rng: &mut Rng, rows: usize, vocab: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * vocab);
    let hostile = hostile_logit_rows(rng, rows, vocab);
    for r in 0..rows {
        let mut row = logit_row(rng, vocab);
        let place = |rng: &mut Rng, row: &mut [f32], values: &[f32], count: usize| {
            for _ in 0..count {
                let v = rng.below(vocab);
                row[v] = rng.pick(values);
            }
        };
        match r % 6 {
            0 => place(
                rng,
                &mut row,
                &[1e30, 3e38, 2e19, 1.9e19, f32::MAX, 5e37],
                1 + vocab / 50,
            ),
            1 => {
                // Every logit reads as +0: tiny normals and subnormals of both signs.
                for x in row.iter_mut() {
                    let bits = (rng.next_u64() as u32) & 0x997f_ffff;
                    *x = f32::from_bits(bits);
                }
                place(rng, &mut row, &[0.0, -0.0, f32::NAN], 3);
            }
            2 => {
                let huge = [-3e38, -1e30, -2e19, f32::NAN, f32::NEG_INFINITY];
                place(rng, &mut row, &huge, vocab);
                place(rng, &mut row, &[-1e25, -7e29], 2);
            }
            3 => place(
                rng,
                &mut row,
                &[3e38, f32::INFINITY, f32::NAN, 1e-40, -0.0],
                3,
            ),
            4 => row.copy_from_slice(&hostile[r * vocab..(r + 1) * vocab]),
            _ => {
                let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let near = [top, top, top.next_up(), 2e-39, -2e-39];
                place(rng, &mut row, &near, 1 + vocab / 100);
            }
        }
        out.extend(row);
    }
    out
}

/// The row of `values` (as the device reads them) is one whose first token in rank order is its
/// argmax at T = 0 (`t0`) or under top_k = 1: some logit above −inf; at T = 0 at most one +inf
/// (several +inf tokens each weigh `2^40` before the temperature is looked at, §4b step 2).
fn argmax_decides(row: &[f32], t0: bool) -> bool {
    let some = row.iter().any(|&x| x > f32::NEG_INFINITY);
    let infinities = row.iter().filter(|&&x| x == f32::INFINITY).count();
    some && (!t0 || infinities <= 1)
}

/// The `i32` output `name` of a case run.
fn i32_output(outputs: &crate::exec::Outputs, name: &str) -> Result<Vec<i32>, String> {
    outputs
        .tensors
        .get(name)
        .ok_or_else(|| format!("output {name} missing"))?
        .to_vec::<i32>()
        .map_err(err)
}

/// `top_k_top_p_sample` at T = 0 (any top_k and top_p), at top_k = 1 (any temperature and top_p),
/// and the first `top_p_candidates` id at T = 0 equal `argmax` on every row that has a logit
/// above −inf (§4b step 1: the rank order is that of the logits themselves).
fn first_in_rank_is_the_argmax(device: &Arc<dyn Device>, size: Size) -> Result<(), String> {
    let device = device.as_ref();
    let vocabs: &[usize] = match size {
        Size::Quick => &[7, 1031, 4099],
        Size::Full => &[7, 1031, 4099, 151_936],
    };
    for dtype in FLOAT_DTYPES {
        for &vocab in vocabs {
            let mut rng = Rng::new(&format!("first_in_rank/{dtype}"), vocab as u64);
            let rows = 24;
            let logits = rank_probe_rows(&mut rng, rows, vocab);
            let read = round_to(dtype, &logits);
            let argmax = run_case(
                device,
                &argmax::case("argmax".into(), dtype, rows, vocab, &logits),
            )
            .map_err(err)?;
            let argmax = i32_output(&argmax, "out")?;
            let seed: Vec<u64> = (0..rows).map(|_| rng.next_u64() % MAX_INFER_SEED).collect();
            let top_p: Vec<f32> = (0..rows)
                .map(|_| rng.pick(&[1.0, 0.9, 0.3, 1e-6]))
                .collect();
            let any_k: Vec<i32> = (0..rows)
                .map(|_| rng.pick(&[0, 1, 2, 50, vocab as i32]))
                .collect();
            let any_t: Vec<f32> = (0..rows)
                .map(|_| rng.pick(&[1.0, 0.7, 2.5, 1e-3, 1e3, f32::INFINITY]))
                .collect();
            let zero_t = vec![0.0; rows];
            let one_k = vec![1; rows];
            let checks = [
                ("a T = 0 sample", &zero_t, &any_k, true),
                ("a top_k = 1 sample", &any_t, &one_k, false),
            ];
            for (what, t, k, t0) in checks {
                let case = top_k_top_p_sample::logits_case(
                    "sample".into(),
                    dtype,
                    vocab,
                    &logits,
                    t,
                    k,
                    &top_p,
                    &seed,
                );
                let tokens = i32_output(&run_case(device, &case).map_err(err)?, "tokens")?;
                compare_with_argmax(what, dtype, vocab, &read, &argmax, &tokens, t0)?;
            }
            let case = top_p_candidates::logits_case(
                "candidates".into(),
                dtype,
                vocab,
                4,
                &logits,
                &zero_t,
                &top_p,
                None,
            );
            let ids = i32_output(&run_case(device, &case).map_err(err)?, "ids")?;
            let first: Vec<i32> = ids.chunks(4).map(|c| c[0]).collect();
            compare_with_argmax(
                "the first T = 0 candidate",
                dtype,
                vocab,
                &read,
                &argmax,
                &first,
                true,
            )?;
        }
    }
    Ok(())
}

/// Row by row, `tokens` equal `argmax` where [`argmax_decides`].
fn compare_with_argmax(
    what: &str,
    dtype: DType,
    vocab: usize,
    read: &[f32],
    argmax: &[i32],
    tokens: &[i32],
    t0: bool,
) -> Result<(), String> {
    for (r, row) in read.chunks(vocab).enumerate() {
        if argmax_decides(row, t0) && tokens.get(r) != argmax.get(r) {
            return Err(format!(
                "{dtype}, V = {vocab}, row {r}: {what} gave {:?}, argmax {:?}",
                tokens.get(r),
                argmax.get(r)
            ));
        }
    }
    Ok(())
}

/// Through `process_logits` with every parameter off, the rows of [`rank_probe_rows`] come back
/// as they were (NaN as −inf), their fallback is the argmax, and the fused processed sample at
/// T = 0 is the argmax (`docs/semantics.md` §4c: a token no step changes keeps its logit).
fn processed_first_in_rank_is_the_argmax(
    device: &Arc<dyn Device>,
    size: Size,
) -> Result<(), String> {
    let device = device.as_ref();
    let vocabs: &[usize] = match size {
        Size::Quick => &[7, 1031, 4099],
        Size::Full => &[7, 1031, 4099, 151_936],
    };
    for &vocab in vocabs {
        let mut rng = Rng::new("first_in_rank/processed", vocab as u64);
        let mut st = process_logits::Setup::random(
            &mut rng,
            dims(6, 5, 3),
            vocab,
            true,
            DType::F32,
            process_logits::Features::default(),
        );
        st.scores = rank_probe_rows(&mut rng, st.rows, vocab);
        st.temperature = Some(vec![0.0; st.rows]);
        let argmax = run_case(
            device,
            &argmax::case("argmax".into(), DType::F32, st.rows, vocab, &st.scores),
        )
        .map_err(err)?;
        let argmax = i32_output(&argmax, "out")?;
        let outputs = run_case(device, &st.case("processed".into())).map_err(err)?;
        let processed = outputs
            .tensors
            .get("processed")
            .ok_or("output processed missing")?
            .to_vec::<f32>()
            .map_err(err)?;
        let fallback = i32_output(&outputs, "fallback")?;
        let sampled = run_case(
            device,
            &top_k_top_p_sample::processed_case("sample".into(), &st),
        )
        .map_err(err)?;
        let tokens = i32_output(&sampled, "tokens")?;
        for r in 0..st.rows {
            let in_slot = usize::try_from(st.batch_id[r]).is_ok_and(|b| b < st.batch.dims.real_bsz);
            if !in_slot {
                continue;
            }
            let row = &st.scores[r * vocab..(r + 1) * vocab];
            let kept = &processed[r * vocab..(r + 1) * vocab];
            let unchanged = row.iter().zip(kept).all(|(&x, &y)| {
                let x = if x.is_nan() { f32::NEG_INFINITY } else { x };
                x.to_bits() == y.to_bits()
            });
            if !unchanged {
                return Err(format!(
                    "V = {vocab}, row {r}: processing with nothing on changed the row"
                ));
            }
            compare_with_argmax(
                "the fallback",
                DType::F32,
                vocab,
                row,
                &argmax[r..=r],
                &fallback[r..=r],
                false,
            )
            .map_err(|e| format!("{e} (row {r})"))?;
            compare_with_argmax(
                "the T = 0 processed sample",
                DType::F32,
                vocab,
                row,
                &argmax[r..=r],
                &tokens[r..=r],
                true,
            )
            .map_err(|e| format!("{e} (row {r})"))?;
        }
    }
    Ok(())
}

/// The entries `idx` of `values`, in that order.
fn pick<T: Copy>(values: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&r| values[r]).collect()
}

// ---------------------------------------------------------------------------------------------
// Chi-square tests: REJECTION preserves the target distribution; logits rows are sampled with
// softmax's frequencies.

/// The distribution rows stand for, from the values the device reads (unnormalised): probability
/// rows as they are, logits rows through a softmax at `temperature` (f64; NaN counts as −inf).
fn distribution(read: &[f32], temperature: Option<f32>) -> Vec<f64> {
    let Some(t) = temperature else {
        return read.iter().map(|&p| f64::from(p)).collect();
    };
    let logit = |l: f32| {
        if l.is_nan() {
            f64::NEG_INFINITY
        } else {
            f64::from(l)
        }
    };
    let m = read.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(logit(l)));
    read.iter()
        .map(|&l| ((logit(l) - m) / f64::from(t)).exp())
        .collect()
}

/// The distribution `p` (unnormalised) after top-k and top-p, ranking tokens by value, then id.
fn filtered(p: &[f64], top_k: usize, top_p: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let k = if top_k > 0 && top_k < p.len() {
        top_k
    } else {
        p.len()
    };
    let survivors = &order[..k];
    let total: f64 = survivors.iter().map(|&v| p[v]).sum();
    let mut kept = Vec::new();
    let mut mass = 0.0;
    for &v in survivors {
        kept.push(v);
        mass += p[v];
        if mass >= top_p * total - 1e-12 {
            break;
        }
    }
    let mut out = vec![0.0; p.len()];
    for &v in &kept {
        out[v] = p[v] / mass;
    }
    out
}

/// The chi-square critical value at p = 0.001 (Wilson–Hilferty).
fn chi_square_critical(df: usize) -> f64 {
    let df = df as f64;
    let z = 3.09;
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Token counts against `expected` probabilities: a token of probability 0 is never drawn, and
/// the chi-square statistic over the others stays below the critical value at p = 0.001.
fn chi_square(label: &str, counts: &[u64], expected: &[f64]) -> Result<(), String> {
    let n: u64 = counts.iter().sum();
    let mut chi2 = 0.0;
    let mut df = 0;
    for (v, (&count, &p)) in counts.iter().zip(expected).enumerate() {
        if p == 0.0 {
            if count != 0 {
                return Err(format!(
                    "{label}: token {v} has probability 0 but was drawn {count} times"
                ));
            }
            continue;
        }
        let e = p * n as f64;
        chi2 += (count as f64 - e).powi(2) / e;
        df += 1;
    }
    let critical = chi_square_critical(df.max(2) - 1);
    if chi2 > critical {
        return Err(format!(
            "{label}: chi-square {chi2:.2} > {critical:.2} (df {}): counts {counts:?}, expected {:?}",
            df.max(2) - 1,
            expected
                .iter()
                .map(|p| (p * n as f64).round())
                .collect::<Vec<_>>()
        ));
    }
    Ok(())
}

/// Counts of each token id in `0 .. vocab`; an id outside it is an error.
fn token_counts(
    label: &str,
    tokens: impl Iterator<Item = i32>,
    vocab: usize,
) -> Result<Vec<u64>, String> {
    let mut counts = vec![0u64; vocab];
    for t in tokens {
        let v = usize::try_from(t)
            .ok()
            .filter(|&v| v < vocab)
            .ok_or(format!("{label}: token {t}"))?;
        counts[v] += 1;
    }
    Ok(counts)
}

/// `top_k_top_p_sample` of one logits row repeated over many rows with fixed, distinct seeds, at
/// T = 1 without top-k or top-p, draws each token with its softmax probability: in every dtype,
/// with ties at the maximum, NaN and −inf logits (never drawn) and, in f32, the row shifted by
/// 10^4 (the weights depend on the gaps to the maximum only).
fn logits_sampling_frequencies(device: &Arc<dyn Device>, size: Size) -> Result<(), String> {
    let n = if size == Size::Quick { 20_000 } else { 200_000 };
    let row: Vec<f32> = [
        2.0, 1.5, 1.5, 0.7, 0.0, -0.3, -1.0, -1.2, -2.0, -2.5, -3.0, -3.3, -4.0,
    ]
    .into_iter()
    .chain([f32::NEG_INFINITY, 1.9, f32::NAN])
    .collect();
    let vocab = row.len();
    let shifted: Vec<f32> = row.iter().map(|&l| l + 1e4).collect();
    let configs = [
        ("f32", DType::F32, &row[..]),
        ("f16", DType::F16, &row[..]),
        ("bf16", DType::BF16, &row[..]),
        ("f32_shifted_1e4", DType::F32, &shifted[..]),
    ];
    let seeds: Vec<u64> = (0..n as u64)
        .map(|r| mix(r ^ 0x106175) % MAX_INFER_SEED)
        .collect();
    for (label, dtype, row) in configs {
        let logits: Vec<f32> = (0..n).flat_map(|_| row.iter().copied()).collect();
        let case = top_k_top_p_sample::logits_case(
            label.into(),
            dtype,
            vocab,
            &logits,
            &vec![1.0; n],
            &vec![0; n],
            &vec![1.0; n],
            &seeds,
        );
        let out = run_case(device.as_ref(), &case).map_err(err)?;
        let tokens: Vec<i32> = out
            .tensors
            .get("tokens")
            .ok_or("top_k_top_p_sample output missing")?
            .to_vec()
            .map_err(err)?;
        let counts = token_counts(label, tokens.into_iter(), vocab)?;
        let weights = distribution(&round_to(dtype, row), Some(1.0));
        let expected = filtered(&weights, 0, 1.0);
        chi_square(label, &counts, &expected)?;
    }
    Ok(())
}

/// One REJECTION configuration of a chi-square test.
struct RejectionConfig<'a> {
    label: &'static str,
    /// Dtypes of the target and draft rows.
    dtypes: (DType, DType),
    /// The draft row (probabilities, or logits at `temperature`).
    draft: &'a [f32],
    /// The target's filter.
    top_k: usize,
    top_p: f32,
    /// `Some(T)`: target and draft rows are logits at temperature T; `None`: probabilities.
    temperature: Option<f32>,
}

/// REJECTION's first emitted token follows the target's filtered distribution, for probability
/// rows and draft distributions near, far from and equal to the target, in every dtype.
fn rejection_preserves_target(device: &Arc<dyn Device>, size: Size) -> Result<(), String> {
    let p: Vec<f32> = vec![0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.015, 0.005];
    let uniform = vec![0.1f32; p.len()];
    let reversed: Vec<f32> = p.iter().rev().copied().collect();
    let skewed: Vec<f32> = vec![0.02, 0.02, 0.02, 0.3, 0.3, 0.04, 0.1, 0.1, 0.05, 0.05];
    let config = |label, dtypes, draft, top_k, top_p| RejectionConfig {
        label,
        dtypes,
        draft,
        top_k,
        top_p,
        temperature: None,
    };
    let (f32, f16, bf16) = (DType::F32, DType::F16, DType::BF16);
    let configs = [
        config("uniform_draft", (f32, f32), &uniform, 0, 1.0),
        config("reversed_draft_top_k6", (f32, f32), &reversed, 6, 1.0),
        config("same_draft", (f16, f16), &p, 0, 1.0),
        config("skewed_draft_top_p07", (bf16, f16), &skewed, 0, 0.7),
        config("skewed_draft_top_k4_top_p09", (f32, bf16), &skewed, 4, 0.9),
    ];
    rejection_trials(device.as_ref(), size, &p, &configs)
}

/// REJECTION's first emitted token follows the target's filtered distribution for logits rows
/// (target and draft weighed at the row's temperature, `docs/semantics.md` §4b), for draft logits
/// near, far from and equal to the target's, in every dtype and at several temperatures. The top-p
/// cuts fall at least 0.03 of mass away from the kept prefix's edges, so the f64 softmax keeps the
/// same tokens as the exact weights.
fn rejection_from_logits_preserves_target(
    device: &Arc<dyn Device>,
    size: Size,
) -> Result<(), String> {
    let l: Vec<f32> = vec![1.2, 0.8, 0.5, 0.1, -0.1, -0.3, -0.6, -1.1, -1.8, -2.9];
    let uniform = vec![0.0f32; l.len()];
    let reversed: Vec<f32> = l.iter().rev().copied().collect();
    let skewed: Vec<f32> = vec![-2.0, -2.0, -2.0, 1.0, 1.0, -1.5, 0.0, 0.0, -0.7, -0.7];
    let config = |label, dtypes, draft, top_k, top_p, t| RejectionConfig {
        label,
        dtypes,
        draft,
        top_k,
        top_p,
        temperature: Some(t),
    };
    let (f32, f16, bf16) = (DType::F32, DType::F16, DType::BF16);
    let configs = [
        config("uniform_draft", (f32, f32), &uniform, 0, 1.0, 1.0),
        config(
            "reversed_draft_top_k6_t07",
            (f32, f32),
            &reversed,
            6,
            1.0,
            0.7,
        ),
        config("same_draft", (f16, f16), &l, 0, 1.0, 1.0),
        config(
            "skewed_draft_top_p07_t16",
            (bf16, f16),
            &skewed,
            0,
            0.7,
            1.6,
        ),
        config(
            "skewed_draft_top_k4_top_p09",
            (f32, bf16),
            &skewed,
            4,
            0.9,
            1.0,
        ),
    ];
    rejection_trials(device.as_ref(), size, &l, &configs)
}

/// Runs each REJECTION configuration against the `target` row (see [`rejection_trial`]).
fn rejection_trials(
    device: &dyn Device,
    size: Size,
    target: &[f32],
    configs: &[RejectionConfig<'_>],
) -> Result<(), String> {
    let trials = if size == Size::Quick { 12_000 } else { 100_000 };
    for config in configs {
        rejection_trial(device, trials, target, config)?;
    }
    Ok(())
}

/// One slot per trial, each with one draft drawn from the draft distribution: the first emitted
/// token (the accepted draft or the correction) must follow the target's filtered distribution,
/// and, unless the draft equals the target, drafts must be both accepted and rejected.
fn rejection_trial(
    device: &dyn Device,
    n: usize,
    target_row: &[f32],
    c: &RejectionConfig<'_>,
) -> Result<(), String> {
    let (label, vocab) = (c.label, target_row.len());
    let stream = match c.temperature {
        None => "rejection_preserves_target".to_owned(),
        Some(_) => format!("rejection_preserves_target/logits/{label}"),
    };
    let mut rng = Rng::new(&stream, n as u64);
    let target_read = round_to(c.dtypes.0, target_row);
    let draft_read = round_to(c.dtypes.1, c.draft);
    let expected = filtered(
        &distribution(&target_read, c.temperature),
        c.top_k,
        f64::from(c.top_p),
    );
    let draft_distribution: Vec<f32> = match c.temperature {
        None => draft_read,
        Some(t) => softmax_f64(&draft_read.iter().map(|&l| l / t).collect::<Vec<_>>()),
    };
    // Rows 2j (check and correction) and 2j + 1 (bonus) of slot j: the last token, then a draft.
    let s = 2;
    let mut draft_tokens = Vec::with_capacity(n * s);
    for _ in 0..n {
        draft_tokens.push(1);
        draft_tokens.push(sample_index(&mut rng, &draft_distribution) as i32);
    }
    let rows = 2 * n;
    let case = rejection_case(c, n, rows, draft_tokens, target_row);
    let out = run_case(device, &case).map_err(err)?;
    let (Some(tokens), Some(nums)) = (
        out.tensors.get("accept_tokens"),
        out.tensors.get("accept_num"),
    ) else {
        return Err("verify_draft_tokens outputs missing".into());
    };
    let tokens: Vec<i32> = tokens.to_vec().map_err(err)?;
    let nums: Vec<i32> = nums.to_vec().map_err(err)?;
    if let Some(j) = nums.iter().position(|&k| !(1..=2).contains(&k)) {
        return Err(format!("{label}: slot {j} emitted {} tokens", nums[j]));
    }
    let accepted = nums.iter().filter(|&&k| k == 2).count();
    let counts = token_counts(label, (0..n).map(|j| tokens[j * s]), vocab)?;
    chi_square(label, &counts, &expected)?;
    if !label.starts_with("same_draft") && (accepted == 0 || accepted == n) {
        return Err(format!(
            "{label}: {accepted}/{n} drafts accepted; the test does not exercise both branches"
        ));
    }
    Ok(())
}

/// The `verify_draft_tokens` case of a REJECTION trial: `n` slots of one draft each, `rows`
/// output rows of the target row, the draft row for every slot, fixed seeds.
fn rejection_case(
    c: &RejectionConfig<'_>,
    n: usize,
    rows: usize,
    draft_tokens: Vec<i32>,
    target_row: &[f32],
) -> Case {
    let vocab = target_row.len();
    let seeds: Vec<u64> = (0..rows as u64)
        .map(|r| mix(r ^ 0x5EED) % MAX_INFER_SEED)
        .collect();
    let target: Vec<f32> = (0..rows).flat_map(|_| target_row.iter().copied()).collect();
    let draft: Vec<f32> = (0..n).flat_map(|_| c.draft.iter().copied()).collect();
    let batch = Batch::new(dims(n, n, 2), vec![2; n], vec![0; n]);
    let mut state = verify_draft_tokens::State::new(batch, vocab, rows);
    state.draft_tokens = draft_tokens;
    state.end_tokens = vec![vocab as i32 + 1];
    state.seeds = seeds;
    let (target_name, draft_name) = match c.temperature {
        None => ("target_probs", "draft_probs"),
        Some(_) => ("target_logits", "draft_logits"),
    };
    let mut case = state
        .case(c.label.into(), Strategy::Rejection, 0, false, false)
        .with(
            target_name,
            float_tensor(c.dtypes.0, &[rows, vocab], &target),
        )
        .with(draft_name, float_tensor(c.dtypes.1, &[n, vocab], &draft))
        .with("top_k", i32s(&vec![c.top_k as i32; rows]))
        .with("top_p", f32s(&vec![c.top_p; rows]));
    if let Some(t) = c.temperature {
        case = case.with("temperature", f32s(&vec![t; rows]));
        if let CaseParams::VerifyDraftTokens(params) = &mut case.params {
            params.logits = true;
        }
    }
    case
}

// ---------------------------------------------------------------------------------------------
// Memory operations: validated once, in the front, for every backend.

/// `result` must be the host-side rejection `kind` naming `arg`, by a memory operation; `what`
/// names the call.
fn rejected<T>(
    what: &str,
    result: specula_backend_api::Result<T>,
    kind: ErrorKind,
    arg: &str,
) -> Result<(), String> {
    let expected = ExpectedError::new(kind, arg);
    match result {
        Ok(_) => Err(format!("{what}: succeeded, expected {expected}")),
        Err(e) if ExpectedError::of(&e).as_ref() != Some(&expected) => {
            Err(format!("{what}: `{e}`, expected {expected}"))
        }
        Err(e) if kind != OutOfMemory && !e.to_string().contains(Op::Memory.name()) => {
            Err(format!("{what}: `{e}` does not name the memory operations"))
        }
        Err(_) => Ok(()),
    }
}

/// `upload_bytes` and `write_bytes` of a byte count that is not whole elements, `write_bytes` of
/// another length than the window (nothing is written), a buffer of another device to `write_bytes` and
/// `download_bytes`, `alloc_zeroed` whose byte size overflows `usize` or of 2^40 f32 (4 TiB:
/// `OutOfMemory`, never an abort), typed `write` / `download` of another dtype.
fn invalid_memory_arguments(device: &Arc<dyn Device>, _size: Size) -> Result<(), String> {
    let device = device.as_ref();
    rejected(
        "upload_bytes of 6 bytes as f32",
        device.upload_bytes(DType::F32, &[0; 6]),
        InvalidArgument,
        "bytes",
    )?;
    let mut buffer = device.alloc_zeroed(DType::I32, 6).map_err(err)?;
    buffer.set_window(2, 3).map_err(err)?;
    rejected(
        "write_bytes of 11 bytes into an i32 window",
        device.write_bytes(&mut buffer, &[1; 11]),
        InvalidArgument,
        "bytes",
    )?;
    for elements in [2, 6] {
        rejected(
            &format!("write_bytes of {elements} elements into a 3-element window"),
            device.write_bytes(&mut buffer, &vec![1; 4 * elements]),
            ShapeMismatch,
            "bytes",
        )?;
    }
    rejected(
        "write::<u32> into an i32 buffer",
        device.write(&mut buffer, &[1u32; 3]),
        DtypeMismatch,
        "buffer",
    )?;
    buffer.reset_window();
    let contents: Vec<i32> = device.download(&buffer).map_err(err)?;
    if contents != [0; 6] {
        return Err(format!("rejected writes changed the buffer: {contents:?}"));
    }
    let other = specula_backend_cpu::CpuDevice::with_threads(1).map_err(err)?;
    let mut foreign = other.alloc_zeroed(DType::I32, 4).map_err(err)?;
    rejected(
        "write_bytes to a buffer of another device",
        device.write_bytes(&mut foreign, &[0; 16]),
        DeviceMismatch,
        "dst",
    )?;
    rejected(
        "download_bytes of a buffer of another device",
        device.download_bytes(&foreign),
        DeviceMismatch,
        "src",
    )?;
    rejected(
        "alloc_zeroed of usize::MAX / 2 f32 (the byte size overflows usize)",
        device.alloc_zeroed(DType::F32, usize::MAX / 2),
        OutOfMemory,
        "",
    )?;
    // 2^48 bytes: more than any x86-64 or AArch64 process can map, so no device can hand it out
    // (4 TiB, the size an outside fuzzer used, could be granted lazily under overcommit).
    rejected(
        "alloc_zeroed of 2^46 f32 (2^48 bytes)",
        device.alloc_zeroed(DType::F32, 1 << 46),
        OutOfMemory,
        "",
    )?;
    let floats = device.upload(&[1.0f32, 2.0]).map_err(err)?;
    rejected(
        "download::<i32> of an f32 buffer",
        device.download::<i32>(&floats),
        DtypeMismatch,
        "buffer",
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Every property `device` supports holds on it; returns the names of those it skips.
    fn every_supported_property_holds(device: Arc<dyn Device>) -> Vec<&'static str> {
        let mut skipped = Vec::new();
        for property in properties() {
            if property.missing_capability(device.as_ref()).is_some() {
                skipped.push(property.name);
                continue;
            }
            let start = Instant::now();
            let result = (property.check)(&device, Size::Quick);
            eprintln!("{}: {:?}", property.name, start.elapsed());
            assert!(result.is_ok(), "{}: {}", property.name, result.unwrap_err());
        }
        skipped
    }

    #[test]
    fn every_property_holds_on_the_cpu() {
        let device = Arc::new(specula_backend_cpu::CpuDevice::new().unwrap());
        let skipped = every_supported_property_holds(device);
        eprintln!("skipped (no logits rows on this CPU backend): {skipped:?}");
    }

    /// The reference device weighs logits rows: every property, those from logits included.
    #[test]
    fn every_property_holds_on_the_reference_device() {
        let device = Arc::new(specula_reference::ReferenceDevice::new());
        assert!(device.capabilities().logits);
        assert_eq!(every_supported_property_holds(device), Vec::<&str>::new());
    }

    #[test]
    fn names_are_unique() {
        let names: std::collections::HashSet<_> = properties().iter().map(|p| p.name).collect();
        assert_eq!(names.len(), properties().len());
    }
}
