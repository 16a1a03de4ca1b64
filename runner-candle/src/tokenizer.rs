//! The model's tokenizer, built from the GGUF file's own metadata with the `tokenizers` crate,
//! and a decoder that streams text token by token.
//!
//! A GGUF file of a byte-level BPE model (`tokenizer.ggml.model = gpt2`) carries the vocabulary
//! (`tokenizer.ggml.tokens`), the merges (`tokenizer.ggml.merges`), each token's type
//! (`tokenizer.ggml.token_type`: control and user-defined tokens are matched whole in the text)
//! and the special ids. The pre-tokenizer is chosen by `tokenizer.ggml.pre`: `smollm` (and the
//! other StarCoder-style vocabularies) split digits one by one before GPT-2's byte-level split.

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper};

use crate::config::{optional_integer, string};
use crate::error::{Result, RunnerError};

/// GGUF token types (`tokenizer.ggml.token_type`) matched whole in the text.
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// The pre-tokenizers (`tokenizer.ggml.pre`) whose byte-level split first splits every digit.
const DIGIT_SPLITTING: &[&str] = &["smollm", "starcoder", "refact", "codeshell"];

/// A byte-level BPE tokenizer with the model's special tokens.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    vocab: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.vocab)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata.
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let bad = |reason: String| RunnerError::Tokenizer(reason);
        let model = string(content, "tokenizer.ggml.model").map_err(bad)?;
        if model != "gpt2" {
            return Err(bad(format!(
                "tokenizer.ggml.model is {model:?}; only byte-level BPE (gpt2) is supported"
            )));
        }
        let tokens = string_array(content, "tokenizer.ggml.tokens")?;
        let merges = string_array(content, "tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| bad(format!("merge {m:?} is not two tokens")))
            })
            .collect::<Result<Vec<_>>>()?;
        let vocab: Vocab = (0u32..)
            .zip(tokens.iter())
            .map(|(i, t)| (t.to_string(), i))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| bad(format!("BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let pre = string(content, "tokenizer.ggml.pre").unwrap_or("default");
        let byte_level = ByteLevel::new(false, true, true);
        let pre_tokenizer: PreTokenizerWrapper = match DIGIT_SPLITTING.contains(&pre) {
            true => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
            false => byte_level.into(),
        };
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let special: Vec<AddedToken> = token_types(content, tokens.len())?
            .into_iter()
            .zip(&tokens)
            .filter(|(kind, _)| matches!(*kind, CONTROL | USER_DEFINED))
            .map(|(_, token)| AddedToken::from(token.to_string(), true))
            .collect();
        inner.add_special_tokens(&special);
        let id = |key: &str| -> Result<Option<u32>> {
            optional_integer(content, key)
                .map_err(bad)?
                .map(|id| u32::try_from(id).map_err(|_| bad(format!("{key} {id} overflows u32"))))
                .transpose()
        };
        Ok(Tokenizer {
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            vocab: tokens.len(),
            inner,
        })
    }

    /// The token ids of `text`; special tokens written in the text (`<|im_start|>`) are matched
    /// whole. No BOS is added (the model's `add_bos_token` is false).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| RunnerError::Tokenizer(format!("encoding: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`; with `skip_special`, control tokens are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| RunnerError::Tokenizer(format!("decoding: {e}")))
    }

    /// The id of a token by its text, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The beginning-of-sequence id.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence id.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Vocabulary size (the number of tokens in the metadata).
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

/// Streams the text of a growing token sequence: each [`push`](TextStream::push) returns the
/// text the new token completes, holding back bytes of a character split across tokens (a
/// multi-byte UTF-8 character whose bytes come in several byte-level tokens) until it is whole.
/// Concatenating every `push` and the final [`finish`](TextStream::finish) gives the decoded text
/// of all the tokens.
#[derive(Debug, Default)]
pub struct TextStream {
    tokens: Vec<u32>,
    /// Start of the window decoded each time (tokens before it are printed and done).
    window: usize,
    /// Bytes of the window's text already returned.
    printed: usize,
}

impl TextStream {
    /// An empty stream.
    pub fn new() -> Self {
        TextStream::default()
    }

    /// Adds a token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String> {
        self.tokens.push(token);
        let text = tokenizer.decode(&self.tokens[self.window..], true)?;
        // A trailing U+FFFD is an incomplete character: wait for its next bytes.
        let complete = text.trim_end_matches('\u{FFFD}');
        let new = match complete.get(self.printed..) {
            Some(new) if complete.len() > self.printed => new.to_string(),
            _ => return Ok(String::new()),
        };
        if complete.len() == text.len() {
            // Everything decoded is whole: later tokens cannot change it, start a new window.
            self.window = self.tokens.len();
            self.printed = 0;
        } else {
            self.printed = complete.len();
        }
        Ok(new)
    }

    /// The text held back at the end (an incomplete character, decoded as U+FFFD).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let text = tokenizer.decode(&self.tokens[self.window..], true)?;
        let rest = text.get(self.printed..).unwrap_or_default().to_string();
        self.window = self.tokens.len();
        self.printed = 0;
        Ok(rest)
    }
}

/// A metadata array of strings.
fn string_array<'a>(content: &'a Content, key: &str) -> Result<Vec<&'a str>> {
    let bad = |reason: String| RunnerError::Tokenizer(reason);
    match content.metadata.get(key) {
        Some(Value::Array(values)) => values
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                other => Err(bad(format!("{key} holds {other:?}, not a string"))),
            })
            .collect(),
        Some(other) => Err(bad(format!("{key} is {other:?}, not an array"))),
        None => Err(bad(format!("missing {key}"))),
    }
}

/// The type of every token (`tokenizer.ggml.token_type`; all normal when absent).
fn token_types(content: &Content, n: usize) -> Result<Vec<i32>> {
    let bad = |reason: String| RunnerError::Tokenizer(reason);
    match content.metadata.get("tokenizer.ggml.token_type") {
        None => Ok(vec![1; n]),
        Some(Value::Array(values)) if values.len() == n => values
            .iter()
            .map(|v| match v {
                Value::I32(t) => Ok(*t),
                Value::U32(t) => i32::try_from(*t).map_err(|_| bad(format!("token type {t}"))),
                other => Err(bad(format!("token type {other:?}"))),
            })
            .collect(),
        Some(_) => Err(bad(format!(
            "tokenizer.ggml.token_type is not an array of {n} integers"
        ))),
    }
}
