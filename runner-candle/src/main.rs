//! `specula-generate`: text generation with SmolLM2-135M (or another llama GGUF file) through
//! candle and Specula, plain or speculative, on any Specula backend.
//!
//! ```text
//! specula-generate --prompt "The capital of France is" -n 16 --temp 0
//! specula-generate --chat --prompt "Repeat exactly: ..." --spec ngram --draft 5 --backend wgpu
//! specula-generate --prompts-file prompts.txt --spec ngram
//! ```
//!
//! With one prompt the text is streamed as it is generated; with several (`--prompts-file`, one
//! prompt per line, `\n` in a line for a newline), up to 8 run at once (continuous batching) and
//! each is printed whole when it finishes. The last three lines (on stderr) are the summary, split
//! as llama.cpp's timings are: the prompt pass (tokens, seconds, tokens/s), decoding (the tokens
//! after each prompt's first, their seconds and tokens/s, the steps, the acceptance rate of
//! drafts), and the whole run (tokens/s, and the shares spent in the forward pass and in
//! Specula). Every error is one line on stderr and a non-zero exit.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use specula_runner_candle::draft_length::DraftPolicy;
use specula_runner_candle::engine::{Engine, KvForward, RunStats, TokenEvent};
use specula_runner_candle::{Model, RunnerError, TextStream, fetch};
use specula_sampler::{
    NgramConfig, Request, SamplerConfig, SamplerError, SamplingParams, Strategy, registry,
};

/// Most requests decoded at once.
const MAX_BATCH: usize = 8;

/// Text generation with a GGUF llama model through candle, sampled by Specula.
#[derive(Debug, Parser)]
#[command(name = "specula-generate", version)]
struct Cli {
    /// The GGUF model file [default: SmolLM2-135M-Instruct Q4_1 in $SPECULA_MODEL_DIR or
    /// ~/.cache/specula, fetched on first use]
    #[arg(long, short = 'm')]
    model: Option<PathBuf>,
    /// The prompt.
    #[arg(long, short = 'p', conflicts_with = "prompts_file")]
    prompt: Option<String>,
    /// A file of prompts, one per line (`\n` in a line stands for a newline; empty lines are skipped).
    #[arg(long)]
    prompts_file: Option<PathBuf>,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Most tokens generated per prompt.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Temperature (0: greedy).
    #[arg(long, default_value_t = 0.8, allow_hyphen_values = true)]
    temp: f32,
    /// Top-k (0: off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (1: off).
    #[arg(long, default_value_t = 0.95, allow_hyphen_values = true)]
    top_p: f32,
    /// Min-p (0: off).
    #[arg(long, default_value_t = 0.05, allow_hyphen_values = true)]
    min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true)]
    repeat_penalty: f32,
    /// Presence penalty (0: off).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    presence_penalty: f32,
    /// Frequency penalty (0: off).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    frequency_penalty: f32,
    /// Add VALUE to token ID's logit (repeatable); `ID=-inf` bans the token.
    #[arg(long, value_name = "ID=VALUE", value_parser = parse_bias, allow_hyphen_values = true)]
    logit_bias: Vec<(i32, f32)>,
    /// Seed of the sampler (prompt i uses SEED + i) [default: from the clock, printed].
    #[arg(long, short = 's')]
    seed: Option<u64>,
    /// The Specula backend that samples.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
    /// Speculative decoding: none, or drafts from the n-gram proposer (prompt lookup).
    #[arg(long, value_enum, default_value_t = Spec::None)]
    spec: Spec,
    /// Most drafts per step with --spec ngram (the step feeds 1 + N tokens).
    #[arg(long, default_value_t = 5)]
    draft: usize,
    /// How many of the proposer's drafts a request feeds: `adaptive` learns a length per request
    /// (halved after a step that rejected every draft, doubled after one that accepted them all,
    /// at most --draft), `fixed` feeds every draft up to --draft. The tokens are the same.
    #[arg(long, value_enum, default_value_t = DraftPolicy::Adaptive)]
    draft_policy: DraftPolicy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    Cpu,
    Wgpu,
    XpuSim,
    Cuda,
    Auto,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Wgpu => "wgpu",
            Backend::XpuSim => "xpu-sim",
            Backend::Cuda => "cuda",
            Backend::Auto => "auto",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Spec {
    None,
    Ngram,
}

/// `ID=VALUE`; `VALUE` may be `-inf` (a ban).
fn parse_bias(arg: &str) -> Result<(i32, f32), String> {
    let (id, value) = arg
        .split_once('=')
        .ok_or_else(|| format!("{arg:?} is not ID=VALUE"))?;
    let id = id
        .trim()
        .parse::<i32>()
        .map_err(|e| format!("token id {id:?}: {e}"))?;
    let value = value
        .trim()
        .parse::<f32>()
        .map_err(|e| format!("value {value:?}: {e}"))?;
    if value.is_nan() || value == f32::INFINITY {
        return Err(format!("value {value} (only finite values and -inf)"));
    }
    Ok((id, value))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{}", one_line(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// A message on one line: its lines joined, clap's "For more information" hint left out.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("For more information") && !l.starts_with("Usage:")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn run(cli: Cli) -> Result<(), RunnerError> {
    let texts = prompts(&cli)?;
    let model_path = match &cli.model {
        Some(path) => path.clone(),
        None => fetch::ensure_default_model()?,
    };
    let load = Instant::now();
    let model = Model::load(&model_path)?;
    let load = load.elapsed();
    let seed = cli.seed.unwrap_or_else(clock_seed);
    let requests = requests(&cli, &model, &texts, seed)?;
    let device = registry::open(cli.backend.name())?;
    let config = sampler_config(&cli, &model, requests.len())?;
    let mut engine = Engine::new(&model.llama, device, config)?.with_draft_policy(cli.draft_policy);
    eprintln!(
        "{}: {} layers, vocabulary {}, context {} (loaded in {:.2} s); Specula on {}; seed {seed}",
        model_path.display(),
        model.llama.config().n_layer,
        model.vocab(),
        model.context(),
        load.as_secs_f64(),
        engine.device().info().name,
    );
    let output = match texts.len() {
        1 => run_streaming(
            &mut engine,
            &model,
            requests,
            (!cli.chat).then_some(&texts[0]),
        )?,
        _ => run_batch(&mut engine, &model, requests)?,
    };
    eprintln!();
    for line in output.summary_lines() {
        eprintln!("{line}");
    }
    Ok(())
}

/// The prompts: `--prompt`, or the lines of `--prompts-file`.
fn prompts(cli: &Cli) -> Result<Vec<String>, RunnerError> {
    let prompts = match (&cli.prompt, &cli.prompts_file) {
        (Some(prompt), _) => vec![prompt.clone()],
        (None, Some(file)) => std::fs::read_to_string(file)
            .map_err(|e| RunnerError::io(format!("reading --prompts-file {}", file.display()), e))?
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| line.replace("\\n", "\n"))
            .collect(),
        (None, None) => {
            return Err(RunnerError::argument(
                "--prompt",
                "give --prompt TEXT or --prompts-file FILE",
            ));
        }
    };
    if prompts.is_empty() {
        return Err(RunnerError::argument("--prompts-file", "holds no prompt"));
    }
    Ok(prompts)
}

/// A seed from the clock, for runs without --seed.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// One Specula request per prompt, with the sampling flags.
fn requests(
    cli: &Cli,
    model: &Model,
    texts: &[String],
    seed: u64,
) -> Result<Vec<Request>, RunnerError> {
    let params = SamplingParams::default()
        .with_temperature(cli.temp)
        .with_top_k(cli.top_k)
        .with_top_p(cli.top_p)
        .with_min_p(cli.min_p)
        .with_repetition_penalty(cli.repeat_penalty)
        .with_frequency_presence(cli.frequency_penalty, cli.presence_penalty);
    params.validate().map_err(flag_error)?;
    if cli.n_predict == 0 {
        return Err(RunnerError::argument("-n", "must be at least 1"));
    }
    let vocab = model.vocab();
    let (mut bias, mut bans) = (Vec::new(), Vec::new());
    for &(id, value) in &cli.logit_bias {
        if usize::try_from(id).map_or(true, |id| id >= vocab) {
            return Err(RunnerError::argument(
                "--logit-bias",
                format!("token {id} not in 0 .. {vocab}"),
            ));
        }
        match value == f32::NEG_INFINITY {
            true => bans.push(vec![id]),
            false => bias.push((id, value)),
        }
    }
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let prompt = model.prompt(text, cli.chat)?;
            if prompt.len() >= model.context() {
                return Err(RunnerError::PromptTooLong {
                    index: i,
                    tokens: prompt.len(),
                    context: model.context(),
                });
            }
            Ok(Request::new(prompt)
                .with_params(params.with_seed(seed.wrapping_add(i as u64)))
                .with_max_dec_len(cli.n_predict)
                .with_logit_bias(bias.clone())
                .with_bad_words(bans.clone()))
        })
        .collect()
}

/// The decoder's configuration: TARGET_MATCH (greedy at temperature 0), the model's end tokens,
/// and the n-gram proposer with `--spec ngram`.
fn sampler_config(cli: &Cli, model: &Model, requests: usize) -> Result<SamplerConfig, RunnerError> {
    let plain = SamplerConfig::plain(
        Strategy::TargetMatch,
        requests.clamp(1, MAX_BATCH),
        model.vocab(),
        model.context(),
        model.end_tokens(),
    );
    let config = match cli.spec {
        Spec::None => plain,
        Spec::Ngram => {
            if cli.draft == 0 {
                return Err(RunnerError::argument(
                    "--draft",
                    "must be at least 1 with --spec ngram",
                ));
            }
            plain.with_ngram(cli.draft + 1, NgramConfig::default())
        }
    };
    config.validate().map_err(flag_error)?;
    Ok(config)
}

/// A Specula refusal of a request or configuration field, named by its flag.
fn flag_error(error: SamplerError) -> RunnerError {
    let flag = |field: &str| match field {
        "temperature" => "--temp",
        "top_p" => "--top-p",
        "top_k" => "--top-k",
        "min_p" => "--min-p",
        "repetition_penalty" => "--repeat-penalty",
        "presence_penalty" => "--presence-penalty",
        "frequency_penalty" => "--frequency-penalty",
        "max_step_tokens" => "--draft",
        _ => "",
    };
    match &error {
        SamplerError::Request { field, reason } | SamplerError::Config { field, reason }
            if !flag(field).is_empty() =>
        {
            RunnerError::argument(flag(field), reason.clone())
        }
        _ => RunnerError::Sampler(error),
    }
}

/// One request, its text streamed as it is generated.
fn run_streaming(
    engine: &mut Engine<KvForward<'_>>,
    model: &Model,
    requests: Vec<Request>,
    echo: Option<&String>,
) -> Result<RunStats, RunnerError> {
    let mut stdout = std::io::stdout().lock();
    if let Some(prompt) = echo {
        let _ = write!(stdout, "{prompt}");
        let _ = stdout.flush();
    }
    let mut stream = TextStream::new();
    let mut failed: Option<RunnerError> = None;
    let output = engine.run(requests, |event: TokenEvent<'_>| {
        for id in model.ids(event.tokens) {
            match stream.push(&model.tokenizer, id) {
                Ok(text) => {
                    let _ = write!(stdout, "{text}");
                }
                Err(e) => failed = failed.take().or(Some(e)),
            }
        }
        let _ = stdout.flush();
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let _ = writeln!(stdout, "{}", stream.finish(&model.tokenizer)?);
    Ok(output.stats)
}

/// Several requests, each printed whole when it finishes.
fn run_batch(
    engine: &mut Engine<KvForward<'_>>,
    model: &Model,
    requests: Vec<Request>,
) -> Result<RunStats, RunnerError> {
    let mut tokens: Vec<Vec<i32>> = vec![Vec::new(); requests.len()];
    let mut stdout = std::io::stdout().lock();
    let mut failed: Option<RunnerError> = None;
    let output = engine.run(requests, |event: TokenEvent<'_>| {
        tokens[event.request].extend_from_slice(event.tokens);
        if let Some(reason) = event.finished {
            match model
                .tokenizer
                .decode(&model.ids(&tokens[event.request]), true)
            {
                Ok(text) => {
                    let _ = writeln!(
                        stdout,
                        "### prompt {} ({reason:?})\n{text}\n",
                        event.request
                    );
                }
                Err(e) => failed = failed.take().or(Some(e)),
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(output.stats)
}
