//! The runner's benchmark: tokens/s of plain decoding vs n-gram speculative decoding, greedy, at
//! batch 1 and batch 8, on prompts that ask the model to repeat a passage (drafts from the prompt
//! get accepted) and on ordinary chat prompts; the acceptance rate; and the shares of the run
//! spent in the forward pass and in Specula. Tokens/s are given as llama.cpp and vLLM users read
//! them: for decoding (the run without the prompts' forward pass, and without the first token each
//! prompt pass yields: llama.cpp's "eval" rate), with the prompt pass timed on its own (its
//! "prompt eval") and the whole run beside them. Plain and speculative runs alternate, `--repeats`
//! times each, in one process; the round shown is the one with the median decoding speed-up, and
//! every ratio compares runs of the same round. The speculative tokens are checked against the
//! plain tokens. Speculation feeds each request an adaptive number of drafts
//! (`--draft-policy adaptive`, the engine's default) or every draft (`fixed`).
//!
//! First, the forward pass alone: one step of 1 token and one of 5 tokens (after a 32-token
//! prompt), with candle's `QMatMul` for every weight and with the runner's Q4_1 matmul
//! (`qmatmul`), alternating, `--forward-repeats` times each; the median milliseconds, and a check
//! that both give the same logits bit for bit. The machine's load average is printed with each
//! table (`/proc/loadavg`).
//!
//! ```text
//! cargo run --release -p specula-runner-candle --example bench -- [--backend cpu] [--tokens 64] [--repeats 3] [--draft 5] [--draft-policy adaptive]
//! ```
//!
//! Prints Markdown tables (the ones in `docs/performance.md`). A benchmark, not a test: it
//! asserts nothing about speed; it exits non-zero only if speculative tokens differ from plain.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;
use specula_runner_candle::draft_length::DraftPolicy;
use specula_runner_candle::engine::{Engine, RunOutput};
use specula_runner_candle::model::read_gguf;
use specula_runner_candle::qmatmul::MatmulKernel;
use specula_runner_candle::{Llama, LlamaConfig, Model, fetch};
use specula_sampler::{NgramConfig, Request, SamplerConfig, SamplingParams, Strategy, registry};

#[derive(Debug, Parser)]
struct Args {
    /// The GGUF model [default: the cached SmolLM2-135M, fetched if needed].
    #[arg(long)]
    model: Option<PathBuf>,
    /// The Specula backend.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Most tokens generated per request.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Rounds of (plain, speculative) per workload.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Most drafts per step.
    #[arg(long, default_value_t = 5)]
    draft: usize,
    /// Timed forward passes per (step size, matmul) [0: skip the forward table].
    #[arg(long, default_value_t = 7)]
    forward_repeats: usize,
    /// Only the forward table.
    #[arg(long)]
    forward_only: bool,
    /// How many of the proposer's drafts a request feeds.
    #[arg(long, value_enum, default_value_t = DraftPolicy::Adaptive)]
    draft_policy: DraftPolicy,
}

/// Passages the model is asked to repeat (greedy decoding copies them).
const PASSAGES: [&str; 8] = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "A journey of a thousand miles begins with a single step forward.",
    "The library opens at nine in the morning and closes at six.",
    "Water boils at one hundred degrees Celsius at sea level pressure.",
    "Our team meets every Monday to plan the work of the coming week.",
    "The old lighthouse still guides the fishing boats home at night.",
    "Please remember to save your work before you close the program.",
    "The train to the city leaves from platform four every hour.",
];

/// Ordinary chat prompts.
const QUESTIONS: [&str; 8] = [
    "What is the tallest mountain in the world?",
    "Write a short poem about autumn leaves.",
    "Explain what a compiler does in two sentences.",
    "Give me three tips for learning a new language.",
    "Why is the sky blue?",
    "Describe a cat to someone who has never seen one.",
    "What should I pack for a weekend trip to the mountains?",
    "Summarize the plot of a fairy tale you like.",
];

fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    let path = match &args.model {
        Some(path) => path.clone(),
        None => fetch::ensure_default_model()?,
    };
    if args.forward_repeats > 0 {
        time_forwards(&path, args.forward_repeats)?;
    }
    if args.forward_only {
        return Ok(());
    }
    let model = Model::load(&path)?;
    eprintln!("{}", load_average());
    let device = registry::open(&args.backend)?;
    let policy = args.draft_policy;
    eprintln!(
        "model {}, Specula on {} ({}), draft policy {policy:?}",
        path.display(),
        args.backend,
        device.info().name
    );
    println!(
        "| workload | batch | tokens | decoding tok/s: plain / n-gram | speed-up | prompt pass s: plain / n-gram | whole run tok/s: plain / n-gram | speed-up | accepted (of drafts fed) | Specula share: plain / n-gram | same tokens |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all_same = true;
    for (workload, texts) in [
        (
            "repeat a passage",
            PASSAGES.map(|p| format!("Repeat exactly: {p} {p}")),
        ),
        ("chat", QUESTIONS.map(String::from)),
    ] {
        for batch in [1, 8] {
            let requests = texts[..batch]
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    Ok(Request::new(model.prompt(text, true)?)
                        .with_params(SamplingParams::greedy().with_seed(i as u64))
                        .with_max_dec_len(args.tokens))
                })
                .collect::<Result<Vec<_>, Box<dyn Error>>>()?;
            let plain = SamplerConfig::plain(
                Strategy::TargetMatch,
                batch,
                model.vocab(),
                1024,
                model.end_tokens(),
            );
            let ngram = plain
                .clone()
                .with_ngram(args.draft + 1, NgramConfig::default());
            let mut rounds: Vec<(RunOutput, RunOutput)> = Vec::new();
            for _ in 0..args.repeats.max(1) {
                let run = |config: &SamplerConfig| -> Result<RunOutput, Box<dyn Error>> {
                    let mut engine = Engine::new(&model.llama, device.clone(), config.clone())?
                        .with_draft_policy(policy);
                    Ok(engine.run(requests.clone(), |_| {})?)
                };
                let p = run(&plain)?;
                let s = run(&ngram)?;
                rounds.push((p, s));
            }
            let same = rounds.iter().all(|(p, s)| p.generated == s.generated);
            all_same &= same;
            // The round with the median decoding speed-up.
            rounds.sort_by(|a, b| decode_speedup(a).total_cmp(&decode_speedup(b)));
            let (p, s) = &rounds[rounds.len() / 2];
            println!(
                "| {workload} | {batch} | {} | {:.1} / {:.1} | **{:.2}×** | {:.2} / {:.2} | {:.1} / {:.1} | {:.2}× | {:.0}% | {:.2}% / {:.2}% | {} |",
                p.stats.tokens,
                p.stats.decode_tokens_per_second(),
                s.stats.decode_tokens_per_second(),
                decode_speedup(&(p.clone(), s.clone())),
                p.stats.prefill.as_secs_f64(),
                s.stats.prefill.as_secs_f64(),
                p.stats.tokens_per_second(),
                s.stats.tokens_per_second(),
                speedup(&(p.clone(), s.clone())),
                100.0 * s.stats.acceptance_rate(),
                100.0 * p.stats.specula_share(),
                100.0 * s.stats.specula_share(),
                if same { "yes" } else { "NO" },
            );
            eprintln!(
                "  {workload}, batch {batch}: plain {} tokens in {} steps; n-gram {} tokens in {} steps ({} of {} drafts accepted); decoding speed-ups {:?}",
                p.stats.tokens,
                p.stats.steps,
                s.stats.tokens,
                s.stats.steps,
                s.stats.drafts_accepted,
                s.stats.drafts_proposed,
                rounds
                    .iter()
                    .map(|r| format!("{:.2}", decode_speedup(r)))
                    .collect::<Vec<_>>(),
            );
        }
    }
    eprintln!("{}", load_average());
    if !all_same {
        return Err("speculative tokens differ from plain tokens".into());
    }
    Ok(())
}

/// The prompt in the KV cache before a timed step.
const PREFIX: usize = 32;

/// Times steps of 1 and 5 tokens, candle's matmul against the runner's, alternating, and prints
/// the medians; fails if their logits differ.
fn time_forwards(path: &Path, repeats: usize) -> Result<(), Box<dyn Error>> {
    let content = read_gguf(path)?;
    let config = LlamaConfig::from_gguf(&content)?;
    let kernels = [MatmulKernel::Candle, MatmulKernel::Runner];
    let models = kernels
        .iter()
        .map(|&kernel| Llama::load_with(path, &content, config.clone(), kernel))
        .collect::<Result<Vec<_>, _>>()?;
    let tokens: Vec<u32> = (0..PREFIX as u32 + 5).map(|i| 100 + 37 * i).collect();
    eprintln!("{}", load_average());
    println!("| step | candle QMatMul ms | runner matmuls ms | speed-up | same logits |");
    println!("|---|---|---|---|---|");
    let mut single = [0f64; 2];
    for n in [1, 5] {
        let step = &tokens[PREFIX..PREFIX + n];
        let rows: Vec<usize> = (0..n).collect();
        let mut caches = Vec::new();
        for llama in &models {
            let mut cache = llama.new_cache();
            llama.forward(&tokens[..PREFIX], &mut cache, &[PREFIX - 1])?;
            caches.push(cache);
        }
        let mut times = [Vec::new(), Vec::new()];
        let mut logits = [Vec::new(), Vec::new()];
        for _ in 0..repeats {
            for (i, (llama, cache)) in models.iter().zip(&mut caches).enumerate() {
                let start = Instant::now();
                logits[i] = llama.forward(step, cache, &rows)?;
                times[i].push(start.elapsed().as_secs_f64() * 1e3);
                cache.truncate(PREFIX);
            }
        }
        let [candle, runner] = times.map(median);
        let same = logits[0].len() == logits[1].len()
            && logits[0]
                .iter()
                .zip(&logits[1])
                .all(|(a, b)| a.to_bits() == b.to_bits());
        if n == 1 {
            single = [candle, runner];
        }
        println!(
            "| {n} token{} | {candle:.1} | {runner:.1} | {:.2}× | {} |",
            if n == 1 { "" } else { "s" },
            candle / runner,
            if same { "yes" } else { "NO" }
        );
        if n > 1 {
            eprintln!(
                "  a step of {n} tokens costs {:.2} single-token steps with candle's matmul, {:.2} with the runner's",
                candle / single[0],
                runner / single[1]
            );
        }
        if !same {
            return Err(format!("the two matmuls' logits differ in a step of {n}").into());
        }
    }
    eprintln!("{}", load_average());
    Ok(())
}

/// The median of some timings.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The machine's load average, as `uptime` gives it.
fn load_average() -> String {
    match std::fs::read_to_string("/proc/loadavg") {
        Ok(line) => format!("load average (1, 5, 15 min): {}", line.trim()),
        Err(_) => "load average: unknown".into(),
    }
}

/// Speculative tokens/s over plain tokens/s over the whole run, in one round.
fn speedup((plain, speculative): &(RunOutput, RunOutput)) -> f64 {
    speculative.stats.tokens_per_second() / plain.stats.tokens_per_second()
}

/// Speculative tokens/s over plain tokens/s of decoding, in one round.
fn decode_speedup((plain, speculative): &(RunOutput, RunOutput)) -> f64 {
    speculative.stats.decode_tokens_per_second() / plain.stats.decode_tokens_per_second()
}
