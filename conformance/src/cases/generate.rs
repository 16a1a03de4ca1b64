//! The conformance side of case generation: float tensors in every dtype, and random batches
//! whose layout is computed on the host exactly as `build_output_layout` defines it. The seeded
//! generator and the rows come from the workspace's one home of test inputs,
//! `specula_reference::fixtures` ([`Rng`], [`rows`](specula_reference::fixtures::rows)), re-exported here.

use specula_backend_api::DType;
use specula_backend_api::abi::MAX_INFER_SEED;
use specula_backend_api::fixed_point::{reaches_top_p, top_p_fixed, weight};
use specula_backend_api::rng::row_seed;
use specula_backend_api::slots::{slot_input_tokens, slot_output_rows};

pub use specula_reference::fixtures::rows::*;
pub use specula_reference::fixtures::{Rng, mix};

use crate::case::Dims;
use crate::cases::Case;
use crate::tensor::HostTensor;

/// The float dtypes every probability and logit op is tested in.
pub const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// A float tensor of `dtype` holding `values` (rounded to nearest for f16/bf16).
pub fn float_tensor(dtype: DType, shape: &[usize], values: &[f32]) -> HostTensor {
    match dtype {
        DType::F16 => {
            let v: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
            HostTensor::new(shape, &v)
        }
        DType::BF16 => {
            let v: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
            HostTensor::new(shape, &v)
        }
        _ => HostTensor::new(shape, values),
    }
}

/// `case` with its score rows of `shape` in `dtype`: `probs`, or `logits` with their per-row
/// `temperature` where one is given.
pub fn with_score_rows(
    case: Case,
    dtype: DType,
    shape: [usize; 2],
    scores: &[f32],
    temperature: Option<&[f32]>,
) -> Case {
    let scores = float_tensor(dtype, &shape, scores);
    match temperature {
        None => case.with("probs", scores),
        Some(t) => case.with("logits", scores).with("temperature", f32s(t)),
    }
}

/// `values` as they read back after a round trip through `dtype`.
pub fn round_to(dtype: DType, values: &[f32]) -> Vec<f32> {
    match dtype {
        DType::F16 => values
            .iter()
            .map(|&x| half::f16::from_f32(x).to_f32())
            .collect(),
        DType::BF16 => values
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect(),
        _ => values.to_vec(),
    }
}

/// What `top_p_candidates` produces for a row with these candidate probabilities (already in rank
/// order) and `tail` more mass spread over tokens beyond the first `C`: ids, scores and lens.
pub fn candidates_of(scores: &[f32], tail: f32, top_p: f32) -> usize {
    let total: u64 = scores.iter().map(|&s| weight(s)).sum::<u64>() + weight(tail);
    let p = top_p_fixed(top_p);
    let mut mass = 0;
    for (k, &s) in scores.iter().enumerate() {
        mass += weight(s);
        if reaches_top_p(mass, p, total) {
            return k + 1;
        }
    }
    scores.len()
}

/// The kind of a slot this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// No tokens.
    Empty,
    /// A whole prompt.
    Prefill,
    /// The last token plus drafts.
    Decode,
}

/// A batch of slots and its host-side layout (`docs/semantics.md` §2 and the decisions).
#[derive(Clone, Debug)]
pub struct Batch {
    /// The batch shape.
    pub dims: Dims,
    /// `seq_lens_this_time`, `[max_bsz]`.
    pub this_time: Vec<i32>,
    /// `seq_lens_encoder`, `[max_bsz]`.
    pub encoder: Vec<i32>,
}

impl Batch {
    /// A batch from explicit lengths.
    pub fn new(dims: Dims, this_time: Vec<i32>, encoder: Vec<i32>) -> Self {
        Batch {
            dims,
            this_time,
            encoder,
        }
    }

    /// A random batch: every slot kind mixed (each present when `real_bsz ≥ 3`), decode slots with
    /// 1 ..= S tokens (often S), prefills of 1 ..= `max_prompt` tokens, nothing beyond `real_bsz`.
    pub fn random(rng: &mut Rng, dims: Dims, max_prompt: usize) -> Self {
        let s = dims.max_step_tokens;
        let mut kinds: Vec<Kind> = (0..dims.real_bsz)
            .map(|_| match rng.below(100) {
                0..12 => Kind::Empty,
                12..30 => Kind::Prefill,
                _ => Kind::Decode,
            })
            .collect();
        if dims.real_bsz >= 3 {
            let start = rng.below(dims.real_bsz);
            for (k, kind) in [Kind::Decode, Kind::Prefill, Kind::Empty]
                .into_iter()
                .enumerate()
            {
                kinds[(start + k) % dims.real_bsz] = kind;
            }
        }
        let mut this_time = vec![0; dims.max_bsz];
        let mut encoder = vec![0; dims.max_bsz];
        for (b, kind) in kinds.into_iter().enumerate() {
            match kind {
                Kind::Empty => {}
                Kind::Prefill => {
                    let n = rng.range(1, max_prompt) as i32;
                    this_time[b] = n;
                    encoder[b] = n;
                }
                Kind::Decode => {
                    this_time[b] = if rng.chance(1, 2) { s } else { rng.range(1, s) } as i32;
                }
            }
        }
        Batch {
            dims,
            this_time,
            encoder,
        }
    }

    /// The kind of slot `b`.
    pub fn kind(&self, b: usize) -> Kind {
        if b >= self.dims.real_bsz || self.this_time[b] <= 0 {
            Kind::Empty
        } else if self.encoder[b] > 0 {
            Kind::Prefill
        } else {
            Kind::Decode
        }
    }

    /// Output rows of slot `b` (0 beyond `real_bsz`).
    pub fn rows_of(&self, b: usize) -> usize {
        if b >= self.dims.real_bsz {
            return 0;
        }
        slot_output_rows(
            self.this_time[b],
            self.encoder[b],
            self.dims.max_step_tokens,
        )
    }

    /// `seq_lens_output`, `[max_bsz]`.
    pub fn seq_lens_output(&self) -> Vec<i32> {
        (0..self.dims.max_bsz)
            .map(|b| self.rows_of(b) as i32)
            .collect()
    }

    /// `cu_seqlens_q`, `[real_bsz + 1]`.
    pub fn cu_seqlens_q(&self) -> Vec<i32> {
        let mut acc = 0;
        let mut out = vec![0];
        for b in 0..self.dims.real_bsz {
            acc += slot_input_tokens(self.this_time[b]);
            out.push(acc as i32);
        }
        out
    }

    /// `cu_seqlens_q_output`, `[real_bsz + 1]`.
    pub fn cu_seqlens_q_output(&self) -> Vec<i32> {
        let mut acc = 0;
        let mut out = vec![0];
        for b in 0..self.dims.real_bsz {
            acc += self.rows_of(b);
            out.push(acc as i32);
        }
        out
    }

    /// `T_out`.
    pub fn t_out(&self) -> usize {
        (0..self.dims.real_bsz).map(|b| self.rows_of(b)).sum()
    }

    /// Packed input tokens.
    pub fn token_num(&self) -> usize {
        self.this_time[..self.dims.real_bsz]
            .iter()
            .map(|&t| slot_input_tokens(t))
            .sum()
    }

    /// The layout's row capacity, `real_bsz · S`.
    pub fn capacity(&self) -> usize {
        self.dims.real_bsz * self.dims.max_step_tokens
    }

    /// `batch_id_per_token_output` with `rows` entries (-1 for padding rows).
    pub fn batch_id(&self, rows: usize) -> Vec<i32> {
        let mut out = Vec::with_capacity(rows);
        for b in 0..self.dims.real_bsz {
            out.extend(std::iter::repeat_n(b as i32, self.rows_of(b)));
        }
        out.resize(rows, -1);
        out
    }

    /// `(slot, position)` of each of the `T_out` output rows.
    pub fn row_sources(&self) -> Vec<(usize, usize)> {
        (0..self.dims.real_bsz)
            .flat_map(|b| (0..self.rows_of(b)).map(move |k| (b, k)))
            .collect()
    }

    /// Per-row values expanded from per-slot ones (`pad` for rows beyond `T_out`, up to `rows`).
    pub fn expand<T: Copy>(&self, per_slot: &[T], pad: T, rows: usize) -> Vec<T> {
        let mut out: Vec<T> = self
            .row_sources()
            .into_iter()
            .map(|(b, _)| per_slot[b])
            .collect();
        out.resize(rows, pad);
        out
    }

    /// Per-row seeds from per-slot `infer_seed` (0 for rows beyond `T_out`, up to `rows`).
    pub fn row_seeds(&self, infer_seed: &[u64], rows: usize) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .row_sources()
            .into_iter()
            .map(|(b, k)| row_seed(infer_seed[b], k as u64))
            .collect();
        out.resize(rows, 0);
        out
    }

    /// Adds `seq_lens_this_time` and `seq_lens_encoder` to a case.
    pub fn with_lens(&self, case: Case) -> Case {
        case.with("seq_lens_this_time", HostTensor::vector(&self.this_time))
            .with("seq_lens_encoder", HostTensor::vector(&self.encoder))
    }
}

/// `Dims` shorthand.
pub fn dims(max_bsz: usize, real_bsz: usize, max_step_tokens: usize) -> Dims {
    Dims {
        max_bsz,
        real_bsz,
        max_step_tokens,
    }
}

/// The batch part of a case name: `bs8_s4`, or `bs13_s5_real11` when not every slot is described.
pub fn batch_name(d: &Dims) -> String {
    if d.real_bsz == d.max_bsz {
        format!("bs{}_s{}", d.max_bsz, d.max_step_tokens)
    } else {
        format!("bs{}_s{}_real{}", d.max_bsz, d.max_step_tokens, d.real_bsz)
    }
}

/// i32 vector tensor.
pub fn i32s(v: &[i32]) -> HostTensor {
    HostTensor::vector(v)
}

/// f32 vector tensor.
pub fn f32s(v: &[f32]) -> HostTensor {
    HostTensor::vector(v)
}

/// u64 vector tensor.
pub fn u64s(v: &[u64]) -> HostTensor {
    HostTensor::vector(v)
}

/// u8 vector tensor.
pub fn u8s(v: &[u8]) -> HostTensor {
    HostTensor::vector(v)
}

/// Seeds at the edges of the seed space: near 2^63, at and above `MAX_INFER_SEED`, `u64::MAX`.
pub const EDGE_SEEDS: [u64; 8] = [
    0,
    MAX_INFER_SEED - 4,
    MAX_INFER_SEED - 1,
    MAX_INFER_SEED,
    MAX_INFER_SEED + 1,
    1 << 63,
    u64::MAX - 3,
    u64::MAX,
];
