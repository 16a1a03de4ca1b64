//! A toy target model and a driver loop shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use specula_backend_api::{Buffer, Device, DeviceExt};
pub use specula_sampler::arrivals::Arrival;
use specula_sampler::arrivals::serve;
use specula_sampler::{
    DecodeStats, Decoder, FinishReason, Request, SamplerConfig, SamplerError, SamplingParams,
    StepError, StepOutput, StepPlan, StepScores, registry,
};

/// The toy model's vocabulary in every test.
pub const VOCAB: usize = 61;

/// The CPU device, through the registry as a runner opens it.
pub fn device() -> Arc<dyn Device> {
    registry::open("cpu").expect("cpu device")
}

/// splitmix64: a small deterministic generator for test cases and the toy model.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `lo ..= hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.range(0, items.len() - 1)]
    }
}

pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A toy target model: the next-token logits are a pure function of the prefix. The "hidden
/// state" of a position is `[hash low 24 bits, hash high 24 bits, last token]` (exact in f32), and
/// the LM head maps it to logits. Most of the mass goes to a deterministic successor of the last
/// token (so n-gram drafts are often right); a prefix-dependent rival token sometimes wins (so they
/// are often wrong too).
#[derive(Clone, Copy, Debug)]
pub struct ToyModel {
    pub vocab: usize,
}

pub const HIDDEN: usize = 3;

impl ToyModel {
    /// The favoured next token: tokens cycle within blocks of 6 (short cycles, so the generated
    /// history repeats and n-gram lookups find matches).
    pub fn successor(&self, token: i32) -> i32 {
        let token = token.rem_euclid(self.vocab as i32);
        let base = token / 6 * 6;
        let len = (self.vocab as i32 - base).min(6);
        base + (token - base + 1) % len
    }

    pub fn hidden(&self, prefix: &[i32]) -> [f32; HIDDEN] {
        let mut h: u64 = 0xCBF2_9CE4_8422_2325;
        for &t in prefix {
            h = mix(h ^ t as u64);
        }
        let h = h & 0xFFFF_FFFF_FFFF;
        let last = *prefix.last().expect("non-empty prefix");
        [(h & 0xFF_FFFF) as f32, (h >> 24) as f32, last as f32]
    }

    pub fn lm_head(&self, hidden: &[f32]) -> Vec<f32> {
        let h = hidden[0] as u64 | ((hidden[1] as u64) << 24);
        let last = hidden[2] as i32;
        let mut logits: Vec<f32> = (0..self.vocab)
            .map(|v| {
                (mix(h ^ (v as u64).wrapping_mul(0x1234_5677)) >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect();
        let favoured = self.successor(last) as usize;
        logits[favoured] += 5.0;
        let rival = (mix(h.wrapping_add(1)) % self.vocab as u64) as usize;
        logits[rival] += (mix(h.wrapping_add(2)) >> 40) as f32 / (1u64 << 24) as f32 * 6.5;
        logits
    }

    pub fn logits(&self, prefix: &[i32]) -> Vec<f32> {
        self.lm_head(&self.hidden(prefix))
    }

    pub fn softmax(&self, logits: &[f32], temperature: f32) -> Vec<f32> {
        if temperature == 0.0 {
            let best = argmax(logits);
            return (0..logits.len())
                .map(|v| if v == best { 1.0 } else { 0.0 })
                .collect();
        }
        let m = logits
            .iter()
            .fold(f32::NEG_INFINITY, |a, &b| a.max(b / temperature));
        let e: Vec<f32> = logits
            .iter()
            .map(|&x| (x / temperature - m).exp())
            .collect();
        let sum: f32 = e.iter().sum();
        e.iter().map(|x| x / sum).collect()
    }
}

pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// How the runner hands its scores back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// Per row from `row_prefix`, exactly `T_out` rows of logits.
    Prefix,
    /// Hidden states per packed token, `gather_next_token`, LM head on all `gather_rows` rows.
    Gather,
    /// Host-side probabilities (temperature applied by the runner), `T_out` rows.
    Probs,
}

/// The `Prefix` forward pass on the host: the logits of each output row from `row_prefix`,
/// exactly `T_out` rows.
pub fn prefix_rows(
    decoder: &Decoder,
    plan: &StepPlan,
    model: &ToyModel,
) -> Result<Vec<f32>, SamplerError> {
    let mut rows = Vec::with_capacity(plan.t_out() * model.vocab);
    for t in 0..plan.t_out() {
        rows.extend(model.logits(&decoder.row_prefix(t)?));
    }
    Ok(rows)
}

/// The runner's forward pass for one plan.
pub fn forward(
    device: &dyn Device,
    decoder: &Decoder,
    plan: &StepPlan,
    model: &ToyModel,
    mode: Forward,
) -> Result<Buffer, SamplerError> {
    let v = model.vocab;
    match mode {
        Forward::Prefix => Ok(device.upload(&prefix_rows(decoder, plan, model)?)?),
        Forward::Probs => {
            let mut rows = Vec::with_capacity(plan.t_out() * v);
            for (t, row) in plan.output_rows.iter().enumerate() {
                let temperature = decoder.request(row.slot).expect("occupied").temperature;
                rows.extend(model.softmax(&model.logits(&decoder.row_prefix(t)?), temperature));
            }
            Ok(device.upload(&rows)?)
        }
        Forward::Gather => {
            let mut hidden = Vec::with_capacity(plan.token_num() * HIDDEN);
            for j in 0..plan.token_num() {
                hidden.extend(model.hidden(&decoder.input_prefix(j)?));
            }
            let hidden = device.upload(&hidden)?;
            let mut gathered = device.alloc::<f32>(plan.gather_rows * HIDDEN)?;
            decoder.gather_next_token(&hidden, HIDDEN, &mut gathered)?;
            let gathered: Vec<f32> = device.download(&gathered)?;
            let mut rows = Vec::with_capacity(plan.gather_rows * v);
            for t in 0..plan.gather_rows {
                let h = &gathered[t * HIDDEN..(t + 1) * HIDDEN];
                if t < plan.t_out() {
                    // The device's gather must agree with the host plan.
                    assert_eq!(h, model.hidden(&decoder.row_prefix(t)?), "gathered row {t}");
                } else {
                    assert!(h.iter().all(|&x| x == 0.0), "padding row {t} not zero");
                }
                rows.extend(model.lm_head(h));
            }
            Ok(device.upload(&rows)?)
        }
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct RunResult {
    /// Generated tokens per arrival, in arrival order.
    pub tokens: Vec<Vec<i32>>,
    pub finished: Vec<Option<FinishReason>>,
    pub stats: DecodeStats,
}

/// A runner's token bitmask for structured output: the mask row (`ceil(V / 32)` words) of an
/// output row whose context is the given prefix.
pub type BitmaskFn = fn(&[i32], usize) -> Vec<u32>;

/// A runner's own drafts for a decode slot, from its context.
pub type DraftFn = fn(&[i32]) -> Vec<i32>;

/// What a runner adds to the scores: a token bitmask, its own drafts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras {
    pub bitmask: Option<BitmaskFn>,
    pub drafts: Option<DraftFn>,
    /// `Prefix` mode: hand the host logits over with `borrow_host` (no copy on a host-memory
    /// device) instead of uploading them.
    pub borrow_host: bool,
}

/// Runs arrivals through a decoder: a request is inserted at its arrival step (or as soon as a
/// slot is free, or at once when nothing runs), finished requests are removed after each step.
pub fn run(
    device: &Arc<dyn Device>,
    config: &SamplerConfig,
    model: &ToyModel,
    arrivals: &[Arrival],
    mode: Forward,
) -> RunResult {
    run_with(device, config, model, arrivals, mode, Extras::default())
}

/// [`run`], with the runner's `extras`: a token bitmask for every score row (`T_out` rows:
/// `Prefix` and `Probs` modes), drafts set for every running decode slot (`S − 1` at most).
pub fn run_with(
    device: &Arc<dyn Device>,
    config: &SamplerConfig,
    model: &ToyModel,
    arrivals: &[Arrival],
    mode: Forward,
    extras: Extras,
) -> RunResult {
    let mut decoder = Decoder::new(device.clone(), config.clone()).expect("decoder");
    let served = serve(&mut decoder, arrivals, |decoder| {
        step(device, decoder, model, mode, extras).map_err(StepError::<SamplerError>::Sampler)
    })
    .expect("serve");
    RunResult {
        tokens: served.generated,
        finished: served.finished,
        stats: decoder.stats(),
    }
}

/// One step of [`run_with`]: the runner's drafts, the forward pass in `mode`, the bitmask.
fn step(
    device: &Arc<dyn Device>,
    decoder: &mut Decoder,
    model: &ToyModel,
    mode: Forward,
    extras: Extras,
) -> Result<Option<StepOutput>, SamplerError> {
    if let Some(drafts) = extras.drafts {
        set_runner_drafts(decoder, drafts)?;
    }
    let plan = decoder.plan()?;
    if plan.is_empty() {
        return Ok(None);
    }
    let (host_rows, lent, uploaded);
    let scores: &Buffer = if extras.borrow_host {
        assert!(
            matches!(mode, Forward::Prefix),
            "borrow_host needs Prefix mode"
        );
        host_rows = prefix_rows(decoder, &plan, model)?;
        lent = device.borrow_host(&host_rows)?;
        assert_eq!(
            lent.is_lent(),
            device.host_memory(),
            "copied only off the host"
        );
        &lent
    } else {
        uploaded = forward(device.as_ref(), decoder, &plan, model, mode)?;
        &uploaded
    };
    let mask = match extras.bitmask {
        Some(f) => Some(bitmask_rows(device.as_ref(), decoder, &plan, model, f)?),
        None => None,
    };
    let step_scores = match mode {
        Forward::Probs => StepScores::probs(scores),
        _ => StepScores::logits(scores),
    };
    let step_scores = match &mask {
        Some(mask) => step_scores.with_bitmask(mask),
        None => step_scores,
    };
    Ok(Some(decoder.finish(step_scores)?))
}

/// Sets the runner's drafts (`S − 1` at most) for every running decode slot.
fn set_runner_drafts(decoder: &mut Decoder, drafts: DraftFn) -> Result<(), SamplerError> {
    let most = decoder.config().max_step_tokens - 1;
    decoder.propose()?;
    for slot in decoder.occupied_slots() {
        let decoding = decoder.generated(slot).is_some_and(|g| !g.is_empty());
        if decoder.is_running(slot) && decoding {
            let context = decoder.context(slot).expect("occupied").to_vec();
            let mut d = drafts(&context);
            d.truncate(most);
            decoder.set_drafts(slot, &d)?;
        }
    }
    Ok(())
}

/// The runner's token bitmask for every output row of `plan`, on the device.
fn bitmask_rows(
    device: &dyn Device,
    decoder: &Decoder,
    plan: &StepPlan,
    model: &ToyModel,
    bitmask: BitmaskFn,
) -> Result<Buffer, SamplerError> {
    let mut rows = Vec::new();
    for t in 0..plan.t_out() {
        rows.extend(bitmask(&decoder.row_prefix(t)?, model.vocab));
    }
    Ok(device.upload(&rows)?)
}

/// A prompt that follows the model's favoured chain with a few random tokens mixed in, so n-gram
/// lookups into the prompt find matches from the first decode step.
pub fn prompt(rng: &mut Rng, model: &ToyModel, len: usize) -> Vec<i32> {
    let mut prompt = vec![rng.range(1, model.vocab - 1) as i32];
    while prompt.len() < len {
        let last = *prompt.last().expect("non-empty");
        let next = if rng.range(0, 4) == 0 {
            rng.range(1, model.vocab - 1) as i32
        } else {
            model.successor(last)
        };
        prompt.push(next);
    }
    prompt
}

/// A random request with varied sampling parameters.
pub fn request(rng: &mut Rng, model: &ToyModel, max_prompt: usize) -> Request {
    let len = rng.range(1, max_prompt);
    let temperature = rng.pick(&[0.0f32, 0.4, 0.8, 1.0, 1.5]);
    let top_k = rng.pick(&[0usize, 0, 1, 3, 10, 1000]);
    let top_p = rng.pick(&[1.0f32, 1.0, 0.95, 0.7, 0.3]);
    let max_dec_len = rng.range(1, 60);
    let seed = match rng.range(0, 5) {
        0 => u64::MAX - rng.range(0, 3) as u64,
        1 => (1u64 << 63) - 2 - rng.range(0, 12) as u64,
        _ => rng.next_u64(),
    };
    Request::new(prompt(rng, model, len))
        .with_params(
            SamplingParams::default()
                .with_seed(seed)
                .with_top_p(top_p)
                .with_top_k(top_k)
                .with_temperature(temperature),
        )
        .with_max_dec_len(max_dec_len)
}

/// Plans `decoder`'s next step and enqueues it with the toy model's logits of each row's prefix.
pub fn enqueue_next(
    device: &Arc<dyn Device>,
    decoder: &mut Decoder,
) -> specula_sampler::PendingStep {
    let model = ToyModel { vocab: VOCAB };
    let plan = decoder.plan().expect("plan");
    let logits =
        forward(device.as_ref(), decoder, &plan, &model, Forward::Prefix).expect("forward");
    decoder
        .enqueue(StepScores::logits(&logits))
        .expect("enqueue")
}

/// Finishes every remaining step of `decoder` with the toy model's logits and returns the tokens
/// of slots `0 .. slots`.
pub fn decode_to_the_end(
    device: &Arc<dyn Device>,
    decoder: &mut Decoder,
    slots: usize,
) -> Vec<Vec<i32>> {
    let model = ToyModel { vocab: VOCAB };
    while decoder.has_running() {
        let plan = decoder.plan().expect("plan");
        let logits =
            forward(device.as_ref(), decoder, &plan, &model, Forward::Prefix).expect("forward");
        decoder.finish(StepScores::logits(&logits)).expect("finish");
    }
    (0..slots)
        .map(|slot| decoder.generated(slot).expect("a request").to_vec())
        .collect()
}
