//! Whole decoder runs of a tensor-parallel runner (`docs/semantics.md` §4d, `docs/runner.md`):
//! requests with every sampling parameter of §4c on, arriving over time, decoded
//! speculatively (the n-gram proposer under GREEDY, TARGET_MATCH and TOPP; a draft model's
//! drafts and compact draft rows under REJECTION) with log-probabilities and a token bitmask,
//! once by a decoder of one device over whole rows and once by a sharded decoder on each rank
//! over its slice of them. Every rank must emit the unsharded tokens (and finish reasons, and
//! log-probability ids and ranks; values within the tolerance of `accept_logprobs`).

use std::sync::Arc;

use specula_backend_api::ops::VocabSlice;
use specula_backend_api::ops::process_logits::mask_words;
use specula_backend_api::{Device, DeviceExt, Strategy};
use specula_sampler::shard::{ExchangeStats, Group};
use specula_sampler::{
    Decoder, FinishReason, NgramConfig, Request, SamplerConfig, SamplingParams, StepScores,
    TokenLogprob,
};

use crate::compare::{Class, logprob_tolerance};
use crate::{ConformanceError, Result};

/// One decoder run: a strategy over a vocabulary, its requests drawn from a seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// The strategy.
    pub strategy: Strategy,
    /// `V`.
    pub vocab: usize,
    /// The seed of the requests and of the model.
    pub seed: u64,
}

impl Scenario {
    /// The scenarios of the check: every strategy, at two vocabularies.
    pub fn all() -> Vec<Scenario> {
        let mut out = Vec::new();
        for (i, strategy) in [
            Strategy::TargetMatch,
            Strategy::Greedy,
            Strategy::TopP,
            Strategy::Rejection,
        ]
        .into_iter()
        .enumerate()
        {
            for vocab in [97, 1031] {
                out.push(Scenario {
                    strategy,
                    vocab,
                    seed: 11 + i as u64 * 7 + vocab as u64,
                });
            }
        }
        out
    }

    /// A short name.
    pub fn name(&self) -> String {
        format!("{}_v{}", self.strategy.name(), self.vocab)
    }

    fn config(&self) -> SamplerConfig {
        let base = match self.strategy {
            Strategy::Rejection => SamplerConfig::rejection(3, self.vocab, 96, vec![0], 4),
            _ => SamplerConfig::new(self.strategy, 3, self.vocab, 96, vec![0])
                .with_ngram(4, NgramConfig::default()),
        };
        SamplerConfig {
            logprobs: Some(4),
            candidates: 12,
            ..base
        }
    }
}

/// What a run emitted, per request (in the order of [`requests`]).
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The generated tokens.
    pub tokens: Vec<Vec<i32>>,
    /// Why each request stopped.
    pub finished: Vec<Option<FinishReason>>,
    /// The log-probabilities of the requests that asked for them.
    pub logprobs: Vec<Vec<TokenLogprob>>,
    /// Steps run.
    pub steps: u64,
    /// Drafts proposed over the run.
    pub drafts_proposed: u64,
    /// Drafts accepted over the run.
    pub drafts_accepted: u64,
    /// What the rank exchanged (sharded runs).
    pub exchanged: ExchangeStats,
}

/// splitmix64.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The toy model: next-token logits as a pure function of the prefix. A favoured successor
/// of the last token (so n-gram drafts are often right), a prefix-dependent rival, ties, and
/// some tokens at −inf.
fn logits(seed: u64, vocab: usize, prefix: &[i32]) -> Vec<f32> {
    let h = prefix.iter().fold(seed, |h, &t| mix(h ^ t as u64));
    let last = prefix.last().copied().unwrap_or(0).rem_euclid(vocab as i32) as usize;
    let mut row: Vec<f32> = (0..vocab)
        .map(|v| {
            let x = mix(h ^ (v as u64).wrapping_mul(0x1234_5677));
            match x % 53 {
                0 => f32::NEG_INFINITY,
                // Ties: a few values shared by many tokens.
                1..=6 => (x % 53) as f32 * 0.25,
                _ => ((x >> 40) as f32 / (1u64 << 24) as f32) * 3.0 - 1.0,
            }
        })
        .collect();
    row[successor(vocab, last as i32) as usize] += 7.0;
    row[(h % vocab as u64) as usize] += ((h >> 40) % 5) as f32;
    row
}

/// The token the toy model favours after `token`: tokens cycle within blocks of 6, so the
/// history repeats and the n-gram proposer finds matches.
fn successor(vocab: usize, token: i32) -> i32 {
    let token = token.rem_euclid(vocab as i32);
    let base = token / 6 * 6;
    let len = (vocab as i32 - base).min(6);
    base + (token - base + 1) % len
}

/// The draft model of REJECTION: the target model with a perturbation.
fn draft_logits(seed: u64, vocab: usize, prefix: &[i32]) -> Vec<f32> {
    let mut row = logits(seed, vocab, prefix);
    let h = prefix
        .iter()
        .fold(seed ^ 0xD4AF7, |h, &t| mix(h ^ t as u64));
    for (v, x) in row.iter_mut().enumerate() {
        *x += (mix(h ^ v as u64) % 1000) as f32 / 700.0;
    }
    row
}

/// The greedy drafts of the draft model after `context`: at most `n`.
fn draft_chain(seed: u64, vocab: usize, context: &[i32], n: usize) -> Vec<i32> {
    let mut prefix = context.to_vec();
    let mut drafts = Vec::new();
    for _ in 0..n {
        let row = draft_logits(seed, vocab, &prefix);
        let best = (0..vocab)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .unwrap_or(0) as i32;
        drafts.push(best);
        prefix.push(best);
    }
    drafts
}

/// The requests of a scenario with the step each arrives at: every parameter of §4c on across
/// them (temperatures 0, 0.7, 1.3; top-k, top-p, min_p, penalties, min_tokens, logit bias, bad
/// words, allowed ids, stop tokens), some asking for log-probabilities.
pub fn requests(scenario: &Scenario) -> Vec<(u64, Request)> {
    let v = scenario.vocab as i32;
    let s = scenario.seed;
    // Prompts that follow the model's favoured chain from a random start, so that the n-gram
    // proposer finds continuations the model often agrees with.
    let prompt = |k: u64, len: usize| -> Vec<i32> {
        let mut t = (mix(s ^ k) % v as u64) as i32;
        (0..len)
            .map(|_| {
                let token = t;
                t = successor(v as usize, t);
                token
            })
            .collect()
    };
    let all = SamplingParams::default()
        .with_temperature(0.7)
        .with_top_p(0.9)
        .with_top_k(40)
        .with_repetition_penalty(1.3)
        .with_frequency_presence(0.4, 0.2)
        .with_min_p(0.05)
        .with_min_tokens(3);
    vec![
        (
            0,
            Request::new(prompt(1, 9))
                .with_params(all.with_seed(s))
                .with_logit_bias(vec![(3, 2.5), (v - 1, -4.0), (v / 2, 1.0)])
                .with_bad_words(vec![vec![5], vec![7, 8], vec![v / 3, v / 3 + 1]])
                .with_max_dec_len(14)
                .with_logprobs(3),
        ),
        (
            0,
            Request::new(prompt(2, 5))
                .with_params(
                    SamplingParams::default()
                        .with_temperature(1.3)
                        .with_top_p(0.95)
                        .with_seed(s + 1)
                        .with_min_p(0.02),
                )
                .with_allowed_token_ids((0..v).filter(|t| t % 5 != 2).collect())
                .with_stop_tokens(vec![v - 2])
                .with_max_dec_len(12),
        ),
        (
            1,
            Request::new(prompt(3, 12))
                .with_params(SamplingParams::greedy().with_repetition_penalty(1.5))
                .with_max_dec_len(10)
                .with_logprobs(4),
        ),
        (
            2,
            Request::new(prompt(4, 7))
                .with_params(
                    SamplingParams::default()
                        .with_top_k(1500)
                        .with_top_p(0.8)
                        .with_seed(s + 3)
                        .with_frequency_presence(0.8, 0.0)
                        .with_min_tokens(5),
                )
                .with_logit_bias(vec![(1, 3.0)])
                .with_max_dec_len(11),
        ),
        (
            4,
            Request::new(prompt(5, 4))
                .with_params(all.with_seed(s + 4).with_top_k(0).with_temperature(1.0))
                .with_bad_words(vec![vec![2]])
                .with_max_dec_len(9)
                .with_logprobs(1),
        ),
    ]
}

/// The runner's bitmask of a step (`[rows, ceil(V/32)]`, the same on every rank): each row bans
/// a few tokens that depend on the step and the row.
fn bitmask(step: u64, rows: usize, vocab: usize) -> Vec<u32> {
    let words = mask_words(vocab);
    let mut mask = vec![u32::MAX; rows * words];
    for r in 0..rows {
        for k in 0..3u64 {
            let v = (mix(step * 31 + r as u64 * 7 + k) % vocab as u64) as usize;
            mask[r * words + v / 32] &= !(1 << (v % 32));
        }
    }
    mask
}

/// The ids `slice` of each row of `rows` (`[n, vocab]`).
fn cut(rows: &[f32], vocab: usize, slice: VocabSlice) -> Vec<f32> {
    rows.chunks(vocab)
        .flat_map(|row| row[slice.first..slice.end()].to_vec())
        .collect()
}

/// Runs `scenario` on `device`: over whole rows, or with `sharding` as one rank of a
/// tensor-parallel decoder holding its slice of every row.
pub fn run(
    scenario: &Scenario,
    device: Arc<dyn Device>,
    sharding: Option<(Group, VocabSlice)>,
) -> Result<Outcome> {
    let config = scenario.config();
    let slice = sharding.as_ref().map(|s| s.1);
    let mut decoder = match sharding {
        None => Decoder::new(device.clone(), config)?,
        Some((group, slice)) => Decoder::new_sharded(device.clone(), config, group, slice)?,
    };
    let requests = requests(scenario);
    let mut outcome = Outcome {
        tokens: vec![Vec::new(); requests.len()],
        finished: vec![None; requests.len()],
        logprobs: vec![Vec::new(); requests.len()],
        ..Outcome::default()
    };
    let mut waiting: Vec<usize> = (0..requests.len()).collect();
    let mut in_slot: Vec<Option<usize>> = vec![None; decoder.config().max_bsz];
    let mut step = 0u64;
    while !waiting.is_empty() || in_slot.iter().any(Option::is_some) {
        // Arrivals, into free slots.
        while let Some(&next) = waiting.first() {
            if requests[next].0 > step || decoder.free_slots() == 0 {
                break;
            }
            let slot = decoder.insert(requests[next].1.clone())?;
            in_slot[slot] = Some(next);
            waiting.remove(0);
        }
        step += 1;
        if !decoder.has_running() {
            continue;
        }
        let output = one_step(scenario, &mut decoder, slice)?;
        outcome.steps += 1;
        if let Some(e) = output.exchanged {
            outcome.exchanged.calls += e.calls;
            outcome.exchanged.bytes += e.bytes;
        }
        for s in &output.slots {
            if let (Some(id), Some(lp)) = (in_slot[s.slot], &s.logprobs) {
                outcome.logprobs[id].extend(lp.iter().cloned());
            }
        }
        // Finished requests leave their slots.
        for (slot, entry) in in_slot.iter_mut().enumerate() {
            if let Some(id) = *entry
                && !decoder.is_running(slot)
            {
                let removed = decoder.remove(slot)?;
                outcome.tokens[id] = removed.generated;
                outcome.finished[id] = removed.finished;
                *entry = None;
            }
        }
        if step > 400 {
            return Err(ConformanceError::Format(format!(
                "{}: no end after 400 steps",
                scenario.name()
            )));
        }
    }
    outcome.drafts_proposed = decoder.stats().drafts_proposed;
    outcome.drafts_accepted = decoder.stats().drafts_accepted;
    Ok(outcome)
}

/// One step: the drafts of REJECTION's draft model, the plan, the rows of the toy model (cut to
/// the rank's slice), the bitmask, and `finish`.
fn one_step(
    scenario: &Scenario,
    decoder: &mut Decoder,
    slice: Option<VocabSlice>,
) -> Result<specula_sampler::StepOutput> {
    let (vocab, seed) = (scenario.vocab, scenario.seed);
    let ids = slice.unwrap_or(VocabSlice::whole(vocab));
    let device = decoder.device().clone();
    let rejection = scenario.strategy == Strategy::Rejection;
    if rejection {
        decoder.propose()?;
        let per_slot = decoder.config().max_step_tokens - 1;
        for slot in decoder.decode_slots() {
            let context = decoder.context(slot).unwrap_or_default().to_vec();
            decoder.set_drafts(slot, &draft_chain(seed, vocab, &context, per_slot))?;
        }
    }
    let plan = decoder.plan()?;
    let mut rows = Vec::with_capacity(plan.t_out() * vocab);
    for row in 0..plan.t_out() {
        rows.extend(logits(seed, vocab, &decoder.row_prefix(row)?));
    }
    let target = device.upload(&cut(&rows, vocab, ids))?;
    let mask = device.upload(&bitmask(plan.step, plan.t_out(), vocab))?;
    let scores = StepScores::logits(&target).with_bitmask(&mask);
    if !rejection || plan.drafts() == 0 {
        return Ok(decoder.finish(scores)?);
    }
    // The draft model's rows, one per draft: the plan's drafts in slot order.
    let mut draft_rows = Vec::new();
    for p in &plan.slots {
        let context = decoder.context(p.slot).unwrap_or_default().to_vec();
        let drafts = &plan.input_tokens[p.inputs.start + 1..p.inputs.start + 1 + p.drafts];
        for i in 0..p.drafts {
            let mut prefix = context.clone();
            prefix.extend_from_slice(&drafts[..i]);
            draft_rows.extend(draft_logits(seed, vocab, &prefix));
        }
    }
    let draft = device.upload(&cut(&draft_rows, vocab, ids))?;
    Ok(decoder.finish(scores.with_draft_rows(&draft))?)
}

/// The first difference between a rank's outcome and the unsharded one: tokens, finish reasons
/// and log-probability ids and ranks exactly, their values within `accept_logprobs`' tolerance.
pub fn compare(
    scenario: &Scenario,
    got: &Outcome,
    want: &Outcome,
) -> std::result::Result<(), String> {
    for (i, (g, w)) in got.tokens.iter().zip(&want.tokens).enumerate() {
        if g != w {
            return Err(format!("request {i}: tokens {g:?}, unsharded {w:?}"));
        }
    }
    if got.finished != want.finished {
        return Err(format!(
            "finish reasons {:?}, unsharded {:?}",
            got.finished, want.finished
        ));
    }
    let Class::Float { abs, rel } = logprob_tolerance(scenario.vocab) else {
        return Err("logprob tolerance is not a float class".into());
    };
    let close = |a: f32, b: f32| {
        a == b
            || (f64::from(a) - f64::from(b)).abs() <= abs.max(rel * f64::from(a.abs().max(b.abs())))
    };
    for (i, (g, w)) in got.logprobs.iter().zip(&want.logprobs).enumerate() {
        if g.len() != w.len() {
            return Err(format!(
                "request {i}: {} log-probabilities, unsharded {}",
                g.len(),
                w.len()
            ));
        }
        for (k, (a, b)) in g.iter().zip(w).enumerate() {
            let ids = |t: &TokenLogprob| t.top.iter().map(|p| p.0).collect::<Vec<_>>();
            let same = a.token == b.token
                && a.rank == b.rank
                && ids(a) == ids(b)
                && close(a.logprob, b.logprob)
                && a.top.iter().zip(&b.top).all(|(x, y)| close(x.1, y.1));
            if !same {
                return Err(format!("request {i}, token {k}: {a:?}, unsharded {b:?}"));
            }
        }
    }
    Ok(())
}
