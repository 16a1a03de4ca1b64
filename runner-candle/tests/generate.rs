//! Speculative == plain on a real model, on every backend: the six prompts (`common::PROMPTS`:
//! plain text and chat, one that repeats a passage) × three sampling settings (greedy; T = 0.8
//! with top-k 50 and top-p 0.9; T = 1 with min_p 0.05, repetition 1.2, presence 0.5, a logit bias
//! and a bad word) × {plain, n-gram speculative with up to 5 drafts}: the speculative tokens equal
//! the plain tokens, token for token, and the tokens sampled by wgpu and xpu-sim equal the CPU's.
//!
//! Under every setting the CPU also runs with the plain run's own tokens as the runner's drafts
//! (one changed every third step, [`PlainDrafts`]): those are accepted up to the changed one, so
//! the accepting branch of verification runs with every sampling parameter on, which the n-gram
//! proposer's drafts seldom reach under the third setting's penalties.
//!
//! The six requests of a run share 4 slots (continuous batching: a slot freed by a finished
//! request takes the next one, its KV cache cut back to 0), 24 tokens each.
//!
//! **What is computed once.** The CPU runs drive the runner's real forward pass (`KvForward`: a
//! KV cache per slot, cut back to each step's start position when drafts are rejected), and
//! every logits row they compute is recorded by its whole token prefix. Two rows recorded for the
//! same prefix — by the plain run one token at a time and by the speculative run inside a step of
//! several tokens — must be the same bits, and the test checks it. The wgpu and xpu-sim runs then
//! take the logits of a prefix from that record instead of running the model again: the model runs
//! on the CPU whatever backend samples, and its logits depend on the prefix alone (the batch
//! invariance `tests/model.rs` checks directly), so the record is exactly what the forward pass
//! would return. A prefix the CPU runs never met (a backend that sampled a different token) is
//! computed by a fresh forward pass over the whole prefix, and that run then fails the comparison
//! anyway. This keeps the test to a few minutes on a 2-core machine.
//!
//! Listed as skipped, with the reason, when the model file or a backend is absent; a failure
//! instead under `SPECULA_REQUIRE_MODEL=1` / `SPECULA_REQUIRE=wgpu,xpu-sim`.

mod common;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use common::{PROMPTS, TestResult, backend_need, model, model_need, open, trial};
use specula_backend_api::Device;
use specula_runner_candle::draft_length::DraftPolicy;
use specula_runner_candle::engine::{Drafter, Engine, Forward, KvForward, RunOutput};
use specula_runner_candle::{Llama, Model, RunnerError};
use specula_sampler::{
    Decoder, NgramConfig, Request, SamplerConfig, SamplingParams, SlotPlan, StepPlan, Strategy,
};

/// Tokens generated per request.
const TOKENS: usize = 24;
/// Slots: fewer than the six requests, so slots are reused.
const SLOTS: usize = 4;
/// Tokens a speculative step feeds: the last token and up to 5 drafts.
const STEP_TOKENS: usize = 6;
/// Every draft the proposer makes is fed (not the adaptive limit, the engine's default): the most
/// multi-token steps, where speculative == plain has the most ways to fail.
const POLICY: DraftPolicy = DraftPolicy::Fixed;

fn main() -> ExitCode {
    let model = model_need();
    let (wgpu, xpu) = (backend_need("wgpu"), backend_need("xpu-sim"));
    common::run(vec![
        trial(
            "cpu_speculative_tokens_equal_plain_tokens",
            &[&model],
            cpu_speculative_tokens_equal_plain_tokens,
        ),
        trial("wgpu_tokens_equal_cpu_tokens", &[&model, &wgpu], || {
            backend_tokens_equal_cpu_tokens("wgpu")
        }),
        trial("xpu_sim_tokens_equal_cpu_tokens", &[&model, &xpu], || {
            backend_tokens_equal_cpu_tokens("xpu-sim")
        }),
    ])
}

fn e(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// A sampling setting of the grid.
struct Setting {
    name: &'static str,
    params: SamplingParams,
    logit_bias: Vec<(i32, f32)>,
    bad_words: Vec<Vec<i32>>,
}

fn settings(model: &Model) -> Result<Vec<Setting>, String> {
    let token = |text: &str| -> Result<i32, String> {
        let ids = model.prompt(text, false).map_err(e)?;
        match ids[..] {
            [id] => Ok(id),
            _ => Err(format!("{text:?} is not one token: {ids:?}")),
        }
    };
    // A two-token bad word the repeating prompt's answer contains ("brown fox"), so drafts that
    // copy it are rejected where the ban cuts in.
    let bad_word = model.prompt(" brown fox", false).map_err(e)?;
    Ok(vec![
        Setting {
            name: "greedy",
            params: SamplingParams::greedy(),
            logit_bias: Vec::new(),
            bad_words: Vec::new(),
        },
        Setting {
            name: "T=0.8 top-k 50 top-p 0.9",
            params: SamplingParams::default()
                .with_temperature(0.8)
                .with_top_k(50)
                .with_top_p(0.9),
            logit_bias: Vec::new(),
            bad_words: Vec::new(),
        },
        Setting {
            name: "T=1 min_p 0.05 repetition 1.2 presence 0.5 bias bad word",
            params: SamplingParams::default()
                .with_temperature(1.0)
                .with_min_p(0.05)
                .with_repetition_penalty(1.2)
                .with_frequency_presence(0.0, 0.5),
            logit_bias: vec![(token(" the")?, -1.5), (token(" and")?, 1.0)],
            bad_words: vec![bad_word],
        },
    ])
}

/// The six requests of a setting (request `i` seeded `1000 + i`).
fn requests(model: &Model, setting: &Setting) -> Result<Vec<Request>, String> {
    PROMPTS
        .iter()
        .enumerate()
        .map(|(i, &(chat, text))| {
            Ok(Request::new(model.prompt(text, chat).map_err(e)?)
                .with_params(setting.params.with_seed(1000 + i as u64))
                .with_logit_bias(setting.logit_bias.clone())
                .with_bad_words(setting.bad_words.clone())
                .with_max_dec_len(TOKENS))
        })
        .collect()
}

fn config(model: &Model, speculative: bool) -> SamplerConfig {
    let plain = SamplerConfig::plain(
        Strategy::TargetMatch,
        SLOTS,
        model.vocab(),
        512,
        model.end_tokens(),
    );
    match speculative {
        true => plain.with_ngram(STEP_TOKENS, NgramConfig::default()),
        false => plain,
    }
}

/// The plain configuration with room for the runner's drafts (up to 5 a step), for
/// [`PlainDrafts`].
fn drafted_config(model: &Model) -> SamplerConfig {
    config(model, false).with_runner_drafts(STEP_TOKENS)
}

/// Drafts taken from the plain run's own tokens, one of them changed (its lowest bit flipped) on
/// every third call: with TARGET_MATCH they are accepted up to the changed one and the rest is
/// corrected, so the speculative path takes its accepting branch under every setting — the
/// n-gram proposer's drafts are seldom accepted under the third setting's penalties.
struct PlainDrafts {
    plain: Vec<Vec<i32>>,
    calls: usize,
}

impl Drafter for PlainDrafts {
    fn drafts(&mut self, request: usize, generated: &[i32], max: usize) -> Vec<i32> {
        self.calls += 1;
        let mut drafts: Vec<i32> = self
            .plain
            .get(request)
            .map(|tokens| {
                tokens
                    .iter()
                    .skip(generated.len())
                    .take(max)
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        if self.calls.is_multiple_of(3) && !drafts.is_empty() {
            let at = self.calls / 3 % drafts.len();
            drafts[at] ^= 1;
        }
        drafts
    }
}

/// Logits rows by their whole token prefix.
type Record = HashMap<Vec<i32>, Vec<f32>>;

/// The runner's forward pass, recording every row it computes by prefix; a prefix met again
/// must give the same bits (counted in `conflicts`).
struct Recording<'a> {
    inner: KvForward<'a>,
    record: &'a mut Record,
    conflicts: Vec<String>,
}

impl Forward for Recording<'_> {
    fn vocab(&self) -> usize {
        self.inner.vocab()
    }

    fn forward(
        &mut self,
        decoder: &Decoder,
        plan: &StepPlan,
        slot: &SlotPlan,
        logits: &mut Vec<f32>,
    ) -> Result<(), RunnerError> {
        let start = logits.len();
        self.inner.forward(decoder, plan, slot, logits)?;
        let vocab = self.vocab();
        for (row, values) in slot.rows.clone().zip(logits[start..].chunks(vocab)) {
            let prefix = decoder.row_prefix(row)?;
            match self.record.get(&prefix) {
                Some(known)
                    if known
                        .iter()
                        .zip(values)
                        .any(|(a, b)| a.to_bits() != b.to_bits()) =>
                {
                    self.conflicts.push(format!(
                        "prefix of {} tokens (row {row} of step {})",
                        prefix.len(),
                        plan.step
                    ));
                }
                Some(_) => {}
                None => {
                    self.record.insert(prefix, values.to_vec());
                }
            }
        }
        Ok(())
    }
}

/// Logits from the record; a prefix it lacks is computed by a fresh pass over the whole prefix.
struct Replay<'a> {
    llama: &'a Llama,
    record: &'a Record,
    misses: usize,
}

impl Forward for Replay<'_> {
    fn vocab(&self) -> usize {
        self.llama.config().vocab
    }

    fn forward(
        &mut self,
        decoder: &Decoder,
        _plan: &StepPlan,
        slot: &SlotPlan,
        logits: &mut Vec<f32>,
    ) -> Result<(), RunnerError> {
        for row in slot.rows.clone() {
            let prefix = decoder.row_prefix(row)?;
            match self.record.get(&prefix) {
                Some(values) => logits.extend_from_slice(values),
                None => {
                    self.misses += 1;
                    let tokens: Vec<u32> = prefix.iter().map(|&t| t as u32).collect();
                    let mut cache = self.llama.new_cache();
                    logits.extend(
                        self.llama
                            .forward(&tokens, &mut cache, &[tokens.len() - 1])?,
                    );
                }
            }
        }
        Ok(())
    }
}

/// Tokens of a run, per setting × mode: `[setting][speculative as usize]`, each the six
/// requests' tokens.
type Grid = Vec<[Vec<Vec<i32>>; 2]>;

/// The CPU runs and their record, computed once per test binary.
struct CpuGrid {
    tokens: Grid,
    /// Per setting, the run with [`PlainDrafts`]: its tokens, drafts fed and drafts accepted.
    drafted: Vec<(Vec<Vec<i32>>, u64, u64)>,
    record: Record,
}

fn cpu_grid() -> Result<&'static CpuGrid, String> {
    static GRID: OnceLock<Result<CpuGrid, String>> = OnceLock::new();
    GRID.get_or_init(run_cpu_grid)
        .as_ref()
        .map_err(|e| format!("the CPU runs failed: {e}"))
}

fn run(
    forward: impl Forward,
    device: Arc<dyn Device>,
    config: SamplerConfig,
    requests: Vec<Request>,
) -> Result<RunOutput, String> {
    Engine::with_forward(forward, device, config)
        .map(|engine| engine.with_draft_policy(POLICY))
        .and_then(|mut engine| engine.run(requests, |_| {}))
        .map_err(e)
}

fn run_cpu_grid() -> Result<CpuGrid, String> {
    let model = model()?;
    let cpu = open("cpu")?;
    let mut record = Record::new();
    let mut tokens = Grid::new();
    let mut drafted = Vec::new();
    let mut accepted = 0;
    for setting in settings(model)? {
        let mut modes: [Vec<Vec<i32>>; 2] = Default::default();
        for speculative in [false, true] {
            let mut recording = Recording {
                inner: KvForward::new(&model.llama, SLOTS),
                record: &mut record,
                conflicts: Vec::new(),
            };
            let output = {
                let mut engine =
                    Engine::with_forward(&mut recording, cpu.clone(), config(model, speculative))
                        .map_err(e)?
                        .with_draft_policy(POLICY);
                engine.run(requests(model, &setting)?, |_| {}).map_err(e)?
            };
            if !recording.conflicts.is_empty() {
                return Err(format!(
                    "{}, {}: the forward pass gave other logits for a prefix computed before: {:?}",
                    setting.name,
                    if speculative { "n-gram" } else { "plain" },
                    recording.conflicts
                ));
            }
            eprintln!(
                "cpu, {}, {}: {}",
                setting.name,
                if speculative { "n-gram" } else { "plain" },
                output.stats.summary()
            );
            if speculative {
                accepted += output.stats.drafts_accepted;
            }
            modes[speculative as usize] = output.generated;
        }
        drafted.push(run_drafted(model, &cpu, &setting, &mut record, &modes[0])?);
        tokens.push(modes);
    }
    if accepted == 0 {
        return Err(
            "no draft was accepted in any speculative run: speculation was never exercised".into(),
        );
    }
    Ok(CpuGrid {
        tokens,
        drafted,
        record,
    })
}

/// The CPU run of `setting` with the plain run's tokens as drafts ([`PlainDrafts`]), recorded
/// like the others (a prefix met before must give the same bits).
fn run_drafted(
    model: &Model,
    cpu: &Arc<dyn Device>,
    setting: &Setting,
    record: &mut Record,
    plain: &[Vec<i32>],
) -> Result<(Vec<Vec<i32>>, u64, u64), String> {
    let mut recording = Recording {
        inner: KvForward::new(&model.llama, SLOTS),
        record,
        conflicts: Vec::new(),
    };
    let drafter = PlainDrafts {
        plain: plain.to_vec(),
        calls: 0,
    };
    let output = {
        let mut engine = Engine::with_forward(&mut recording, cpu.clone(), drafted_config(model))
            .map_err(e)?
            .with_draft_policy(POLICY)
            .with_drafter(drafter);
        engine.run(requests(model, setting)?, |_| {}).map_err(e)?
    };
    if !recording.conflicts.is_empty() {
        return Err(format!(
            "{}, plain tokens as drafts: the forward pass gave other logits for a prefix computed before: {:?}",
            setting.name, recording.conflicts
        ));
    }
    eprintln!(
        "cpu, {}, plain tokens as drafts: {}",
        setting.name,
        output.stats.summary()
    );
    let stats = &output.stats;
    Ok((
        output.generated,
        stats.drafts_proposed,
        stats.drafts_accepted,
    ))
}

fn cpu_speculative_tokens_equal_plain_tokens() -> TestResult {
    let model = model()?;
    let grid = cpu_grid()?;
    let runs = settings(model)?;
    for ((setting, [plain, speculative]), (drafted, fed, accepted)) in
        runs.iter().zip(&grid.tokens).zip(&grid.drafted)
    {
        compare(
            &format!("cpu, {}: n-gram vs plain", setting.name),
            speculative,
            plain,
        )?;
        let what = format!("cpu, {}: plain tokens as drafts vs plain", setting.name);
        compare(&what, drafted, plain)?;
        // Both branches of verification ran: drafts accepted, and changed ones rejected.
        if *accepted == 0 || accepted >= fed {
            return Err(format!(
                "{what}: {accepted} of {fed} drafts accepted; expected some, not all"
            ));
        }
    }
    Ok(())
}

fn backend_tokens_equal_cpu_tokens(backend: &str) -> TestResult {
    let model = model()?;
    let grid = cpu_grid()?;
    let device = open(backend)?;
    for (setting, cpu_tokens) in settings(model)?.iter().zip(&grid.tokens) {
        for speculative in [false, true] {
            let mut replay = Replay {
                llama: &model.llama,
                record: &grid.record,
                misses: 0,
            };
            let output = run(
                &mut replay,
                device.clone(),
                config(model, speculative),
                requests(model, setting)?,
            )?;
            let mode = if speculative { "n-gram" } else { "plain" };
            let what = format!("{backend} vs cpu, {}, {mode}", setting.name);
            eprintln!("{what}: {}", output.stats.summary());
            compare(&what, &output.generated, &cpu_tokens[speculative as usize])?;
            // The same tokens and the same drafts: every prefix was one the CPU runs computed.
            if replay.misses != 0 {
                return Err(format!(
                    "{what}: {} logits rows of prefixes the CPU runs never met",
                    replay.misses
                ));
            }
        }
    }
    Ok(())
}

/// Compares the six requests' tokens, naming the first that differs.
fn compare(what: &str, got: &[Vec<i32>], expected: &[Vec<i32>]) -> TestResult {
    for (i, (g, x)) in got.iter().zip(expected).enumerate() {
        if g != x {
            let at = g.iter().zip(x).take_while(|(a, b)| a == b).count();
            return Err(format!(
                "{what}: prompt {i} differs at token {at}:\n  got      {g:?}\n  expected {x:?}"
            ));
        }
    }
    if got.len() != expected.len() {
        return Err(format!(
            "{what}: {} requests, expected {}",
            got.len(),
            expected.len()
        ));
    }
    Ok(())
}
