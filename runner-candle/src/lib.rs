//! # specula-runner-candle
//!
//! A complete runner around Specula: a real language model — SmolLM2-135M-Instruct, a llama of
//! 30 layers in a 4-bit GGUF file — run with [candle](https://github.com/huggingface/candle) on
//! the CPU, its logits sampled by a Specula [`Decoder`](specula_sampler::Decoder) on any backend
//! (`cpu`, `wgpu`, `xpu-sim`, `cuda`), plainly or speculatively with the n-gram proposer. It is the
//! worked example of `docs/runner.md`, and the `specula-generate` command.
//!
//! - [`model`] and [`attention`]: the llama forward pass on candle ops, over a per-request [`KvCache`] that is cut
//!   back when drafts are rejected; batch-invariant, so speculative decoding emits exactly the
//!   tokens of plain decoding;
//! - [`qmatmul`]: the runner's own matmul for the Q4_1 weights — candle's bits, with AVX2 and
//!   the weights read once per step whatever its number of tokens;
//! - [`tokenizer`]: the byte-level BPE tokenizer built from the GGUF metadata (`tokenizers`), and
//!   [`TextStream`], which streams text across tokens that split a character;
//! - [`chat`]: the model's chat template (`minijinja`);
//! - [`engine`]: the step loop — continuous batching, one forward call per request per step,
//!   the logits handed to Specula with `borrow_host`;
//! - [`fetch`]: the default model, cached outside the repository and fetched on first use.
//!
//! ```no_run
//! use specula_runner_candle::{Model, engine::Engine, fetch};
//! use specula_sampler::{NgramConfig, Request, SamplerConfig, SamplingParams, Strategy, registry};
//!
//! let model = Model::load(&fetch::ensure_default_model()?)?;
//! let prompt = model.tokenizer.encode("The capital of France is")?;
//! let config = SamplerConfig::plain(Strategy::TargetMatch, 1, model.vocab(), 512, model.end_tokens())
//!     .with_ngram(6, NgramConfig::default());
//! let mut engine = Engine::new(&model.llama, registry::open("cpu")?, config)?;
//! let request = Request::new(prompt.iter().map(|&t| t as i32).collect())
//!     .with_params(SamplingParams::greedy())
//!     .with_max_dec_len(8);
//! let output = engine.run(vec![request], |_| {})?;
//! let text = model.tokenizer.decode(&model.ids(&output.generated[0]), true)?;
//! assert!(text.starts_with(" Paris"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod attention;
pub mod chat;
pub mod config;
pub mod draft_length;
pub mod engine;
pub mod error;
pub mod fetch;
pub mod kv_cache;
pub mod model;
pub mod qmatmul;
pub mod tokenizer;

use std::path::{Path, PathBuf};

pub use chat::{ChatTemplate, Message};
pub use config::LlamaConfig;
pub use error::{Result, RunnerError};
pub use kv_cache::KvCache;
pub use model::Llama;
pub use tokenizer::{TextStream, Tokenizer};

/// The texts of the tokens that end a turn besides the end-of-sequence token.
const END_OF_TURN: &[&str] = &["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>"];

/// A model file loaded: weights, tokenizer and chat template.
#[derive(Debug)]
pub struct Model {
    /// Where it was loaded from.
    pub path: PathBuf,
    /// The weights and the forward pass.
    pub llama: Llama,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, when the file has one.
    pub chat_template: Option<ChatTemplate>,
}

impl Model {
    /// Loads a GGUF llama model: its metadata, weights, tokenizer and chat template. A missing
    /// or unreadable file is [`RunnerError::ModelMissing`] / [`RunnerError::ModelInvalid`].
    pub fn load(path: &Path) -> Result<Self> {
        let content = model::read_gguf(path)?;
        let invalid = |reason: String| RunnerError::ModelInvalid {
            path: path.to_path_buf(),
            reason,
        };
        let config = LlamaConfig::from_gguf(&content).map_err(invalid)?;
        let tokenizer = Tokenizer::from_gguf(&content)?;
        if tokenizer.vocab() != config.vocab {
            return Err(invalid(format!(
                "the tokenizer has {} tokens, the model {}",
                tokenizer.vocab(),
                config.vocab
            )));
        }
        let chat_template = match config::string(&content, "tokenizer.chat_template") {
            Ok(source) => {
                let text = |id: Option<u32>| match id {
                    Some(id) => tokenizer.decode(&[id], false),
                    None => Ok(String::new()),
                };
                Some(ChatTemplate::new(
                    source,
                    &text(tokenizer.bos())?,
                    &text(tokenizer.eos())?,
                )?)
            }
            Err(_) => None,
        };
        let llama = Llama::load(path, &content, config)?;
        Ok(Model {
            path: path.to_path_buf(),
            llama,
            tokenizer,
            chat_template,
        })
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.llama.config().vocab
    }

    /// The context length.
    pub fn context(&self) -> usize {
        self.llama.max_positions()
    }

    /// The tokens that end a request: the end-of-sequence token first (what Specula emits where
    /// it fabricates a token), then the end-of-turn tokens the vocabulary has (`<|im_end|>`,
    /// `<|endoftext|>`, ...).
    pub fn end_tokens(&self) -> Vec<i32> {
        let mut ends: Vec<i32> = Vec::new();
        let ids = self.tokenizer.eos().into_iter().chain(
            END_OF_TURN
                .iter()
                .filter_map(|t| self.tokenizer.token_id(t)),
        );
        for id in ids {
            if let Ok(id) = i32::try_from(id)
                && !ends.contains(&id)
            {
                ends.push(id);
            }
        }
        if ends.is_empty() {
            // A model without an end token: an id it never emits is no worse than none.
            ends.push(0);
        }
        ends
    }

    /// The token ids of a prompt: its text, or with `chat` its text as a user message in the
    /// model's chat template.
    pub fn prompt(&self, text: &str, chat: bool) -> Result<Vec<i32>> {
        let text = match chat {
            false => text.to_string(),
            true => match &self.chat_template {
                Some(template) => template.render(&[Message::user(text)])?,
                None => {
                    return Err(RunnerError::ChatTemplate(
                        "the model file has no tokenizer.chat_template".into(),
                    ));
                }
            },
        };
        Ok(self
            .tokenizer
            .encode(&text)?
            .into_iter()
            .map(|t| t as i32)
            .collect())
    }

    /// Token ids as the tokenizer takes them (ids outside `u32` are dropped).
    pub fn ids(&self, tokens: &[i32]) -> Vec<u32> {
        tokens
            .iter()
            .filter_map(|&t| u32::try_from(t).ok())
            .collect()
    }
}
