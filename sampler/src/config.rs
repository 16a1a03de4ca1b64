//! What a [`Decoder`](crate::Decoder) is built with, and what a request asks for.

use specula_backend_api::abi::{
    DEFAULT_NGRAM_THRESHOLD, MAX_CANDIDATES, MAX_LOGPROBS_TOP_K, MAX_VOCAB,
};
use specula_backend_api::ops::BatchDims;
use specula_backend_api::{DType, Op, Strategy, WarmUp};

use crate::error::{Result, SamplerError};

/// The n-gram draft proposer (`docs/semantics.md` §5.10): drafts are the tokens that followed the
/// last generated n-gram in the prompt or the generated history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// The longest n-gram tried.
    pub max_ngram_size: usize,
    /// The shortest n-gram tried (`1 ≤ min ≤ max`).
    pub min_ngram_size: usize,
    /// Global budget of tokens per step, prefill tokens included (default 128, at least 2: see
    /// [`NgramConfig::validate`]).
    pub threshold: usize,
}

impl NgramConfig {
    /// The smallest `threshold` that can grant a draft: the budget first reserves one token per
    /// decode slot, so a threshold below 2 never leaves room for one.
    pub const MIN_THRESHOLD: usize = 2;

    /// Checks every field; [`SamplerConfig::validate`] (so [`Decoder::new`](crate::Decoder::new))
    /// calls it. Errors are [`SamplerError::Config`] naming the field (`ngram.min_ngram_size`,
    /// `ngram.threshold`) and the accepted range:
    ///
    /// - `min_ngram_size` in `1 ..= max_ngram_size` (so `max_ngram_size ≥ 1`);
    /// - `threshold ≥ 2` ([`MIN_THRESHOLD`](Self::MIN_THRESHOLD)): 0 or 1 would silently disable
    ///   drafting (`docs/semantics.md` §5.10: the budget left for drafts is `threshold` minus the
    ///   prefill tokens and one token per decode slot).
    ///
    /// A `max_ngram_size` beyond any context is fine (longer n-grams than the generated tokens are
    /// skipped).
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(SamplerError::Config { field, reason });
        if self.min_ngram_size == 0 || self.min_ngram_size > self.max_ngram_size {
            return bad(
                "ngram.min_ngram_size",
                format!(
                    "{} not in 1 ..= max_ngram_size {}",
                    self.min_ngram_size, self.max_ngram_size
                ),
            );
        }
        if self.threshold < Self::MIN_THRESHOLD {
            return bad(
                "ngram.threshold",
                format!(
                    "{} not in {} ..= {}: the budget reserves one token per decode slot, so a \
                     smaller threshold never grants a draft",
                    self.threshold,
                    Self::MIN_THRESHOLD,
                    usize::MAX
                ),
            );
        }
        Ok(())
    }
}

impl Default for NgramConfig {
    /// `max_ngram_size` 3, `min_ngram_size` 1, `threshold` 128.
    fn default() -> Self {
        NgramConfig {
            max_ngram_size: 3,
            min_ngram_size: 1,
            threshold: DEFAULT_NGRAM_THRESHOLD,
        }
    }
}

/// The shape and policy of a [`Decoder`](crate::Decoder). Buffers are sized from it once.
///
/// One builder per decoding mode, each with an example:
///
/// - plain (non-speculative) decoding: [`SamplerConfig::plain`] (or [`SamplerConfig::new`], the
///   same), `S = 1`: the same step with zero drafts;
/// - speculative with the n-gram proposer: [`with_ngram`](SamplerConfig::with_ngram);
/// - speculative with the runner's own drafts (a draft model, Medusa/EAGLE heads, a lookup of its
///   own), no proposer: [`with_runner_drafts`](SamplerConfig::with_runner_drafts);
/// - REJECTION, exact speculative sampling against a draft model's rows:
///   [`SamplerConfig::rejection`].
///
/// The fields are public, so anything else is a struct update
/// (`SamplerConfig { logprobs: Some(5), ..SamplerConfig::plain(..) }`).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// How drafts are verified and tokens chosen. GREEDY and TARGET_MATCH are lossless (the tokens
    /// equal those of non-speculative decoding); TOPP is FastDeploy's lossy mode; REJECTION needs
    /// a draft model's logits or probabilities (see [`StepScores::with_draft`](crate::StepScores::with_draft)),
    /// so it cannot be combined with the n-gram proposer.
    pub strategy: Strategy,
    /// Number of request slots.
    pub max_bsz: usize,
    /// `S`: the most tokens a decode slot feeds in one step (1 + the most drafts). 1 is
    /// non-speculative decoding.
    pub max_step_tokens: usize,
    /// Vocabulary size `V`, `1 ..= 2^20`.
    pub vocab: usize,
    /// Room per slot for prompt plus generated tokens; a request stops when it is full.
    pub max_model_len: usize,
    /// End tokens (at least one): emitting one stops every request (a request's own
    /// [`stop_tokens`](Request::stop_tokens) come on top of them). `end_tokens[0]` is the token
    /// emitted in place of one where the ops fabricate a token (a row with every token masked,
    /// and, with [`fastdeploy_max_dec_len`](SamplerConfig::fastdeploy_max_dec_len), the token
    /// that reaches `max_dec_len`). A model without an end token can pass an id it never emits.
    pub end_tokens: Vec<i32>,
    /// `C`, candidates per row for the TOPP strategy (`1 ..= 128`, default 8).
    pub candidates: usize,
    /// `Some(K)`: log-probabilities are computed for the step (`K ≤ 64`), and a request that asks
    /// for them ([`Request::with_logprobs`]`(k)`, `k ≤ K`) gets each emitted token's
    /// log-probability and rank plus its top-`k` alternatives; requests that do not ask get none.
    /// `None`: no log-probabilities (no work is spent on them, and a request that asks for them
    /// is refused on insert).
    pub logprobs: Option<usize>,
    /// The n-gram proposer, used when `max_step_tokens > 1`. Without it, drafts come from the
    /// runner through [`Decoder::set_drafts`](crate::Decoder::set_drafts) (or there are none).
    /// With `max_step_tokens == 1` it is validated but never runs (a way to switch speculation
    /// off without dropping the proposer's settings); [`Decoder::new`](crate::Decoder::new) logs
    /// that with `tracing::warn!` rather than failing.
    pub ngram: Option<NgramConfig>,
    /// Accept every (in-vocabulary) draft; for benchmarks and dummy runs.
    pub accept_all: bool,
    /// Accept no draft; wins over `accept_all`.
    pub reject_all: bool,
    /// FastDeploy's op-level `max_dec_len`: the token that reaches a request's `max_dec_len` is
    /// replaced by `end_tokens[0]` on the device (so `with_max_dec_len(4)` yields 3 real tokens
    /// and `end_tokens[0]`), finish reason [`Length`](crate::FinishReason::Length).
    ///
    /// `false` (the default): the request ends on the host after exactly `max_dec_len` real
    /// tokens, finish reason [`Length`](crate::FinishReason::Length), as vLLM's `max_tokens`
    /// does. The device is then given `max_dec_len + 1`, so its replacement can only hit a token
    /// the host cuts anyway, and the n-gram proposer drafts at most one token past the limit.
    pub fastdeploy_max_dec_len: bool,
}

impl SamplerConfig {
    /// What a step of this configuration may launch, for target rows of the float dtype `scores`
    /// (what [`Decoder::warm_up_for`](crate::Decoder::warm_up_for) builds): the batch ops, the
    /// strategy's sampling op (GREEDY: `argmax`, and the `top_k = 1` sample of processed rows;
    /// TARGET_MATCH: `top_k_top_p_sample`; TOPP: `top_p_candidates`; REJECTION: the sample of a
    /// step without drafts and the `softmax` of logits checked against draft probabilities),
    /// `verify_draft_tokens`, `update_state`, `process_logits` (any request may ask for
    /// processing), `ngram_match` with the proposer and `accept_logprobs` with log-probabilities.
    pub fn warm_up_plan(&self, scores: DType) -> WarmUp {
        let strategy_ops: &[Op] = match self.strategy {
            Strategy::Greedy => &[Op::Argmax, Op::TopKTopPSample],
            Strategy::TargetMatch => &[Op::TopKTopPSample],
            Strategy::TopP => &[Op::TopPCandidates],
            Strategy::Rejection => &[Op::TopKTopPSample, Op::Softmax],
        };
        let always = [
            Op::BuildOutputLayout,
            Op::BuildSamplingParams,
            Op::GatherNextToken,
            Op::ProcessLogits,
            Op::VerifyDraftTokens,
            Op::UpdateState,
        ];
        let optional = [
            (self.ngram.is_some(), Op::NgramMatch),
            (self.logprobs.is_some(), Op::AcceptLogprobs),
        ];
        let ops = always
            .into_iter()
            .chain(strategy_ops.iter().copied())
            .chain(optional.into_iter().filter_map(|(on, op)| on.then_some(op)));
        WarmUp::new(ops, [scores])
    }

    /// A non-speculative configuration: `S = 1`, no proposer, 8 TOPP candidates, no logprobs
    /// (the same as [`SamplerConfig::plain`]).
    pub fn new(
        strategy: Strategy,
        max_bsz: usize,
        vocab: usize,
        max_model_len: usize,
        end_tokens: Vec<i32>,
    ) -> Self {
        SamplerConfig {
            strategy,
            max_bsz,
            max_step_tokens: 1,
            vocab,
            max_model_len,
            end_tokens,
            candidates: 8,
            logprobs: None,
            ngram: None,
            accept_all: false,
            reject_all: false,
            fastdeploy_max_dec_len: false,
        }
    }

    /// The same configuration with FastDeploy's op-level `max_dec_len` (see
    /// [`fastdeploy_max_dec_len`](SamplerConfig::fastdeploy_max_dec_len)): the token that
    /// reaches a request's `max_dec_len` is replaced by `end_tokens[0]`.
    pub fn with_fastdeploy_max_dec_len(mut self) -> Self {
        self.fastdeploy_max_dec_len = true;
        self
    }

    /// The `max_dec_len` the device is given for a request's `max_dec_len` (see
    /// [`fastdeploy_max_dec_len`](SamplerConfig::fastdeploy_max_dec_len)), saturating at
    /// `i32::MAX`.
    pub(crate) fn device_max_dec_len(&self, max_dec_len: usize) -> i32 {
        let limit = match self.fastdeploy_max_dec_len {
            true => max_dec_len,
            false => max_dec_len.saturating_add(1),
        };
        i32::try_from(limit).unwrap_or(i32::MAX)
    }

    /// Plain (non-speculative) decoding: `S = 1`, no proposer, 8 TOPP candidates, no logprobs.
    /// Each step feeds one token per running slot and emits one token per slot.
    ///
    /// ```
    /// use specula_backend_api::{DeviceExt, Strategy};
    /// use specula_sampler::{Decoder, Request, SamplerConfig, StepScores, registry};
    ///
    /// const V: usize = 8;
    /// let device = registry::open("cpu")?;
    /// let config = SamplerConfig::plain(Strategy::Greedy, 1, V, 32, vec![0]);
    /// let mut decoder = Decoder::new(device.clone(), config)?;
    /// let slot = decoder.insert(Request::new(vec![1, 2]).with_max_dec_len(3))?;
    /// while decoder.has_running() {
    ///     let plan = decoder.plan()?;
    ///     // One row per output row; the toy model favours token 5.
    ///     let rows: Vec<f32> = (0..plan.t_out() * V).map(|i| (i % V == 5) as u8 as f32).collect();
    ///     decoder.finish(StepScores::logits(&device.upload(&rows)?))?;
    /// }
    /// assert_eq!(decoder.generated(slot), Some(&[5, 5, 5][..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn plain(
        strategy: Strategy,
        max_bsz: usize,
        vocab: usize,
        max_model_len: usize,
        end_tokens: Vec<i32>,
    ) -> Self {
        SamplerConfig::new(strategy, max_bsz, vocab, max_model_len, end_tokens)
    }

    /// The same configuration, speculative with the n-gram proposer (`docs/semantics.md` §5.10)
    /// and `max_step_tokens` tokens per decode step (`S`: 1 + the most drafts). The proposer
    /// drafts from the prompt and the generated history during [`plan`](crate::Decoder::plan);
    /// the runner's loop is the plain one. Not for REJECTION, which needs a draft model's rows.
    ///
    /// ```
    /// use specula_backend_api::{DeviceExt, Strategy};
    /// use specula_sampler::{Decoder, NgramConfig, Request, SamplerConfig, StepScores, registry};
    ///
    /// const V: usize = 8;
    /// let device = registry::open("cpu")?;
    /// let config = SamplerConfig::plain(Strategy::Greedy, 1, V, 64, vec![0])
    ///     .with_ngram(4, NgramConfig::default());
    /// let mut decoder = Decoder::new(device.clone(), config)?;
    /// // The toy model continues the cycle 1, 2, 3, 4, 1, 2, ...; the prompt holds it.
    /// let next = |t: i32| t % 4 + 1;
    /// let slot = decoder.insert(Request::new(vec![1, 2, 3, 4, 1]).with_max_dec_len(12))?;
    /// while decoder.has_running() {
    ///     let plan = decoder.plan()?;
    ///     let mut rows = Vec::new();
    ///     for row in 0..plan.t_out() {
    ///         let last = *decoder.row_prefix(row)?.last().unwrap_or(&0);
    ///         rows.extend((0..V as i32).map(|v| (v == next(last)) as u8 as f32));
    ///     }
    ///     decoder.finish(StepScores::logits(&device.upload(&rows)?))?;
    /// }
    /// assert_eq!(decoder.generated(slot).map(<[i32]>::len), Some(12));
    /// // 12 tokens in fewer than 12 steps: the drafts were accepted.
    /// assert!(decoder.stats().steps < 12 && decoder.stats().drafts_accepted > 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_ngram(mut self, max_step_tokens: usize, ngram: NgramConfig) -> Self {
        self.max_step_tokens = max_step_tokens;
        self.ngram = Some(ngram);
        self
    }

    /// The same configuration, speculative with the runner's own drafts and no proposer:
    /// `max_step_tokens` tokens per decode step (`S`: 1 + the most drafts). Between
    /// [`propose`](crate::Decoder::propose) and [`plan`](crate::Decoder::plan) the runner sets
    /// each decode slot's drafts (at most `S − 1`) with
    /// [`set_drafts`](crate::Decoder::set_drafts); a slot without drafts feeds one token.
    ///
    /// ```
    /// use specula_backend_api::{DeviceExt, Strategy};
    /// use specula_sampler::{Decoder, Request, SamplerConfig, StepScores, registry};
    ///
    /// const V: usize = 8;
    /// let device = registry::open("cpu")?;
    /// let config = SamplerConfig::plain(Strategy::Greedy, 2, V, 64, vec![0]).with_runner_drafts(3);
    /// let mut decoder = Decoder::new(device.clone(), config)?;
    /// let next = |t: i32| t % 7 + 1; // the toy model: 1, 2, ..., 7, 1, ...
    /// let slot = decoder.insert(Request::new(vec![1]).with_max_dec_len(10))?;
    /// while decoder.has_running() {
    ///     decoder.propose()?;
    ///     for b in decoder.decode_slots() {
    ///         // The runner's draft model: here a perfect guess of the next two tokens.
    ///         let last = *decoder.context(b).and_then(|c| c.last()).unwrap_or(&0);
    ///         decoder.set_drafts(b, &[next(last), next(next(last))])?;
    ///     }
    ///     let plan = decoder.plan()?;
    ///     let mut rows = Vec::new();
    ///     for row in 0..plan.t_out() {
    ///         let last = *decoder.row_prefix(row)?.last().unwrap_or(&0);
    ///         rows.extend((0..V as i32).map(|v| (v == next(last)) as u8 as f32));
    ///     }
    ///     decoder.finish(StepScores::logits(&device.upload(&rows)?))?;
    /// }
    /// assert_eq!(decoder.generated(slot), Some(&[2, 3, 4, 5, 6, 7, 1, 2, 3, 4][..]));
    /// assert_eq!(decoder.stats().steps, 4); // a prefill, then 3 tokens per step
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_runner_drafts(mut self, max_step_tokens: usize) -> Self {
        self.max_step_tokens = max_step_tokens;
        self.ngram = None;
        self
    }

    /// REJECTION (exact speculative sampling, `docs/semantics.md` §5.8) with the runner's draft
    /// model: `max_step_tokens` tokens per decode step (`S`: 1 + the most drafts), no proposer,
    /// otherwise as [`SamplerConfig::new`]. The runner sets each decode slot's drafts with
    /// [`set_drafts`](crate::Decoder::set_drafts) and hands the draft model's rows to
    /// [`finish`](crate::Decoder::finish) with
    /// [`StepScores::with_draft`](crate::StepScores::with_draft) (logits, like the target's) or
    /// [`with_draft_probs`](crate::StepScores::with_draft_probs): `[max_bsz · (S − 1), V]`, row
    /// `b · (S − 1) + i` for draft `i + 1` of slot `b`. The tokens follow the target model's
    /// distribution whatever the draft model proposes.
    ///
    /// ```
    /// use specula_backend_api::{DeviceExt, Strategy};
    /// use specula_sampler::{Decoder, Request, SamplerConfig, StepScores, registry};
    ///
    /// const V: usize = 8;
    /// const S: usize = 3;
    /// let device = registry::open("cpu")?;
    /// let config = SamplerConfig::rejection(1, V, 64, vec![0], S);
    /// assert_eq!((config.strategy, config.max_step_tokens), (Strategy::Rejection, S));
    /// let mut decoder = Decoder::new(device.clone(), config)?;
    /// // Target and draft model alike: token (last + 1) mod 8, never 0, is all but certain.
    /// let next = |t: i32| t % 7 + 1;
    /// let row = |last: i32| (0..V as i32).map(move |v| if v == next(last) { 30.0f32 } else { 0.0 });
    /// let slot = decoder.insert(Request::new(vec![1]).with_seed(3).with_max_dec_len(9))?;
    /// while decoder.has_running() {
    ///     decoder.propose()?;
    ///     // Only the drafted rows, in slot order then draft order (the plan's order).
    ///     let mut draft_rows = Vec::new();
    ///     for b in decoder.decode_slots() {
    ///         let last = *decoder.context(b).and_then(|c| c.last()).unwrap_or(&0);
    ///         let drafts = [next(last), next(next(last))];
    ///         decoder.set_drafts(b, &drafts)?;
    ///         // The draft model's row for draft i + 1 predicts it from the tokens before it.
    ///         for before in [last, drafts[0]] {
    ///             draft_rows.extend(row(before));
    ///         }
    ///     }
    ///     let plan = decoder.plan()?;
    ///     let mut target = Vec::new();
    ///     for r in 0..plan.t_out() {
    ///         target.extend(row(*decoder.row_prefix(r)?.last().unwrap_or(&0)));
    ///     }
    ///     let (target, draft) = (device.upload(&target)?, device.upload(&draft_rows)?);
    ///     decoder.finish(StepScores::logits(&target).with_draft_rows(&draft))?;
    /// }
    /// assert_eq!(decoder.generated(slot), Some(&[2, 3, 4, 5, 6, 7, 1, 2, 3][..]));
    /// assert!(decoder.stats().drafts_accepted > 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rejection(
        max_bsz: usize,
        vocab: usize,
        max_model_len: usize,
        end_tokens: Vec<i32>,
        max_step_tokens: usize,
    ) -> Self {
        SamplerConfig::new(
            Strategy::Rejection,
            max_bsz,
            vocab,
            max_model_len,
            end_tokens,
        )
        .with_runner_drafts(max_step_tokens)
    }

    /// The same configuration as REJECTION with the runner's draft model
    /// ([`SamplerConfig::rejection`]): `max_step_tokens` tokens per decode step, no proposer,
    /// and the strategy REJECTION whatever the configuration was built with.
    #[deprecated(
        note = "with_rejection replaces the strategy the configuration was built with \
                (`plain(Strategy::Greedy, ..).with_rejection(S)` is REJECTION): use \
                `SamplerConfig::rejection(max_bsz, vocab, max_model_len, end_tokens, S)`"
    )]
    pub fn with_rejection(self, max_step_tokens: usize) -> Self {
        SamplerConfig {
            strategy: Strategy::Rejection,
            ..self
        }
        .with_runner_drafts(max_step_tokens)
    }

    /// Whether a step can carry drafts (`S > 1`).
    pub fn is_speculative(&self) -> bool {
        self.max_step_tokens > 1
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(SamplerError::Config { field, reason });
        if self.max_bsz == 0 {
            return bad("max_bsz", "must be >= 1".into());
        }
        if self.max_step_tokens == 0 {
            return bad("max_step_tokens", "must be >= 1".into());
        }
        if self.vocab == 0 || self.vocab > MAX_VOCAB {
            return bad("vocab", format!("{} not in 1 ..= {MAX_VOCAB}", self.vocab));
        }
        if self.max_model_len < 2 || i32::try_from(self.max_model_len).is_err() {
            return bad(
                "max_model_len",
                format!("{} not in 2 ..= {}", self.max_model_len, i32::MAX),
            );
        }
        let fits = |a: usize, b: usize| a.checked_mul(b).is_some_and(|n| i32::try_from(n).is_ok());
        if !fits(self.max_bsz, self.max_model_len) || !fits(self.max_bsz, self.max_step_tokens) {
            return bad("max_bsz", "the batch does not fit in i32 indices".into());
        }
        if self.end_tokens.is_empty() {
            return bad("end_tokens", "at least one end token is required".into());
        }
        if let Some(t) = self.end_tokens.iter().find(|&&t| !self.in_vocab(t)) {
            return bad("end_tokens", format!("{t} not in 0 .. {}", self.vocab));
        }
        if self.candidates == 0 || self.candidates > MAX_CANDIDATES {
            return bad(
                "candidates",
                format!("{} not in 1 ..= {MAX_CANDIDATES}", self.candidates),
            );
        }
        if let Some(k) = self.logprobs
            && k > MAX_LOGPROBS_TOP_K
        {
            return bad("logprobs", format!("{k} > {MAX_LOGPROBS_TOP_K}"));
        }
        if let Some(ngram) = &self.ngram {
            ngram.validate()?;
            if self.strategy == Strategy::Rejection && self.is_speculative() {
                return bad(
                    "strategy",
                    "rejection needs the draft model's logits or probabilities, which the n-gram proposer does not have"
                        .into(),
                );
            }
        }
        Ok(())
    }

    pub(crate) fn in_vocab(&self, token: i32) -> bool {
        usize::try_from(token).is_ok_and(|t| t < self.vocab)
    }

    /// The first token of `tokens` outside `0 .. V`, with its index.
    pub(crate) fn first_outside_vocab(&self, tokens: &[i32]) -> Option<(usize, i32)> {
        tokens
            .iter()
            .copied()
            .enumerate()
            .find(|&(_, t)| !self.in_vocab(t))
    }

    /// The batch dimensions of a step over slots `0 .. real_bsz`.
    pub(crate) fn dims(&self, real_bsz: usize) -> BatchDims {
        BatchDims::new(self.max_bsz, real_bsz, self.max_step_tokens)
    }
}

/// Builder setters: each `name(param: Type) => field;` (`=> field` where the field is named
/// otherwise) is a `pub fn name(mut self, param: Type) -> Self` that sets `self.field`, with the
/// doc comment written above it.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($param:ident: $ty:ty) $(=> $field:ident)?;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $param: $ty) -> Self {
                setters!(@set self, $param $(, $field)?);
                self
            }
        )*
    };
    (@set $self:ident, $param:ident) => {
        $self.$param = $param
    };
    (@set $self:ident, $param:ident, $field:ident) => {
        $self.$field = $param
    };
}

/// How a request samples its tokens, by name (as vLLM's `SamplingParams`): build it from
/// [`Default`] with the `with_*` methods and give it to [`Request::with_params`].
///
/// ```
/// use specula_sampler::{Request, SamplingParams};
///
/// let params = SamplingParams::default().with_temperature(0.7).with_top_p(0.9).with_seed(42);
/// let request = Request::new(vec![1, 2, 3]).with_params(params);
/// assert_eq!((request.temperature, request.top_p, request.top_k, request.seed), (0.7, 0.9, 0, 42));
/// assert_eq!(request.params(), params);
/// // Parameters without a seed keep the request's own.
/// let seeded = Request::new(vec![1]).with_seed(7).with_params(SamplingParams::greedy());
/// assert_eq!((seeded.seed, seeded.temperature), (7, 0.0));
/// ```
///
/// The values are checked when the request is inserted ([`Request::validate`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature, ≥ 0; 0 is greedy (one-hot at the argmax). Default 1.
    pub temperature: f32,
    /// Nucleus threshold in `(0, 1]`; 1 keeps every token. Default 1.
    pub top_p: f32,
    /// Keep only the `top_k` most probable tokens; 0 keeps every token. Default 0.
    pub top_k: usize,
    /// The request seed (see [`Request::seed`]), when these parameters set one. `None` (the
    /// default) leaves the request's seed as it is in [`Request::with_params`], so that
    /// `Request::new(p).with_seed(7).with_params(params)` keeps seed 7; a request built without
    /// one has seed 0.
    pub seed: Option<u64>,
    /// Repetition penalty `α > 0` for tokens of the prompt or the history (`docs/semantics.md`
    /// §4c: positive logits are divided by it, the others multiplied). Default 1 (off).
    pub repetition_penalty: f32,
    /// Frequency penalty `β`: subtracted once per occurrence in the history. Default 0 (off).
    pub frequency_penalty: f32,
    /// Presence penalty `γ`: subtracted once from every token of the history. Default 0 (off).
    pub presence_penalty: f32,
    /// `min_p` in `[0, 1]`: tokens whose weight is below `min_p` times the largest are dropped
    /// before top-k and top-p. Default 0 (off).
    pub min_p: f32,
    /// End tokens are masked until this many tokens are generated. Default 0 (off).
    pub min_tokens: usize,
}

impl Default for SamplingParams {
    /// Temperature 1, `top_p` 1, `top_k` 0 (no filter), no seed (the request's own): plain
    /// sampling from the model.
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            min_p: 0.0,
            min_tokens: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: the defaults at temperature 0.
    pub fn greedy() -> Self {
        SamplingParams::default().with_temperature(0.0)
    }

    setters! {
        /// Sets the temperature.
        with_temperature(temperature: f32);

        /// Sets `top_p`.
        with_top_p(top_p: f32);

        /// Sets `top_k`.
        with_top_k(top_k: usize);

        /// Sets the repetition penalty `α` (> 0; 1 is off).
        with_repetition_penalty(alpha: f32) => repetition_penalty;
    }

    /// Sets the seed (see [`seed`](SamplingParams::seed)).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Sets the frequency penalty `β` and the presence penalty `γ` (0 is off).
    pub fn with_frequency_presence(mut self, frequency: f32, presence: f32) -> Self {
        self.frequency_penalty = frequency;
        self.presence_penalty = presence;
        self
    }

    setters! {
        /// Sets `min_p` (in `[0, 1]`; 0 is off).
        with_min_p(min_p: f32);

        /// Sets `min_tokens` (end tokens are masked until this many tokens are generated).
        with_min_tokens(min_tokens: usize);
    }

    /// Whether a logits-processing parameter (`docs/semantics.md` §4c) is on.
    pub fn processes_logits(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
            || self.min_p != 0.0
            || self.min_tokens != 0
    }

    /// Checks the values: `top_p` in `(0, 1]`, `top_k ≤ i32::MAX`, temperature ≥ 0 and not NaN,
    /// the penalties finite with `α > 0`, `min_p` in `[0, 1]`, `min_tokens ≤ i32::MAX`. An error
    /// is [`SamplerError::Request`] naming the field. [`Request::validate`] runs it.
    pub fn validate(&self) -> Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(SamplerError::Request { field, reason });
        if self.top_p.is_nan() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return bad("top_p", format!("{} not in (0, 1]", self.top_p));
        }
        if i32::try_from(self.top_k).is_err() {
            return bad("top_k", format!("{} > {}", self.top_k, i32::MAX));
        }
        if self.temperature.is_nan() || self.temperature < 0.0 {
            return bad(
                "temperature",
                format!("{} is negative or NaN", self.temperature),
            );
        }
        self.validate_processing()
    }

    /// The logits-processing scalars (`docs/semantics.md` §4c).
    fn validate_processing(&self) -> Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(SamplerError::Request { field, reason });
        let alpha = self.repetition_penalty;
        if !alpha.is_finite() || alpha <= 0.0 {
            return bad(
                "repetition_penalty",
                format!("{alpha} is not finite and > 0"),
            );
        }
        for (field, value) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !value.is_finite() {
                return bad(field, format!("{value} is not finite"));
            }
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("{} not in [0, 1]", self.min_p));
        }
        if i32::try_from(self.min_tokens).is_err() {
            return bad("min_tokens", format!("{} > {}", self.min_tokens, i32::MAX));
        }
        Ok(())
    }
}

/// One generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Prompt token ids (at least one, each in `0 .. V`, fewer than `max_model_len`).
    pub prompt: Vec<i32>,
    /// The request seed. It is reduced modulo `MAX_INFER_SEED` on insert; generated token `n`
    /// uses the seed `(seed + 4n) mod MAX_INFER_SEED` (see [`crate::seeds`]).
    pub seed: u64,
    /// Nucleus threshold in `(0, 1]`; 1 keeps every token.
    pub top_p: f32,
    /// Keep only the `top_k` most probable tokens; 0 keeps every token.
    pub top_k: usize,
    /// Softmax temperature, ≥ 0; 0 is greedy (one-hot at the argmax).
    pub temperature: f32,
    /// The most tokens to generate (≥ 1): the request ends with finish reason
    /// [`Length`](crate::FinishReason::Length) after exactly `max_dec_len` real tokens (with
    /// [`SamplerConfig::fastdeploy_max_dec_len`], the last of them is replaced by
    /// `end_tokens[0]`).
    pub max_dec_len: usize,
    /// The most drafts per step for this request; `None` means `S − 1`.
    pub max_draft_tokens: Option<usize>,
    /// Repetition penalty (see [`SamplingParams::repetition_penalty`]).
    pub repetition_penalty: f32,
    /// Frequency penalty (see [`SamplingParams::frequency_penalty`]).
    pub frequency_penalty: f32,
    /// Presence penalty (see [`SamplingParams::presence_penalty`]).
    pub presence_penalty: f32,
    /// `min_p` (see [`SamplingParams::min_p`]).
    pub min_p: f32,
    /// `min_tokens` (see [`SamplingParams::min_tokens`]).
    pub min_tokens: usize,
    /// Logit bias: `(token, value)` pairs added to the logits (`docs/semantics.md` §4c step 1; a
    /// token listed twice takes its last value). Values finite, tokens in `0 .. V`.
    pub logit_bias: Vec<(i32, f32)>,
    /// Bad words: a one-token entry bans its token; a longer entry bans its last token whenever
    /// the history ends with its other tokens. Entries non-empty, tokens in `0 .. V`.
    pub bad_words: Vec<Vec<i32>>,
    /// Only these tokens may be emitted (`None`: no restriction; a given list is non-empty).
    pub allowed_token_ids: Option<Vec<i32>>,
    /// This request's own stop tokens, in `0 .. V` (vLLM's `stop_token_ids`): emitting one ends
    /// it with finish reason [`EndToken`](crate::FinishReason::EndToken), the stop token kept as
    /// its last token. The decoder's [`end_tokens`](SamplerConfig::end_tokens) still end every
    /// request. A stop token among the first `min_tokens` generated tokens does not end the
    /// request (nor is it banned: `min_tokens` bans the decoder's end tokens only).
    pub stop_tokens: Vec<i32>,
    /// `Some(k)`: return each emitted token's log-probability and rank plus its top-`k`
    /// alternatives (`k ≤` the decoder's [`logprobs`](SamplerConfig::logprobs) `K`; 0 gives the
    /// token's own log-probability and rank only). `None`: no log-probabilities.
    pub logprobs: Option<usize>,
}

impl Request {
    /// A request with seed 0, `top_p` 1, `top_k` 0, temperature 1 and `max_dec_len` as large as
    /// the device state allows (`i32::MAX`; `max_model_len` still limits it).
    pub fn new(prompt: Vec<i32>) -> Self {
        let params = SamplingParams::default();
        Request {
            prompt,
            seed: params.seed.unwrap_or(0),
            top_p: params.top_p,
            top_k: params.top_k,
            temperature: params.temperature,
            max_dec_len: i32::MAX as usize,
            max_draft_tokens: None,
            repetition_penalty: params.repetition_penalty,
            frequency_penalty: params.frequency_penalty,
            presence_penalty: params.presence_penalty,
            min_p: params.min_p,
            min_tokens: params.min_tokens,
            logit_bias: Vec::new(),
            bad_words: Vec::new(),
            allowed_token_ids: None,
            stop_tokens: Vec::new(),
            logprobs: None,
        }
    }

    /// Sets every field of `params`; the seed only when `params` sets one
    /// ([`SamplingParams::with_seed`]), so a seed set before (with
    /// [`with_seed`](Request::with_seed)) stays unless `params` gives another.
    pub fn with_params(mut self, params: SamplingParams) -> Self {
        self.temperature = params.temperature;
        self.top_p = params.top_p;
        self.top_k = params.top_k;
        if let Some(seed) = params.seed {
            self.seed = seed;
        }
        self.repetition_penalty = params.repetition_penalty;
        self.frequency_penalty = params.frequency_penalty;
        self.presence_penalty = params.presence_penalty;
        self.min_p = params.min_p;
        self.min_tokens = params.min_tokens;
        self
    }

    /// The request's sampling parameters (its seed included).
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: Some(self.seed),
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            min_p: self.min_p,
            min_tokens: self.min_tokens,
        }
    }

    setters! {
        /// Sets the logit bias (`(token, value)` pairs).
        with_logit_bias(bias: Vec<(i32, f32)>) => logit_bias;

        /// Sets the bad words (token sequences).
        with_bad_words(bad_words: Vec<Vec<i32>>);
    }

    /// Restricts the emitted tokens to `allowed`.
    pub fn with_allowed_token_ids(mut self, allowed: Vec<i32>) -> Self {
        self.allowed_token_ids = Some(allowed);
        self
    }

    /// Whether the request uses logits processing (`docs/semantics.md` §4c): a penalty, min_p,
    /// min_tokens, a bias, bad words or allowed tokens.
    pub fn processes_logits(&self) -> bool {
        self.params().processes_logits()
            || !self.logit_bias.is_empty()
            || !self.bad_words.is_empty()
            || self.allowed_token_ids.is_some()
    }

    setters! {
        /// Sets the seed.
        with_seed(seed: u64);
    }

    /// Sets `top_p`, `top_k` and the temperature, by position (easy to swap).
    #[deprecated(note = "positional (top_p, top_k, temperature) is easy to swap: use \
                `with_params(SamplingParams::default().with_top_p(..).with_top_k(..).with_temperature(..))`")]
    pub fn with_sampling(mut self, top_p: f32, top_k: usize, temperature: f32) -> Self {
        self.top_p = top_p;
        self.top_k = top_k;
        self.temperature = temperature;
        self
    }

    setters! {
        /// Sets `max_dec_len`: the request ends after exactly that many tokens, finish reason
        /// [`Length`](crate::FinishReason::Length).
        with_max_dec_len(max_dec_len: usize);

        /// Sets the request's own stop tokens (see [`stop_tokens`](Request::stop_tokens)); the
        /// decoder's end tokens still apply.
        with_stop_tokens(stop_tokens: Vec<i32>);
    }

    /// Asks for the log-probability of each emitted token with its top-`k` alternatives (`k ≤`
    /// the decoder's [`SamplerConfig::logprobs`], checked on insert).
    pub fn with_logprobs(mut self, k: usize) -> Self {
        self.logprobs = Some(k);
        self
    }

    /// Whether `token` ends this request on the host when it is generated token number
    /// `count` (1-based): one of its stop tokens past `min_tokens`.
    pub(crate) fn stops_at(&self, token: i32, count: usize) -> bool {
        count > self.min_tokens && self.stop_tokens.contains(&token)
    }

    /// Checks the request against a configuration: the prompt, the sampling parameters
    /// ([`SamplingParams::validate`]), `max_dec_len`, `max_draft_tokens`, `logprobs` (at most
    /// the decoder's `K`) and the token lists (`stop_tokens`, the bias, bad words and allowed
    /// tokens in `0 .. V`). An error is [`SamplerError::Request`] naming the field.
    pub fn validate(&self, config: &SamplerConfig) -> Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(SamplerError::Request { field, reason });
        if self.prompt.is_empty() {
            return bad("prompt", "must have at least one token".into());
        }
        if self.prompt.len() >= config.max_model_len {
            return bad(
                "prompt",
                format!(
                    "{} tokens leave no room below max_model_len {}",
                    self.prompt.len(),
                    config.max_model_len
                ),
            );
        }
        if let Some((i, t)) = config.first_outside_vocab(&self.prompt) {
            return bad(
                "prompt",
                format!("token {i} = {t} not in 0 .. {}", config.vocab),
            );
        }
        self.params().validate()?;
        if self.max_dec_len == 0 || i32::try_from(self.max_dec_len).is_err() {
            return bad(
                "max_dec_len",
                format!("{} not in 1 ..= {}", self.max_dec_len, i32::MAX),
            );
        }
        if let Some(d) = self.max_draft_tokens
            && i32::try_from(d).is_err()
        {
            return bad("max_draft_tokens", format!("{d} > {}", i32::MAX));
        }
        match (self.logprobs, config.logprobs) {
            (Some(k), None) => {
                return bad(
                    "logprobs",
                    format!(
                        "{k} asked for, but the decoder computes none (SamplerConfig::logprobs is None)"
                    ),
                );
            }
            (Some(k), Some(max)) if k > max => {
                return bad(
                    "logprobs",
                    format!("{k} > the decoder's SamplerConfig::logprobs K = {max}"),
                );
            }
            _ => {}
        }
        self.validate_lists(config)
    }

    /// The token lists: ids in `0 .. V`, finite bias values, non-empty bad words and allowed list.
    fn validate_lists(&self, config: &SamplerConfig) -> Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(SamplerError::Request { field, reason });
        let vocab = config.vocab;
        if let Some((i, t)) = config.first_outside_vocab(&self.stop_tokens) {
            return bad(
                "stop_tokens",
                format!("entry {i}: token {t} not in 0 .. {vocab}"),
            );
        }
        for (i, &(t, value)) in self.logit_bias.iter().enumerate() {
            if !config.in_vocab(t) {
                return bad(
                    "logit_bias",
                    format!("entry {i}: token {t} not in 0 .. {vocab}"),
                );
            }
            if !value.is_finite() {
                return bad(
                    "logit_bias",
                    format!("entry {i}: value {value} is not finite"),
                );
            }
        }
        for (i, word) in self.bad_words.iter().enumerate() {
            if word.is_empty() {
                return bad("bad_words", format!("entry {i} is empty"));
            }
            if let Some(t) = word.iter().find(|t| !config.in_vocab(**t)) {
                return bad(
                    "bad_words",
                    format!("entry {i}: token {t} not in 0 .. {vocab}"),
                );
            }
        }
        if let Some(allowed) = &self.allowed_token_ids {
            if allowed.is_empty() {
                return bad(
                    "allowed_token_ids",
                    "is empty: no token could be emitted".into(),
                );
            }
            if let Some(t) = allowed.iter().find(|t| !config.in_vocab(**t)) {
                return bad(
                    "allowed_token_ids",
                    format!("token {t} not in 0 .. {vocab}"),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_params_default_to_a_new_requests_values() {
        let request = Request::new(vec![1]);
        // A request's parameters carry its seed; the defaults leave the request's seed as it is.
        let params = request.params();
        assert_eq!(params.seed, Some(0));
        assert_eq!(
            SamplingParams {
                seed: None,
                ..params
            },
            SamplingParams::default()
        );
        assert_eq!(SamplingParams::greedy().temperature, 0.0);
    }

    #[test]
    fn with_params_sets_every_field_by_name() {
        let params = SamplingParams::default()
            .with_temperature(0.7)
            .with_top_p(0.9)
            .with_top_k(5)
            .with_seed(11);
        let request = Request::new(vec![1]).with_seed(3).with_params(params);
        assert_eq!(
            (
                request.temperature,
                request.top_p,
                request.top_k,
                request.seed
            ),
            (0.7, 0.9, 5, 11)
        );
        assert_eq!(request.params(), params);
        #[allow(deprecated)]
        let positional = Request::new(vec![1])
            .with_seed(11)
            .with_sampling(0.9, 5, 0.7);
        assert_eq!(positional, request);
    }

    #[test]
    fn each_decoding_mode_has_a_builder() {
        let plain = SamplerConfig::plain(Strategy::TargetMatch, 2, 16, 32, vec![0]);
        assert_eq!(
            plain,
            SamplerConfig::new(Strategy::TargetMatch, 2, 16, 32, vec![0])
        );
        assert!(!plain.is_speculative() && plain.ngram.is_none());
        let ngram = plain.clone().with_ngram(4, NgramConfig::default());
        assert_eq!((ngram.max_step_tokens, ngram.ngram.is_some()), (4, true));
        let drafts = ngram.clone().with_runner_drafts(3);
        assert_eq!((drafts.max_step_tokens, drafts.ngram), (3, None));
        assert_eq!(drafts.strategy, Strategy::TargetMatch);
        let rejection = SamplerConfig::rejection(2, 16, 32, vec![0], 5);
        assert_eq!(rejection.strategy, Strategy::Rejection);
        assert_eq!((rejection.max_step_tokens, rejection.ngram), (5, None));
        #[allow(deprecated)]
        let replaced = ngram.with_rejection(5);
        assert_eq!(replaced, rejection);
        for config in [plain, drafts, rejection] {
            config.validate().expect("valid");
        }
        let bad = SamplerConfig::plain(Strategy::Rejection, 2, 16, 32, vec![0])
            .with_ngram(4, NgramConfig::default());
        assert!(matches!(
            bad.validate(),
            Err(SamplerError::Config {
                field: "strategy",
                ..
            })
        ));
    }

    #[test]
    fn sampling_params_are_validated_with_the_request() {
        let config = SamplerConfig::new(Strategy::Greedy, 1, 16, 8, vec![0]);
        let field = |params: SamplingParams| match Request::new(vec![1])
            .with_params(params)
            .validate(&config)
        {
            Err(SamplerError::Request { field, .. }) => Some(field),
            _ => None,
        };
        let default = SamplingParams::default();
        assert_eq!(field(default), None);
        assert_eq!(field(default.with_top_p(0.0)), Some("top_p"));
        assert_eq!(field(default.with_top_p(f32::NAN)), Some("top_p"));
        assert_eq!(field(default.with_top_k(usize::MAX)), Some("top_k"));
        assert_eq!(field(default.with_temperature(-1.0)), Some("temperature"));
        assert!(default.with_temperature(-1.0).validate().is_err());
    }
}
