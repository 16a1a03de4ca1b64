//! A runner's decoding loop with a toy target model.
//!
//! The toy model's next-token logits are a pure function of the prefix (as a real model's are,
//! when its forward pass is batch-invariant). The same requests are decoded twice: speculatively,
//! with the n-gram proposer drafting up to 5 tokens per step, and plainly, one token per step.
//! With TARGET_MATCH (or GREEDY) both must print exactly the same tokens; the speculative run takes
//! fewer steps.
//!
//! Each step hands the runner's host logits over without a copy on the CPU (`borrow_host`; other
//! devices upload them) and overlaps the sampler with the runner: `enqueue` starts the step on the
//! device and its results' one transfer, a stand-in for the runner's next forward pass runs meanwhile, and
//! `collect` waits once for the tokens. The example prints the blocking waits per step, counted by
//! the device, beside the one wait per downloaded buffer that `finish` made before its transfers
//! were batched. One request has its own stop token besides the decoder's end token.
//!
//! ```text
//! cargo run -p specula-sampler --example decode_loop [-- --backend cpu] [--strategy greedy]
//! ```
//!
//! `--backend` takes a registry name (`cpu`, `auto`, `wgpu:1`, ...) or `reference`: the plain
//! reference device, the oracle of the conformance suite.

use std::error::Error;
use std::sync::Arc;

use specula_backend_api::{Device, DeviceExt, Strategy};
use specula_sampler::{
    Decoder, NgramConfig, Request, SamplerConfig, SamplingParams, StepPlan, StepScores, registry,
};

const VOCAB: usize = 96;
const END_TOKEN: i32 = 0;

/// The toy target model: mostly continues a short cycle (tokens cycle within blocks of 8, and the
/// block of the end token 0 ends the request), with a rival token chosen by a hash of the whole
/// prefix that sometimes wins.
fn toy_logits(prefix: &[i32]) -> Vec<f32> {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &t in prefix {
        h = mix(h ^ t as u64);
    }
    let unit = |x: u64| (mix(x) >> 40) as f32 / (1u64 << 24) as f32;
    let mut logits: Vec<f32> = (0..VOCAB as u64).map(|v| unit(h ^ (v << 20))).collect();
    let last = prefix.last().copied().unwrap_or(0);
    logits[successor(last) as usize] += 6.0;
    logits[(h % VOCAB as u64) as usize] += 5.5 * unit(h.wrapping_add(1));
    logits
}

/// The favoured next token.
fn successor(token: i32) -> i32 {
    let token = token.rem_euclid(VOCAB as i32);
    token / 8 * 8 + (token + 1) % 8
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn requests() -> Vec<Request> {
    // Prompts that walk the model's chain, so the n-gram proposer finds matches in them.
    let chain = |start: i32, len: usize| -> Vec<i32> {
        std::iter::successors(Some(start), |&t| Some(successor(t)))
            .take(len)
            .collect()
    };
    vec![
        Request::new(chain(19, 20))
            .with_seed(1)
            .with_max_dec_len(48),
        Request::new(chain(33, 6))
            .with_logprobs(2)
            .with_params(
                SamplingParams::default()
                    .with_seed(2)
                    .with_top_p(0.9)
                    .with_temperature(0.7),
            )
            .with_max_dec_len(40),
        // Its own stop token, on top of the decoder's end token.
        Request::new(chain(42, 12))
            .with_params(SamplingParams::default().with_seed(3).with_top_k(5))
            .with_stop_tokens(vec![47])
            .with_max_dec_len(32),
        Request::new(vec![77, 77, 77, 77])
            .with_params(SamplingParams::greedy().with_seed(4))
            .with_max_dec_len(24),
        Request::new(chain(60, 3))
            .with_params(
                SamplingParams::default()
                    .with_seed(u64::MAX)
                    .with_top_p(0.5)
                    .with_top_k(20)
                    .with_temperature(1.3),
            )
            .with_max_dec_len(36),
    ]
}

struct Run {
    /// Whether every step's logits were the runner's slice itself (no copy).
    lent: bool,
    tokens: Vec<Vec<i32>>,
    steps: u64,
    acceptance: f64,
    drafts: u64,
    waits: Waits,
}

/// Blocking waits per step from `enqueue` to `collect`, counted by the device, and the buffers of
/// each step's one transfer (one blocking download each before the transfers were batched).
#[derive(Default)]
struct Waits {
    waits: Vec<u64>,
    buffers: Vec<usize>,
}

impl Waits {
    fn summary(&self) -> String {
        let range = |v: &[u64]| {
            let (lo, hi) = (v.iter().min(), v.iter().max());
            match (lo, hi) {
                (Some(lo), Some(hi)) if lo == hi => format!("{lo}"),
                (Some(lo), Some(hi)) => format!("{lo} to {hi}"),
                _ => "-".to_owned(),
            }
        };
        let buffers: Vec<u64> = self.buffers.iter().map(|&b| b as u64).collect();
        format!(
            "blocking waits per step {} (one per downloaded buffer before batching: {})",
            range(&self.waits),
            range(&buffers)
        )
    }
}

/// The runner's forward pass: one row of logits per output row of the plan, on the host.
fn forward(decoder: &Decoder, plan: &StepPlan) -> Result<Vec<f32>, Box<dyn Error>> {
    let mut rows = Vec::with_capacity(plan.t_out() * VOCAB);
    for row in 0..plan.t_out() {
        rows.extend(toy_logits(&decoder.row_prefix(row)?));
    }
    Ok(rows)
}

/// A stand-in for the work a runner overlaps with the step's transfer (its next forward pass, a
/// draft model): here it puts the toy model's embedding table on the device.
fn overlapped_work(device: &dyn Device) -> Result<(), Box<dyn Error>> {
    let table: Vec<f32> = (0..VOCAB * 4).map(|i| i as f32).collect();
    device.upload(&table)?;
    Ok(())
}

fn decode(device: &Arc<dyn Device>, config: SamplerConfig) -> Result<Run, Box<dyn Error>> {
    let mut decoder = Decoder::new(device.clone(), config)?;
    let requests = requests();
    let slots = requests
        .into_iter()
        .map(|r| decoder.insert(r))
        .collect::<Result<Vec<_>, _>>()?;
    let mut lent = true;
    let mut waits = Waits::default();
    while decoder.has_running() {
        let plan = decoder.plan()?;
        if plan.is_empty() {
            break;
        }
        let rows = forward(&decoder, &plan)?;
        // Handed over for this call: on the CPU the buffer is `rows` itself (no copy); on a
        // device whose memory is not the host's it is an upload of it.
        let logits = device.borrow_host(&rows)?;
        lent &= logits.is_lent();
        let before = device.memory_stats();
        let pending = decoder.enqueue(StepScores::logits(&logits))?;
        waits.buffers.push(pending.buffers());
        overlapped_work(device.as_ref())?;
        decoder.collect(pending)?;
        waits
            .waits
            .push(device.memory_stats().since(&before).blocking_waits);
    }
    let stats = decoder.stats();
    let tokens = slots
        .into_iter()
        .map(|slot| decoder.remove(slot).map(|r| r.generated))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Run {
        lent,
        tokens,
        steps: stats.steps,
        acceptance: stats.acceptance_rate(),
        drafts: stats.drafts_proposed,
        waits,
    })
}

/// A registry backend, or the reference device.
fn open(backend: &str) -> Result<Arc<dyn Device>, Box<dyn Error>> {
    if backend == "reference" {
        return Ok(Arc::new(specula_reference::ReferenceDevice::new()));
    }
    Ok(registry::open(backend)?)
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut backend = "cpu".to_owned();
    let mut strategy = Strategy::TargetMatch;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--backend" => backend = args.next().ok_or("--backend needs a name")?,
            "--strategy" => strategy = args.next().ok_or("--strategy needs a name")?.parse()?,
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    if !matches!(strategy, Strategy::Greedy | Strategy::TargetMatch) {
        return Err("only the lossless strategies (greedy, target_match) can be compared".into());
    }
    let device = open(&backend)?;
    println!(
        "backend: {} ({}), strategy {strategy}",
        device.info().kind,
        device.info().name
    );

    let mut plain = SamplerConfig::new(strategy, 8, VOCAB, 96, vec![END_TOKEN]);
    plain.logprobs = Some(2);
    let speculative = plain.clone().with_ngram(
        6,
        NgramConfig {
            max_ngram_size: 3,
            min_ngram_size: 1,
            threshold: 128,
        },
    );
    let spec = decode(&device, speculative)?;
    let base = decode(&device, plain)?;

    let mut identical = true;
    for (i, (s, p)) in spec.tokens.iter().zip(&base.tokens).enumerate() {
        let same = s == p;
        identical &= same;
        println!(
            "request {i}: {} tokens {}",
            s.len(),
            if same { "identical" } else { "DIFFER" }
        );
        println!("  speculative: {s:?}");
        if !same {
            println!("  plain:       {p:?}");
        }
    }
    println!(
        "speculative: {} steps, {} drafts proposed, acceptance rate {:.1}%",
        spec.steps,
        spec.drafts,
        100.0 * spec.acceptance
    );
    println!("plain:       {} steps", base.steps);
    println!(
        "logits handed over {}",
        if spec.lent && base.lent {
            "without a copy (borrow_host lent the host rows)"
        } else {
            "by an upload (borrow_host copies to this device)"
        }
    );
    println!("speculative: {}", spec.waits.summary());
    println!("plain:       {}", base.waits.summary());
    if !identical {
        return Err("speculative and plain decoding emitted different tokens".into());
    }
    println!("speculative and plain decoding emitted the same tokens");
    Ok(())
}
