//! # specula-sampler
//!
//! What an LLM inference runner imports for the sampling side of decoding, on any Specula
//! [`Device`](specula_backend_api::Device):
//!
//! - [`registry`]: open a backend by name (`open("cpu")`, `open("auto")`, `open("wgpu:1")`);
//! - [`Decoder`]: a batch of request slots and the unified decoding step over them — build the
//!   layout, gather, argmax / sample / candidates per the [`Strategy`], verify the drafts and
//!   update the state. Non-speculative decoding is the same step with zero drafts; with GREEDY or
//!   TARGET_MATCH, speculative decoding emits exactly the tokens of non-speculative decoding.
//!   [`SamplerConfig`] has one builder per decoding mode, each with an example:
//!   [`plain`](SamplerConfig::plain), [`with_ngram`](SamplerConfig::with_ngram),
//!   [`with_runner_drafts`](SamplerConfig::with_runner_drafts) (drafts from
//!   [`Decoder::set_drafts`] for the [`Decoder::decode_slots`]) and
//!   [`rejection`](SamplerConfig::rejection) (a draft model's rows);
//! - [`arrivals`]: [`serve`](arrivals::serve) requests as they arrive, inserting and removing
//!   them around the runner's step;
//! - [`seeds`]: the per-token seed schedule (`infer_seed` advances by 4 per emitted token).
//!
//! ## Sampling from logits
//!
//! A step given logits ([`StepScores::logits`]) samples from them **exactly, without a
//! softmax**: every token's weight is an integer computed from its logit, the row maximum and the
//! request's temperature (`docs/semantics.md` §4b), the same integers on every backend, so the same
//! logits and seeds give the same tokens on every device. TARGET_MATCH samples each row with
//! `top_k_top_p_sample`, GREEDY takes the `argmax` of the logits, TOPP's candidates come from
//! `top_p_candidates` and REJECTION weighs the target and draft logits
//! ([`StepScores::with_draft`]) alike. `softmax` (a float op) is for callers who want
//! probabilities; log-probabilities come from `accept_logprobs`. Runners that already hold
//! probabilities pass them with [`StepScores::probs`].
//!
//! ## A runner's loop
//!
//! A toy model whose next-token logits are a function of the prefix, decoded speculatively with
//! the n-gram proposer:
//!
//! ```
//! use specula_backend_api::{DeviceExt, Strategy};
//! use specula_sampler::{Decoder, NgramConfig, Request, SamplerConfig, StepScores, registry};
//!
//! const V: usize = 16;
//! // Next-token logits of the toy model: favours (last + 1) mod V.
//! fn logits(prefix: &[i32]) -> Vec<f32> {
//!     let last = prefix.last().copied().unwrap_or(0) as usize;
//!     (0..V).map(|v| if v == (last + 1) % V { 4.0 } else { (v * prefix.len() % 3) as f32 }).collect()
//! }
//!
//! let device = registry::open("cpu")?;
//! let config = SamplerConfig::new(Strategy::TargetMatch, 4, V, 64, vec![0])
//!     .with_ngram(4, NgramConfig::default());
//! let mut decoder = Decoder::new(device.clone(), config)?;
//! // Build every kernel now rather than in the first step (a no-op on the CPU).
//! decoder.warm_up()?;
//! let slot = decoder.insert(Request::new(vec![3, 4, 5, 3, 4]).with_seed(7).with_max_dec_len(12))?;
//!
//! while decoder.has_running() {
//!     let plan = decoder.plan()?;
//!     // The runner's forward pass: one row of logits per output row of the plan.
//!     let mut rows = Vec::with_capacity(plan.t_out() * V);
//!     for row in 0..plan.t_out() {
//!         rows.extend(logits(&decoder.row_prefix(row)?));
//!     }
//!     let logits = device.upload(&rows)?;
//!     let output = decoder.finish(StepScores::logits(&logits))?;
//!     for slot_output in &output.slots {
//!         assert!(!slot_output.tokens.is_empty());
//!     }
//! }
//! let tokens = decoder.remove(slot)?.generated;
//! assert!(tokens.len() <= 12);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Call [`Decoder::warm_up`] once after [`Decoder::new`]: the accelerated backends otherwise build
//! their kernels at the first call of each op, which makes the first step slow (on wgpu over
//! lavapipe, seconds of pipeline compiles; see `backend-wgpu/README.md`). It is idempotent, and
//! returns at once on the CPU.
//!
//! A runner with a real model feeds [`StepPlan::input_tokens`] at [`StepPlan::input_positions`],
//! calls [`Decoder::gather_next_token`] on its hidden states, applies its LM head and passes the
//! logits to [`Decoder::finish`].
//!
//! ## Every sampling parameter
//!
//! Penalties (repetition, frequency, presence), min_p and min_tokens are [`SamplingParams`];
//! logit bias, bad words and allowed token ids are set on the [`Request`]; a structured-output
//! token bitmask comes with each step's scores ([`StepScores::with_bitmask`]). They apply to every
//! output row from that row's own history (the generated tokens and the drafts before it,
//! `docs/semantics.md` §4c), so speculative decoding still emits exactly the tokens of plain
//! decoding. A request whose every token is masked stops with [`FinishReason::Masked`].
//!
//! ```
//! use specula_backend_api::{DeviceExt, Strategy};
//! use specula_sampler::{Decoder, NgramConfig, Request, SamplerConfig, SamplingParams, StepScores, registry};
//!
//! const V: usize = 40;
//! let device = registry::open("cpu")?;
//! let config = SamplerConfig::new(Strategy::TargetMatch, 2, V, 64, vec![0])
//!     .with_ngram(4, NgramConfig::default());
//! let mut decoder = Decoder::new(device.clone(), config)?;
//! let params = SamplingParams::default()
//!     .with_temperature(0.8)
//!     .with_top_p(0.95)
//!     .with_top_k(20)
//!     .with_seed(11)
//!     .with_repetition_penalty(1.2)
//!     .with_frequency_presence(0.3, 0.1)
//!     .with_min_p(0.05)
//!     .with_min_tokens(3);
//! let request = Request::new(vec![5, 6, 7, 5, 6])
//!     .with_params(params)
//!     .with_logit_bias(vec![(8, -1.5), (30, 2.0)])
//!     .with_bad_words(vec![vec![13], vec![6, 7]])
//!     .with_allowed_token_ids((0..V as i32).filter(|t| t % 9 != 4).collect())
//!     .with_max_dec_len(10);
//! let slot = decoder.insert(request)?;
//! while decoder.has_running() {
//!     let plan = decoder.plan()?;
//!     let rows: Vec<f32> = (0..plan.t_out() * V).map(|i| ((i * 7) % V) as f32 / 8.0).collect();
//!     let logits = device.upload(&rows)?;
//!     // Structured output: every row may use the tokens below 32 only.
//!     let bitmask = device.upload(&[u32::MAX, 0].repeat(plan.t_out()))?;
//!     decoder.finish(StepScores::logits(&logits).with_bitmask(&bitmask))?;
//! }
//! let generated = decoder.remove(slot)?.generated;
//! assert!(generated.iter().all(|&t| t < 32 && t != 13 && t % 9 != 4 || t == 0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

//! ## Per-request ends and log-probabilities
//!
//! A request ends after exactly [`Request::max_dec_len`] real tokens with
//! [`FinishReason::Length`] (vLLM's `max_tokens`; FastDeploy's replacement of the last token by
//! `end_tokens[0]` is [`SamplerConfig::with_fastdeploy_max_dec_len`]), or at the first of its own
//! [`stop_tokens`](Request::with_stop_tokens) with [`FinishReason::EndToken`], on top of the
//! decoder's end tokens, which end every request. The Decoder cuts the step's tokens after the
//! one that ends the request and stops the slot on the device (`docs/semantics.md` §8), so
//! speculative decoding still emits exactly the tokens of plain decoding. Log-probabilities are
//! per request too: [`SamplerConfig::logprobs`] `K` is the most a request may ask for with
//! [`Request::with_logprobs`]; a request that does not ask gets none.
//!
//! ```
//! use specula_backend_api::{DeviceExt, Strategy};
//! use specula_sampler::{Decoder, FinishReason, Request, SamplerConfig, StepScores, registry};
//!
//! const V: usize = 16;
//! let device = registry::open("cpu")?;
//! let config = SamplerConfig {
//!     logprobs: Some(4),
//!     ..SamplerConfig::new(Strategy::Greedy, 2, V, 64, vec![0])
//! };
//! let mut decoder = Decoder::new(device.clone(), config)?;
//! // The toy model always favours (last + 1) mod V.
//! let counting = decoder.insert(Request::new(vec![3]).with_max_dec_len(4).with_logprobs(2))?;
//! let stopping = decoder.insert(Request::new(vec![3]).with_stop_tokens(vec![6]))?;
//! while decoder.has_running() {
//!     let plan = decoder.plan()?;
//!     let mut rows = Vec::new();
//!     for row in 0..plan.t_out() {
//!         let last = *decoder.row_prefix(row)?.last().unwrap_or(&0) as usize;
//!         rows.extend((0..V).map(|v| if v == (last + 1) % V { 1.0f32 } else { 0.0 }));
//!     }
//!     let output = decoder.finish(StepScores::logits(&device.upload(&rows)?))?;
//!     for slot in &output.slots {
//!         let widths = slot.logprobs.as_ref().map(|lp| lp[0].top.len());
//!         assert_eq!(widths, (slot.slot == counting).then_some(2));
//!     }
//! }
//! assert_eq!(decoder.generated(counting), Some(&[4, 5, 6, 7][..]));
//! assert_eq!(decoder.finish_reason(counting), Some(FinishReason::Length));
//! assert_eq!(decoder.generated(stopping), Some(&[4, 5, 6][..]));
//! assert_eq!(decoder.finish_reason(stopping), Some(FinishReason::EndToken));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

pub mod arrivals;
mod buffers;
mod config;
mod decoder;
mod error;
mod processing;
pub mod registry;
pub mod seeds;

/// The runner guide, `docs/runner.md`: depending on Specula, devices, decoding modes, requests,
/// the step loop around a forward pass, and errors. Its code blocks run as doc tests.
#[doc = include_str!("../../docs/runner.md")]
pub mod guide {}
mod step;

pub use config::{NgramConfig, Request, SamplerConfig, SamplingParams};
pub use decoder::{Decoder, PendingStep, RemovedRequest, Sharding};
pub use error::{Result, SamplerError, StepError};
pub use registry::{BackendSpec, Probe, open, probe_all};
pub use specula_backend_api::Strategy;
/// The `half` crate, whose `f16` and `bf16` are the element types of half-precision logits
/// and probability rows (`device.upload(&rows)` with `rows: Vec<half::bf16>`), re-exported so
/// that a runner needs no dependency of its own at a matching version.
pub use specula_backend_api::half;
/// Tensor-parallel sampling (`specula-shard`): the collective engines and groups a runner gives
/// [`Decoder::new_sharded`].
pub use specula_shard as shard;
pub use step::{
    DecodeStats, FinishReason, OutputRow, Scores, SlotOutput, SlotPlan, SlotStepKind, StepOutput,
    StepPlan, StepScores, TokenLogprob,
};
