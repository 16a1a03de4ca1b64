//! The model's hyper-parameters, read from the GGUF metadata (`llama.*` keys).

use candle_core::quantized::gguf_file::{Content, Value};

/// The longest context this runner accepts (its RoPE table holds every position).
pub const MAX_CONTEXT: usize = 1 << 17;

/// The shape of a llama model, as its GGUF file describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks (`llama.block_count`).
    pub n_layer: usize,
    /// Hidden size (`llama.embedding_length`).
    pub n_embd: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_head: usize,
    /// Inner size of the MLP (`llama.feed_forward_length`).
    pub n_ff: usize,
    /// Key/value heads (`llama.attention.head_count_kv`): grouped-query attention shares each
    /// among `n_head / n_kv_head` query heads.
    pub n_kv_head: usize,
    /// Size of one head (`n_embd / n_head`).
    pub head_dim: usize,
    /// Dimensions rotated by RoPE (`llama.rope.dimension_count`, defaults to `head_dim`).
    pub rope_dim: usize,
    /// RoPE base frequency (`llama.rope.freq_base`, defaults to 10000).
    pub rope_freq_base: f32,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Context length the model was trained for (`llama.context_length`).
    pub context_length: usize,
    /// Vocabulary size (`llama.vocab_size`, else the length of `tokenizer.ggml.tokens`).
    pub vocab: usize,
}

impl LlamaConfig {
    /// Reads the hyper-parameters of a `general.architecture = llama` file. Errors name the key.
    pub fn from_gguf(content: &Content) -> Result<Self, String> {
        let architecture = string(content, "general.architecture")?;
        if architecture != "llama" {
            return Err(format!(
                "general.architecture is {architecture:?}; this runner runs llama models"
            ));
        }
        let n_embd = integer(content, "llama.embedding_length")?;
        let n_head = integer(content, "llama.attention.head_count")?;
        let n_kv_head = integer(content, "llama.attention.head_count_kv")?;
        if n_head == 0 || n_kv_head == 0 || n_embd % n_head != 0 || n_head % n_kv_head != 0 {
            return Err(format!(
                "inconsistent heads: embedding_length {n_embd}, head_count {n_head}, head_count_kv {n_kv_head}"
            ));
        }
        let head_dim = n_embd / n_head;
        let rope_dim = optional_integer(content, "llama.rope.dimension_count")?.unwrap_or(head_dim);
        if rope_dim != head_dim {
            return Err(format!(
                "llama.rope.dimension_count {rope_dim} differs from the head size {head_dim} (partial RoPE is not supported)"
            ));
        }
        let vocab = match optional_integer(content, "llama.vocab_size")? {
            Some(v) => v,
            None => match content.metadata.get("tokenizer.ggml.tokens") {
                Some(Value::Array(tokens)) => tokens.len(),
                _ => return Err("neither llama.vocab_size nor tokenizer.ggml.tokens".into()),
            },
        };
        let config = LlamaConfig {
            n_layer: integer(content, "llama.block_count")?,
            n_embd,
            n_ff: integer(content, "llama.feed_forward_length")?,
            n_head,
            n_kv_head,
            head_dim,
            rope_dim,
            rope_freq_base: optional_float(content, "llama.rope.freq_base")?.unwrap_or(10_000.0),
            rms_eps: optional_float(content, "llama.attention.layer_norm_rms_epsilon")?
                .ok_or("missing llama.attention.layer_norm_rms_epsilon")?,
            context_length: integer(content, "llama.context_length")?,
            vocab,
        };
        config.check_bounds()?;
        Ok(config)
    }

    /// Refuses sizes no model of this runner has (so no size computed from them overflows).
    fn check_bounds(&self) -> Result<(), String> {
        let bounds = [
            ("llama.block_count", self.n_layer, 1 << 10),
            ("llama.embedding_length", self.n_embd, 1 << 16),
            ("llama.feed_forward_length", self.n_ff, 1 << 18),
            ("llama.context_length", self.context_length, MAX_CONTEXT),
            ("llama.vocab_size", self.vocab, 1 << 20),
        ];
        for (key, value, max) in bounds {
            if value == 0 || value > max {
                return Err(format!("{key} {value} not in 1 ..= {max}"));
            }
        }
        if !(self.rope_freq_base.is_finite() && self.rope_freq_base > 0.0) {
            return Err(format!(
                "llama.rope.freq_base {} is not a positive number",
                self.rope_freq_base
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return Err(format!(
                "llama.attention.layer_norm_rms_epsilon {} is not a positive number",
                self.rms_eps
            ));
        }
        Ok(())
    }

    /// The shape of each weight this runner reads, as candle reports GGUF shapes (outermost
    /// first): `None` for a tensor this runner does not know.
    pub fn weight_shape(&self, name: &str) -> Option<Vec<usize>> {
        let (embd, kv) = (self.n_embd, self.n_kv_head * self.head_dim);
        let kind = name.rsplit('.').nth(1)?;
        Some(match kind {
            "token_embd" | "output" => vec![self.vocab, embd],
            "attn_q" | "attn_output" => vec![embd, embd],
            "attn_k" | "attn_v" => vec![kv, embd],
            "ffn_gate" | "ffn_up" => vec![self.n_ff, embd],
            "ffn_down" => vec![embd, self.n_ff],
            "attn_norm" | "ffn_norm" | "output_norm" => vec![embd],
            _ => return None,
        })
    }
}

/// A string value of the metadata.
pub(crate) fn string<'a>(content: &'a Content, key: &str) -> Result<&'a str, String> {
    match content.metadata.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("{key} is {other:?}, not a string")),
        None => Err(format!("missing {key}")),
    }
}

/// A required unsigned integer of the metadata.
pub(crate) fn integer(content: &Content, key: &str) -> Result<usize, String> {
    optional_integer(content, key)?.ok_or_else(|| format!("missing {key}"))
}

/// An optional unsigned integer of the metadata (any integer type the writer chose).
pub(crate) fn optional_integer(content: &Content, key: &str) -> Result<Option<usize>, String> {
    let Some(value) = content.metadata.get(key) else {
        return Ok(None);
    };
    let wide = match value {
        Value::U8(v) => Some(u64::from(*v)),
        Value::U16(v) => Some(u64::from(*v)),
        Value::U32(v) => Some(u64::from(*v)),
        Value::U64(v) => Some(*v),
        Value::I8(v) => u64::try_from(*v).ok(),
        Value::I16(v) => u64::try_from(*v).ok(),
        Value::I32(v) => u64::try_from(*v).ok(),
        Value::I64(v) => u64::try_from(*v).ok(),
        _ => None,
    };
    wide.and_then(|v| usize::try_from(v).ok())
        .map(Some)
        .ok_or_else(|| format!("{key} is {value:?}, not a non-negative integer"))
}

/// An optional float of the metadata.
fn optional_float(content: &Content, key: &str) -> Result<Option<f32>, String> {
    match content.metadata.get(key) {
        None => Ok(None),
        Some(Value::F32(v)) => Ok(Some(*v)),
        Some(Value::F64(v)) => Ok(Some(*v as f32)),
        Some(other) => Err(format!("{key} is {other:?}, not a float")),
    }
}
