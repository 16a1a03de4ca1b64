//! The runner's typed errors: each one a clear message for the user of `specula-generate`.

use std::path::PathBuf;

/// What can go wrong in the runner, from fetching the model to the last decoding step.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The model file is missing.
    #[error(
        "model file {path} not found (run `bash ci/fetch-model.sh`, or leave --model out to fetch the default model)"
    )]
    ModelMissing {
        /// The path that was tried.
        path: PathBuf,
    },
    /// The model file cannot be read as a GGUF file of a llama model this runner supports.
    #[error("model file {path} is not a usable GGUF llama model: {reason}")]
    ModelInvalid {
        /// The model file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Fetching the default model failed.
    #[error("fetching the model failed: {0}")]
    Fetch(String),
    /// The tokenizer could not be built from the model's metadata, or failed on a text.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be rendered.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A prompt does not leave room for one generated token in the model's context.
    #[error(
        "prompt {index} is {tokens} tokens long: the context holds {context} (prompt plus generated tokens)"
    )]
    PromptTooLong {
        /// Which prompt (0-based, in the order given).
        index: usize,
        /// Its length in tokens.
        tokens: usize,
        /// The context length.
        context: usize,
    },
    /// A prompt is empty (no token to predict from).
    #[error("prompt {index} is empty")]
    EmptyPrompt {
        /// Which prompt.
        index: usize,
    },
    /// An argument the runner was given is out of range.
    #[error("invalid {argument}: {reason}")]
    InvalidArgument {
        /// The argument (a flag name for the command).
        argument: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// The model's forward pass failed.
    #[error("forward pass: {0}")]
    Forward(#[from] candle_core::Error),
    /// Specula refused a call or a backend failed.
    #[error("specula: {0}")]
    Sampler(#[from] specula_sampler::SamplerError),
    /// A Specula device operation failed.
    #[error("specula device: {0}")]
    Device(#[from] specula_backend_api::Error),
    /// A request produced no token in a step without finishing (a broken invariant of the
    /// decoder, reported rather than looped on).
    #[error("request {index} emitted nothing in a step and did not finish")]
    Stalled {
        /// The request.
        index: usize,
    },
    /// The decoder's plan and the engine's state disagree (a bug, reported rather than run).
    #[error("internal: {0}")]
    Internal(String),
    /// Reading or writing a file.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The runner's result type.
pub type Result<T, E = RunnerError> = std::result::Result<T, E>;

impl RunnerError {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        RunnerError::Io {
            context: context.into(),
            source,
        }
    }

    /// A refused argument.
    pub fn argument(argument: &'static str, reason: impl Into<String>) -> Self {
        RunnerError::InvalidArgument {
            argument,
            reason: reason.into(),
        }
    }
}
