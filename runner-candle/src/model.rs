//! A llama forward pass on candle ops, over a per-request [`KvCache`] that can be cut back.
//!
//! The layers are those of `candle_transformers::models::quantized_llama`, written op for op in
//! the same order — quantized matmuls ([`Linear`]: the runner's own [`Q4_1Matrix`] for the Q4_1
//! weights, the same bits as candle's `QMatMul` faster; `QMatMul` for the others), RMSNorm,
//! interleaved RoPE (base from the metadata: 100000 for SmolLM2), grouped-query attention (9
//! query heads over 3 key/value heads), a SiLU-gated MLP — except the attention itself (see below). What differs is what a
//! speculative runner needs:
//!
//! - the KV cache belongs to the request, and [`KvCache::truncate`] drops rejected drafts;
//! - [`Llama::forward`] returns the logits of every fed position asked for (the last token and
//!   each draft), not only the last one;
//! - the model is shared (`&self`): any number of requests run against one copy of the weights.
//!
//! **Batch invariance.** Every op computes a row (a position) from that row alone, in an order
//! that does not depend on how many rows the call has: the quantized matmuls quantize and dot
//! each row on its own (the generic `k_quants` path, which Q8_0 weights of width 576 take, and
//! [`Q4_1Matrix`], which accumulates each row's blocks in that path's order); RMSNorm, RoPE and SiLU work per row; and the attention is
//! [`attention::attend`], one (row, head) at a time in a fixed order, because
//! candle's matmul is not batch-invariant for `q · kᵀ`. So the logits of a position are the same
//! bits whether it is fed alone, inside a step of several tokens, or in one pass over the whole
//! prefix (`tests/model.rs`) — what makes speculative decoding emit exactly the tokens of plain
//! decoding on a real model (contract principle 4). Against `quantized_llama` (candle's matmul
//! attention) the logits agree to a stated tolerance, not bit for bit (`tests/model.rs`).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device, IndexOp, Module, Result, Tensor};
use candle_nn::Embedding;

use crate::attention::{self, Heads};
use crate::config::LlamaConfig;
use crate::error::RunnerError;
use crate::kv_cache::KvCache;
#[cfg(doc)]
use crate::qmatmul::Q4_1Matrix;
use crate::qmatmul::{Linear, MatmulKernel, Projections};

/// One transformer block's weights.
#[derive(Debug)]
struct Layer {
    /// Query, key and value projections.
    attn_qkv: Projections,
    attn_output: Linear,
    attn_norm: Tensor,
    /// Gate and up projections.
    ffn_gate_up: Projections,
    ffn_down: Linear,
    ffn_norm: Tensor,
}

/// A llama model loaded from a GGUF file: quantized weights and the RoPE tables.
#[derive(Debug)]
pub struct Llama {
    config: LlamaConfig,
    device: Device,
    embeddings: Embedding,
    layers: Vec<Layer>,
    output_norm: Tensor,
    output: Linear,
    /// `[max_positions, rope_dim / 2]` cosines and sines of RoPE.
    cos: Tensor,
    sin: Tensor,
}

impl Llama {
    /// Loads the weights of `content` (read from `path`) on the CPU, the Q4_1 ones for the
    /// runner's own matmul.
    pub fn load(
        path: &Path,
        content: &Content,
        config: LlamaConfig,
    ) -> std::result::Result<Self, RunnerError> {
        Self::load_with(path, content, config, MatmulKernel::Runner)
    }

    /// [`Llama::load`], with the Q4_1 weights' matmul chosen (`MatmulKernel::Candle`: candle's
    /// `QMatMul` everywhere, the same logits, slower; for comparisons).
    pub fn load_with(
        path: &Path,
        content: &Content,
        config: LlamaConfig,
        kernel: MatmulKernel,
    ) -> std::result::Result<Self, RunnerError> {
        let invalid = |reason: String| RunnerError::ModelInvalid {
            path: path.to_path_buf(),
            reason,
        };
        let file = File::open(path)
            .map_err(|e| RunnerError::io(format!("opening {}", path.display()), e))?;
        let mut reader = BufReader::new(file);
        let device = Device::Cpu;
        let mut tensor = |name: &str| -> std::result::Result<QTensor, RunnerError> {
            let info = content
                .tensor_infos
                .get(name)
                .ok_or_else(|| invalid(format!("no tensor {name}")))?;
            let expected = config.weight_shape(name);
            if expected.as_deref() != Some(info.shape.dims()) {
                return Err(invalid(format!(
                    "tensor {name} has shape {:?}, the metadata implies {expected:?}",
                    info.shape.dims()
                )));
            }
            content
                .tensor(&mut reader, name, &device)
                .map_err(|e| invalid(format!("tensor {name}: {e}")))
        };
        let token_embd = tensor("token_embd.weight")?;
        let embeddings = token_embd
            .dequantize(&device)
            .map_err(|e| invalid(e.to_string()))?;
        let output = match content.tensor_infos.contains_key("output.weight") {
            true => tensor("output.weight")?,
            false => token_embd, // tied embeddings
        };
        let output_norm = dequantized(tensor("output_norm.weight")?, &device)?;
        let mut layers = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let mut weight = |name: &str| tensor(&format!("blk.{i}.{name}.weight"));
            let mut projections =
                |names: &[&str]| -> std::result::Result<Projections, RunnerError> {
                    let weights = names
                        .iter()
                        .map(|name| weight(name))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    Ok(Projections::new(weights, kernel)?)
                };
            let attn_qkv = projections(&["attn_q", "attn_k", "attn_v"])?;
            let ffn_gate_up = projections(&["ffn_gate", "ffn_up"])?;
            let mut q = |name: &str| -> std::result::Result<Linear, RunnerError> {
                Ok(Linear::new(weight(name)?, kernel)?)
            };
            let attn_output = q("attn_output")?;
            let ffn_down = q("ffn_down")?;
            layers.push(Layer {
                attn_qkv,
                attn_output,
                ffn_gate_up,
                ffn_down,
                attn_norm: dequantized(weight("attn_norm")?, &device)?,
                ffn_norm: dequantized(weight("ffn_norm")?, &device)?,
            });
        }
        let (cos, sin) = rope_tables(&config, &device)?;
        Ok(Llama {
            embeddings: Embedding::new(embeddings, config.n_embd),
            output: Linear::new(output, kernel)?,
            config,
            device,
            layers,
            output_norm,
            cos,
            sin,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// A new, empty KV cache for one request.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(
            self.config.n_layer,
            self.config.n_kv_head * self.config.head_dim,
        )
    }

    /// The most positions a sequence can have: the model's context length.
    pub fn max_positions(&self) -> usize {
        self.config.context_length
    }

    /// Feeds `tokens` at positions `cache.len() ..` (appending their keys and values to `cache`)
    /// and returns the logits predicting the token after each of `rows` (indices into `tokens`),
    /// `[rows.len(), vocab]` row-major on the host.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, rows: &[usize]) -> Result<Vec<f32>> {
        let hidden = self.forward_hidden(tokens, cache)?;
        let rows = rows
            .iter()
            .map(|&r| {
                u32::try_from(r).map_err(|_| candle_core::Error::msg("row index overflows u32"))
            })
            .collect::<Result<Vec<u32>>>()?;
        let rows = Tensor::new(rows.as_slice(), &self.device)?;
        let selected = hidden.i(0)?.index_select(&rows, 0)?;
        self.lm_head(&selected)?.flatten_all()?.to_vec1()
    }

    /// The final-normed hidden states `[1, n, n_embd]` of `tokens` fed at positions
    /// `cache.len() ..`; their keys and values are appended to `cache`.
    pub fn forward_hidden(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let (n, start) = (tokens.len(), cache.len());
        if n == 0 {
            candle_core::bail!("forward of no token");
        }
        if start + n > self.cos.dim(0)? {
            candle_core::bail!(
                "positions {start} .. {} exceed the context of {}",
                start + n,
                self.cos.dim(0)?
            );
        }
        let ids = Tensor::new(tokens, &self.device)?.unsqueeze(0)?;
        let eps = self.config.rms_eps;
        let mut x = self.embeddings.forward(&ids)?;
        for (index, layer) in self.layers.iter().enumerate() {
            let normed = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let attn = self.attention(layer, index, &normed, start, cache)?;
            let x_attn = (attn + &x)?;
            let normed = candle_nn::ops::rms_norm(&x_attn, &layer.ffn_norm, eps)?;
            let [gate, up] = parts(layer.ffn_gate_up.forward(&normed)?)?;
            let mlp = layer
                .ffn_down
                .forward(&(candle_nn::ops::silu(&gate)? * up)?)?;
            x = (mlp + &x_attn)?;
        }
        cache.advance(n);
        candle_nn::ops::rms_norm(&x, &self.output_norm, eps)
    }

    /// The LM head: `[m, n_embd]` final-normed hidden states to `[m, vocab]` logits.
    pub fn lm_head(&self, hidden: &Tensor) -> Result<Tensor> {
        self.output.forward(hidden)
    }

    /// Self-attention of one layer over the cached positions and the new ones: the projections
    /// and RoPE on candle ops, the attention itself by [`attention::attend`] (batch-invariant).
    fn attention(
        &self,
        layer: &Layer,
        index: usize,
        x: &Tensor,
        start: usize,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let (b, n, n_embd) = x.dims3()?;
        let LlamaConfig {
            n_head,
            n_kv_head,
            head_dim,
            ..
        } = self.config;
        // [b, n, heads · head_dim] → [b, heads, n, head_dim], as RoPE takes it.
        let heads = |t: Tensor, h: usize| t.reshape((b, n, h, head_dim))?.transpose(1, 2);
        // [b, heads, n, head_dim] → rows of [heads, head_dim], position-major.
        let rows = |t: Tensor| -> Result<Vec<f32>> { t.transpose(1, 2)?.flatten_all()?.to_vec1() };
        let [q, k, v] = parts(layer.attn_qkv.forward(x)?)?;
        let q = rows(self.rope(&heads(q, n_head)?, start)?)?;
        let k = rows(self.rope(&heads(k, n_kv_head)?, start)?)?;
        let v = v.flatten_all()?.to_vec1::<f32>()?;
        let (keys, values) = cache.append(index, &k, &v);
        let shape = Heads {
            n_head,
            n_kv_head,
            head_dim,
        };
        let y = attention::attend(&q, keys, values, start, shape);
        layer
            .attn_output
            .forward(&Tensor::from_vec(y, (b, n, n_embd), &self.device)?)
    }

    /// Interleaved RoPE (llama's GGUF convention) at positions `start ..`.
    fn rope(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let n = x.dim(2)?;
        let cos = self.cos.narrow(0, start, n)?;
        let sin = self.sin.narrow(0, start, n)?;
        candle_nn::rotary_emb::rope_i(&x.contiguous()?, &cos, &sin)
    }
}

/// The `N` outputs of a [`Projections`].
fn parts<const N: usize>(outputs: Vec<Tensor>) -> Result<[Tensor; N]> {
    let count = outputs.len();
    outputs
        .try_into()
        .map_err(|_| candle_core::Error::msg(format!("{count} projections, expected {N}")))
}

/// A norm's weight as an f32 tensor.
fn dequantized(weight: QTensor, device: &Device) -> std::result::Result<Tensor, RunnerError> {
    Ok(weight.dequantize(device)?)
}

/// RoPE's cosine and sine tables for every position of the context, computed as
/// `quantized_llama` computes them (one product per entry, so the same bits for any length).
fn rope_tables(config: &LlamaConfig, device: &Device) -> Result<(Tensor, Tensor)> {
    let dim = config.rope_dim;
    let theta: Vec<f32> = (0..dim)
        .step_by(2)
        .map(|i| 1f32 / config.rope_freq_base.powf(i as f32 / dim as f32))
        .collect();
    let theta = Tensor::new(theta.as_slice(), device)?;
    let positions = u32::try_from(config.context_length)
        .map_err(|_| candle_core::Error::msg("context length overflows u32"))?;
    let angles = Tensor::arange(0, positions, device)?
        .to_dtype(DType::F32)?
        .reshape((config.context_length, 1))?
        .matmul(&theta.reshape((1, theta.elem_count()))?)?;
    Ok((angles.cos()?, angles.sin()?))
}

/// Reads a GGUF file's header and metadata (not the tensors).
pub fn read_gguf(path: &Path) -> std::result::Result<Content, RunnerError> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => RunnerError::ModelMissing {
            path: path.to_path_buf(),
        },
        _ => RunnerError::io(format!("opening {}", path.display()), e),
    })?;
    Content::read(&mut BufReader::new(file)).map_err(|e| RunnerError::ModelInvalid {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}
