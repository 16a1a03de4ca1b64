//! End-to-end properties every backend must keep, checked through the sampler's [`Decoder`] and
//! through the ops directly:
//!
//! - `spec_equals_plain::{target_match, greedy}`: speculative decoding with the n-gram proposer
//!   (S = 4 … 6) emits token for token what plain decoding (S = 1) emits, for a toy target model
//!   whose probabilities are a pure function of the prefix, in mixed batches where prefills arrive
//!   at different steps (contract principle 4);
//! - `rejection_preserves_target`: the first token REJECTION emits is distributed as the target's
//!   filtered distribution, whatever the draft distribution (a chi-square test with fixed seeds, so
//!   the verdict is deterministic);
//! - `batch_invariance::requests` and `batch_invariance::rows`: a request's tokens, and a row's
//!   sampled token, candidates and argmax, do not depend on the rest of the batch (principle 3).

use std::collections::VecDeque;
use std::sync::Arc;

use specula_backend_api::abi::MAX_INFER_SEED;
use specula_backend_api::{Buffer, DType, Device, DeviceExt, Strategy};
use specula_sampler::{
    Decoder, FinishReason, NgramConfig, Request, SamplerConfig, StepPlan, StepScores,
};

use crate::case::{Case, CaseParams, Dims};
use crate::cases::Size;
use crate::cases::generate::{Rng, f32s, float_tensor, i32s, mix, prob_row, round_to, u8s, u64s};
use crate::exec::run_case;
use crate::tensor::HostTensor;

/// A named end-to-end property.
#[derive(Clone, Copy, Debug)]
pub struct Property {
    /// Trial name segment, e.g. `spec_equals_plain::target_match`.
    pub name: &'static str,
    /// Checks the property on a device; `Err` explains the failure.
    pub check: fn(&Arc<dyn Device>, crate::cases::Size) -> Result<(), String>,
}

/// Every property.
pub fn properties() -> Vec<Property> {
    vec![
        Property {
            name: "spec_equals_plain::target_match",
            check: |device, size| spec_equals_plain(device, size, Strategy::TargetMatch),
        },
        Property {
            name: "spec_equals_plain::greedy",
            check: |device, size| spec_equals_plain(device, size, Strategy::Greedy),
        },
        Property {
            name: "rejection_preserves_target",
            check: rejection_preserves_target,
        },
        Property {
            name: "batch_invariance::requests",
            check: batch_invariance_requests,
        },
        Property {
            name: "batch_invariance::rows",
            check: batch_invariance_rows,
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

/// One request arriving at a step.
#[derive(Clone, Debug)]
struct Arrival {
    step: u64,
    request: Request,
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

/// Runs arrivals through a decoder: a request is inserted at its arrival step (or as soon as a
/// slot is free, or at once when nothing runs); finished requests are removed after each step.
fn run(
    device: &Arc<dyn Device>,
    config: &SamplerConfig,
    arrivals: &[Arrival],
    mode: Forward,
) -> Result<RunResult, String> {
    let mut decoder = Decoder::new(device.clone(), config.clone()).map_err(err)?;
    let mut pending: VecDeque<(usize, &Arrival)> = arrivals.iter().enumerate().collect();
    let mut in_slot: Vec<Option<usize>> = vec![None; config.max_bsz];
    let mut result = RunResult {
        tokens: vec![Vec::new(); arrivals.len()],
        finished: vec![None; arrivals.len()],
        steps: 0,
        proposed: 0,
        accepted: 0,
    };
    let mut guard = 0;
    loop {
        while let Some(&(index, arrival)) = pending.front() {
            let due = arrival.step <= decoder.step_number() || !decoder.has_running();
            if !due || decoder.free_slots() == 0 {
                break;
            }
            let slot = decoder.insert(arrival.request.clone()).map_err(err)?;
            in_slot[slot] = Some(index);
            pending.pop_front();
        }
        if pending.is_empty() && !decoder.has_running() {
            break;
        }
        let plan = decoder.plan().map_err(err)?;
        if plan.is_empty() {
            return Err("a running request produced no output row".into());
        }
        let scores = forward(device.as_ref(), &decoder, &plan, mode)?;
        let output = decoder.finish(StepScores::logits(&scores)).map_err(err)?;
        for slot_output in &output.slots {
            if slot_output.tokens.is_empty() && slot_output.finished.is_none() {
                return Err(format!(
                    "slot {} emitted nothing and did not finish",
                    slot_output.slot
                ));
            }
            if slot_output.finished.is_some() {
                let slot = slot_output.slot;
                let removed = decoder.remove(slot).map_err(err)?;
                let index = in_slot[slot]
                    .take()
                    .ok_or("a finished slot was not tracked")?;
                result.tokens[index] = removed.generated;
                result.finished[index] = removed.finished;
            }
        }
        guard += 1;
        if guard > 100_000 {
            return Err("decoding does not terminate".into());
        }
    }
    let stats = decoder.stats();
    result.steps = stats.steps;
    result.proposed = stats.drafts_proposed;
    result.accepted = stats.drafts_accepted;
    Ok(result)
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
                .with_seed(seed)
                .with_sampling(
                    rng.pick(&[1.0, 1.0, 0.95, 0.7, 0.3]),
                    rng.pick(&[0, 0, 1, 3, 10, 1000]),
                    rng.pick(&[0.0, 0.4, 0.8, 1.0, 1.5]),
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
            rng.range(1, 12)
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

/// Speculative (S = 4 … 6, n-gram drafts) and plain (S = 1) decoding emit the same tokens.
fn spec_equals_plain(
    device: &Arc<dyn Device>,
    size: Size,
    strategy: Strategy,
) -> Result<(), String> {
    let cases = if size == Size::Quick { 6 } else { 40 };
    let (mut plain_steps, mut spec_steps, mut proposed, mut accepted) = (0, 0, 0, 0);
    for case in 0..cases {
        let mut rng = Rng::new(&format!("spec_equals_plain/{strategy}"), case);
        let max_bsz = rng.range(1, 4);
        let max_model_len = rng.range(16, 80);
        let s = rng.range(4, 6);
        let count = rng.range(2, 6);
        let arrivals = arrivals(&mut rng, count, 12);
        let spec = spec_config(&mut rng, strategy, max_bsz, max_model_len, s);
        let plain = plain_config(strategy, max_bsz, max_model_len);
        let mode = if case % 2 == 0 {
            Forward::Prefix
        } else {
            Forward::Gather
        };
        let a = run(device, &plain, &arrivals, mode)?;
        let b = run(device, &spec, &arrivals, mode)?;
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
        let batched = run(device, &config, &arrivals, Forward::Gather)?;
        for (i, arrival) in arrivals.iter().enumerate() {
            let alone = [Arrival {
                step: 0,
                request: arrival.request.clone(),
            }];
            let single = SamplerConfig {
                max_bsz: 1,
                ..config.clone()
            };
            let solo = run(device, &single, &alone, Forward::Prefix)?;
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
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let probs: Vec<Vec<f32>> = (0..rows).map(|_| prob_row(&mut rng, vocab)).collect();
        let top_k: Vec<i32> = (0..rows)
            .map(|_| rng.pick(&[0, 1, 5, 50, vocab as i32]))
            .collect();
        let top_p: Vec<f32> = (0..rows)
            .map(|_| rng.pick(&[1.0, 0.9, 0.5, 0.99]))
            .collect();
        let seed: Vec<u64> = (0..rows).map(|_| rng.next_u64() % MAX_INFER_SEED).collect();
        let sample = |idx: &[usize]| -> Case {
            let flat: Vec<f32> = idx.iter().flat_map(|&r| probs[r].iter().copied()).collect();
            Case::new(
                "sample",
                CaseParams::TopKTopPSample {
                    rows: idx.len(),
                    vocab,
                },
            )
            .with("probs", float_tensor(dtype, &[idx.len(), vocab], &flat))
            .with(
                "top_k",
                i32s(&idx.iter().map(|&r| top_k[r]).collect::<Vec<_>>()),
            )
            .with(
                "top_p",
                f32s(&idx.iter().map(|&r| top_p[r]).collect::<Vec<_>>()),
            )
            .with(
                "seed",
                u64s(&idx.iter().map(|&r| seed[r]).collect::<Vec<_>>()),
            )
        };
        let candidates = |idx: &[usize]| -> Case {
            let flat: Vec<f32> = idx.iter().flat_map(|&r| probs[r].iter().copied()).collect();
            Case::new(
                "candidates",
                CaseParams::TopPCandidates {
                    rows: idx.len(),
                    vocab,
                    candidates: 16,
                },
            )
            .with("probs", float_tensor(dtype, &[idx.len(), vocab], &flat))
            .with(
                "top_p",
                f32s(&idx.iter().map(|&r| top_p[r]).collect::<Vec<_>>()),
            )
        };
        let argmax = |idx: &[usize]| -> Case {
            let flat: Vec<f32> = idx.iter().flat_map(|&r| probs[r].iter().copied()).collect();
            Case::new(
                "argmax",
                CaseParams::Argmax {
                    rows: idx.len(),
                    vocab,
                },
            )
            .with("input", float_tensor(dtype, &[idx.len(), vocab], &flat))
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
// REJECTION preserves the target distribution.

/// The target's distribution after top-k and top-p, in f64, from the values the device reads.
fn filtered(p: &[f32], top_k: usize, top_p: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let k = if top_k > 0 && top_k < p.len() {
        top_k
    } else {
        p.len()
    };
    let survivors = &order[..k];
    let total: f64 = survivors.iter().map(|&v| f64::from(p[v])).sum();
    let mut kept = Vec::new();
    let mut mass = 0.0;
    for &v in survivors {
        kept.push(v);
        mass += f64::from(p[v]);
        if mass >= top_p * total - 1e-12 {
            break;
        }
    }
    let mut out = vec![0.0; p.len()];
    for &v in &kept {
        out[v] = f64::from(p[v]) / mass;
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

/// REJECTION's first emitted token follows the target's filtered distribution, for draft
/// distributions near, far from and equal to the target, in every dtype.
fn rejection_preserves_target(device: &Arc<dyn Device>, size: Size) -> Result<(), String> {
    let trials = if size == Size::Quick { 12_000 } else { 100_000 };
    let vocab = 10;
    let p: Vec<f32> = vec![0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.015, 0.005];
    let uniform = vec![0.1f32; vocab];
    let reversed: Vec<f32> = p.iter().rev().copied().collect();
    let skewed: Vec<f32> = vec![0.02, 0.02, 0.02, 0.3, 0.3, 0.04, 0.1, 0.1, 0.05, 0.05];
    let configs = [
        ("uniform_draft", DType::F32, DType::F32, &uniform, 0, 1.0f32),
        (
            "reversed_draft_top_k6",
            DType::F32,
            DType::F32,
            &reversed,
            6,
            1.0,
        ),
        ("same_draft", DType::F16, DType::F16, &p, 0, 1.0),
        (
            "skewed_draft_top_p07",
            DType::BF16,
            DType::F16,
            &skewed,
            0,
            0.7,
        ),
        (
            "skewed_draft_top_k4_top_p09",
            DType::F32,
            DType::BF16,
            &skewed,
            4,
            0.9,
        ),
    ];
    for (label, target_dtype, draft_dtype, q, top_k, top_p) in configs {
        let mut rng = Rng::new("rejection_preserves_target", trials as u64);
        let p_read = round_to(target_dtype, &p);
        let q_read = round_to(draft_dtype, q);
        let expected = filtered(&p_read, top_k, f64::from(top_p));
        // One slot per trial: the last token and one draft drawn from q; rows 2j (check and
        // correction) and 2j + 1 (bonus).
        let s = 2;
        let n = trials;
        let mut draft_tokens = Vec::with_capacity(n * s);
        for _ in 0..n {
            draft_tokens.push(1);
            draft_tokens.push(crate::cases::generate::sample_index(&mut rng, &q_read) as i32);
        }
        let rows = 2 * n;
        let seeds: Vec<u64> = (0..rows as u64)
            .map(|r| mix(r ^ 0x5EED) % MAX_INFER_SEED)
            .collect();
        let target: Vec<f32> = (0..rows).flat_map(|_| p.iter().copied()).collect();
        let draft: Vec<f32> = (0..n).flat_map(|_| q.iter().copied()).collect();
        let cu: Vec<i32> = (0..=n).map(|b| 2 * b as i32).collect();
        let dims = Dims {
            max_bsz: n,
            real_bsz: n,
            max_step_tokens: s,
        };
        let case = Case::new(
            label,
            CaseParams::VerifyDraftTokens {
                dims,
                rows,
                vocab,
                strategy: "rejection".into(),
                candidates: 0,
                accept_all: false,
                reject_all: false,
            },
        )
        .with("draft_tokens", i32s(&draft_tokens))
        .with("seq_lens_this_time", i32s(&vec![2; n]))
        .with("seq_lens_encoder", i32s(&vec![0; n]))
        .with("cu_seqlens_q_output", i32s(&cu))
        .with("stop_flags", u8s(&vec![0; n]))
        .with("is_block_step", u8s(&vec![0; n]))
        .with("reasoning_status", i32s(&vec![0; n]))
        .with("step_idx", i32s(&vec![0; n]))
        .with("max_dec_len", i32s(&vec![1000; n]))
        .with("end_tokens", i32s(&[vocab as i32 + 1]))
        .with("seeds", u64s(&seeds))
        .with(
            "target_probs",
            float_tensor(target_dtype, &[rows, vocab], &target),
        )
        .with(
            "draft_probs",
            float_tensor(draft_dtype, &[n, vocab], &draft),
        )
        .with("top_k", i32s(&vec![top_k as i32; rows]))
        .with("top_p", f32s(&vec![top_p; rows]));
        let out = run_case(device.as_ref(), &case).map_err(err)?;
        let (Some(tokens), Some(nums)) = (
            out.tensors.get("accept_tokens"),
            out.tensors.get("accept_num"),
        ) else {
            return Err("verify_draft_tokens outputs missing".into());
        };
        let tokens: Vec<i32> = tokens.to_vec().map_err(err)?;
        let nums: Vec<i32> = nums.to_vec().map_err(err)?;
        let mut counts = vec![0u64; vocab];
        let mut accepted = 0;
        for j in 0..n {
            if nums[j] < 1 || nums[j] > 2 {
                return Err(format!("{label}: slot {j} emitted {} tokens", nums[j]));
            }
            accepted += usize::from(nums[j] == 2);
            let t = tokens[j * s];
            let t = usize::try_from(t)
                .ok()
                .filter(|&t| t < vocab)
                .ok_or(format!("{label}: token {t}"))?;
            counts[t] += 1;
        }
        let mut chi2 = 0.0;
        let mut df = 0;
        for v in 0..vocab {
            let e = expected[v] * n as f64;
            if expected[v] == 0.0 {
                if counts[v] != 0 {
                    return Err(format!(
                        "{label}: token {v} is filtered out but was emitted {} times",
                        counts[v]
                    ));
                }
                continue;
            }
            chi2 += (counts[v] as f64 - e).powi(2) / e;
            df += 1;
        }
        let critical = chi_square_critical(df.max(2) - 1);
        if chi2 > critical {
            return Err(format!(
                "{label}: chi-square {chi2:.2} > {critical:.2} (df {}): counts {counts:?}, expected {:?}",
                df - 1,
                expected
                    .iter()
                    .map(|e| (e * n as f64).round())
                    .collect::<Vec<_>>()
            ));
        }
        if label != "same_draft" && (accepted == 0 || accepted == n) {
            return Err(format!(
                "{label}: {accepted}/{n} drafts accepted; the test does not exercise both branches"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn every_property_holds_on_the_cpu() {
        let device: Arc<dyn Device> = Arc::new(specula_backend_cpu::CpuDevice::new().unwrap());
        for property in properties() {
            let start = Instant::now();
            let result = (property.check)(&device, Size::Quick);
            eprintln!("{}: {:?}", property.name, start.elapsed());
            assert!(result.is_ok(), "{}: {}", property.name, result.unwrap_err());
        }
    }

    #[test]
    fn names_are_unique() {
        let names: std::collections::HashSet<_> = properties().iter().map(|p| p.name).collect();
        assert_eq!(names.len(), properties().len());
    }
}
