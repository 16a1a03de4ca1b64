//! The deterministic generator behind every generated case: a small seeded PRNG, realistic
//! probability and logit rows, float tensors in every dtype, and random batches whose layout is
//! computed on the host exactly as `build_output_layout` defines it.

use specula_backend_api::DType;
use specula_backend_api::abi::MAX_INFER_SEED;
use specula_backend_api::fixed_point::{reaches_top_p, top_p_fixed, weight};
use specula_backend_api::rng::row_seed;
use specula_backend_api::slots::{slot_input_tokens, slot_output_rows};

use crate::case::{Case, Dims};
use crate::tensor::HostTensor;

/// splitmix64: small, fast and identical on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`, mixed with a stream name so cases of different ops differ.
    pub fn new(stream: &str, seed: u64) -> Self {
        let mut h = 0xCBF2_9CE4_8422_2325u64;
        for b in stream.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
        }
        Rng(mix(h ^ seed))
    }

    /// A generator for `[rows, vocab]` values of `stream`, seeded by the shape.
    pub fn for_rows(stream: &str, rows: usize, vocab: usize) -> Self {
        Rng::new(stream, (rows * 1_000_003 + vocab) as u64)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `0 .. n` (`n ≥ 1`).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in `lo ..= hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A uniformly chosen element.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// Roughly standard normal (Irwin–Hall of 4 uniforms, from two draws).
    pub fn normal(&mut self) -> f64 {
        let (a, b) = (self.next_u64(), self.next_u64());
        let u = |x: u64| (x & 0xFFFF_FFFF) as f64 / 4_294_967_296.0;
        (u(a) + u(a >> 32) + u(b) + u(b >> 32) - 2.0) * 1.732
    }

    /// A token id in `0 .. vocab`.
    pub fn token(&mut self, vocab: usize) -> i32 {
        self.below(vocab) as i32
    }

    /// A request seed: usually anywhere below `MAX_INFER_SEED`, sometimes just below it.
    pub fn seed(&mut self) -> u64 {
        if self.chance(0.2) {
            MAX_INFER_SEED - 1 - self.below(40) as u64
        } else {
            self.next_u64() % MAX_INFER_SEED
        }
    }
}

/// The splitmix64 finaliser.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

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

/// Logits of a language model's next-token row: a Gaussian body, a few strong peaks, exact ties
/// among some tokens (copied values).
pub fn logit_row(rng: &mut Rng, vocab: usize) -> Vec<f32> {
    let sigma = rng.pick(&[0.5, 1.5, 3.0]);
    let mut logits: Vec<f64> = (0..vocab).map(|_| rng.normal() * sigma).collect();
    for _ in 0..rng.range(1, 8.min(vocab)) {
        let t = rng.below(vocab);
        logits[t] += 4.0 + rng.unit() * 10.0;
    }
    for _ in 0..rng.below(4) {
        let (a, b) = (rng.below(vocab), rng.below(vocab));
        logits[b] = logits[a];
    }
    logits.iter().map(|&x| x as f32).collect()
}

/// Temperatures a runner uses, for logits cases (host-valid: ≥ 0, not NaN): the argmax, a tiny
/// one, sharp, ordinary and flat ones, and +inf.
pub const TEMPERATURES: [f32; 7] = [0.0, 1e-30, 0.05, 0.7, 1.0, 2.5, f32::INFINITY];

/// A temperature of [`TEMPERATURES`] (mostly the ordinary ones).
pub fn pick_temperature(rng: &mut Rng) -> f32 {
    rng.pick(&[
        TEMPERATURES[0],
        TEMPERATURES[1],
        TEMPERATURES[2],
        TEMPERATURES[3],
        TEMPERATURES[3],
        TEMPERATURES[4],
        TEMPERATURES[4],
        TEMPERATURES[4],
        TEMPERATURES[5],
        TEMPERATURES[6],
    ])
}

/// Hostile logits: NaN, ±inf, magnitudes beyond 2^64, subnormals, ties at the maximum, and rows
/// of all −inf, spread over `rows` rows of [`logit_row`]s.
pub fn hostile_logit_rows(rng: &mut Rng, rows: usize, vocab: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        let mut row = logit_row(rng, vocab);
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for x in row.iter_mut() {
            match (r % 8, rng.below(6)) {
                (0, 0) => *x = f32::NAN,
                (1, 0) => *x = f32::INFINITY,
                (2, _) => *x = f32::NEG_INFINITY,
                (3, 1) => *x = rng.pick(&[3e38, -3e38, 1e20, -1e25]),
                (4, _) => *x = f32::from_bits(rng.next_u64() as u32),
                (5, 2) => *x = rng.pick(&[1e-40, -1e-30, 1e-23, 0.0, -0.0]),
                (6, 3) => *x = max,
                _ => {}
            }
        }
        out.extend(row);
    }
    out
}

/// A probability row that sums to ~1: the softmax of [`logit_row`] (long tail, peaks, ties).
pub fn prob_row(rng: &mut Rng, vocab: usize) -> Vec<f32> {
    let logits = logit_row(rng, vocab);
    softmax_f64(&logits)
}

/// `softmax` in f64, rounded to f32.
pub fn softmax_f64(logits: &[f32]) -> Vec<f32> {
    let m = logits
        .iter()
        .fold(f64::NEG_INFINITY, |a, &b| a.max(f64::from(b)));
    let e: Vec<f64> = logits.iter().map(|&x| (f64::from(x) - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| (x / sum) as f32).collect()
}

/// Adds more exact ties: runs of equal probabilities, as bf16 rows and flat tails have them.
pub fn add_ties(rng: &mut Rng, row: &mut [f32]) {
    let v = row.len();
    for _ in 0..rng.range(1, 6) {
        let a = rng.below(v);
        let len = rng.range(1, 8.min(v));
        let start = rng.below(v);
        for k in 0..len {
            row[(start + k) % v] = row[a];
        }
    }
}

/// `rows` rows made by `row(rng, r)`, every third one (rows 1, 4, 7, …) given more exact ties
/// ([`add_ties`]), one after the other.
pub fn rows_with_ties(
    rng: &mut Rng,
    rows: usize,
    mut row: impl FnMut(&mut Rng, usize) -> Vec<f32>,
) -> Vec<f32> {
    let mut values = Vec::new();
    for r in 0..rows {
        let mut values_of_row = row(rng, r);
        if r % 3 == 1 {
            add_ties(rng, &mut values_of_row);
        }
        values.extend(values_of_row);
    }
    values
}

/// `rows` rows of `row(rng, vocab)` with hostile values: every element `x` of row `r` is passed to
/// `spoil(rng, r, draw, x)` with a fresh `draw` in `0 .. draws`.
pub fn spoiled_rows(
    rng: &mut Rng,
    rows: usize,
    vocab: usize,
    row: fn(&mut Rng, usize) -> Vec<f32>,
    draws: usize,
    spoil: impl Fn(&mut Rng, usize, usize, &mut f32),
) -> Vec<f32> {
    let mut values = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        let mut values_of_row = row(rng, vocab);
        for x in values_of_row.iter_mut() {
            let draw = rng.below(draws);
            spoil(rng, r, draw, x);
        }
        values.extend(values_of_row);
    }
    values
}

/// `rows` probability rows of `vocab` for the sampling ops' hostile cases: each element of row `r`
/// gets a fresh `draw` in `0 .. 4` and is spoiled by [`spoil_probability`] as kind `r % period`;
/// the kinds it leaves to the caller go to `other(rng, kind, draw, x)`.
pub fn hostile_prob_rows(
    rng: &mut Rng,
    rows: usize,
    vocab: usize,
    period: usize,
    other: impl Fn(&mut Rng, usize, usize, &mut f32),
) -> Vec<f32> {
    spoiled_rows(rng, rows, vocab, prob_row, 4, |rng, r, draw, x| {
        let kind = r % period;
        if !spoil_probability(kind, draw, x) {
            other(rng, kind, draw, x);
        }
    })
}

/// The first hostile `top_p` values of the sampling ops' hostile cases: NaN, negative, 0, above
/// 1, +inf, tiny, an ordinary 0.5.
pub const HOSTILE_TOP_P: [f32; 7] = [f32::NAN, -0.5, 0.0, 1.5, f32::INFINITY, 1e-30, 0.5];

/// The hostile spoils of probability rows that the sampling ops' hostile cases share, for
/// [`spoiled_rows`]: a row of `kind` 0 or 1 gets NaN or +inf where `draw` is 0, of kind 2 is
/// negated, of kind 3 is zero. Whether `kind` is one of these (others are the caller's).
pub fn spoil_probability(kind: usize, draw: usize, x: &mut f32) -> bool {
    match (kind, draw) {
        (0, 0) => *x = f32::NAN,
        (1, 0) => *x = f32::INFINITY,
        (2, _) => *x = -*x,
        (3, _) => *x = 0.0,
        (0 | 1, _) => {}
        _ => return false,
    }
    true
}

/// `n` hostile i32 values (lengths, offsets, ids): each `i32::MIN`, -1, `i32::MAX` or random bits
/// with probability 1/7, otherwise in `0 ..= hi`.
pub fn garbage_i32(rng: &mut Rng, n: usize, hi: usize) -> Vec<i32> {
    (0..n)
        .map(|_| match rng.below(7) {
            0 => i32::MIN,
            1 => -1,
            2 => i32::MAX,
            3 => rng.next_u64() as i32,
            _ => rng.below(hi + 1) as i32,
        })
        .collect()
}

/// Samples an index proportionally to the (non-negative) values of `row`.
pub fn sample_index(rng: &mut Rng, row: &[f32]) -> usize {
    let total: f64 = row.iter().map(|&x| f64::from(x.max(0.0))).sum();
    let mut t = rng.unit() * total;
    for (i, &x) in row.iter().enumerate() {
        t -= f64::from(x.max(0.0));
        if t < 0.0 {
            return i;
        }
    }
    row.iter()
        .enumerate()
        .fold(0, |best, (i, &x)| if x > row[best] { i } else { best })
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
                    this_time[b] = if rng.chance(0.5) { s } else { rng.range(1, s) } as i32;
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

/// `rows` rows of `vocab` for the `fallback` cases: the even rows weigh nothing (all −inf or NaN
/// logits; all-zero, tiny or invalid probabilities), the odd ones are ordinary [`logit_row`]s or
/// [`prob_row`]s.
pub fn weightless_rows(rng: &mut Rng, rows: usize, vocab: usize, logits: bool) -> Vec<f32> {
    let mut scores = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        let row: Vec<f32> = match (r % 2, logits) {
            (0, true) => (0..vocab)
                .map(|v| [f32::NEG_INFINITY, f32::NAN][v % 2])
                .collect(),
            (0, false) => (0..vocab)
                .map(|v| [0.0, 1e-20, f32::NAN, -1.0][v % 4])
                .collect(),
            (_, true) => logit_row(rng, vocab),
            (_, false) => prob_row(rng, vocab),
        };
        scores.extend(row);
    }
    scores
}
