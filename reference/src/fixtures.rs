//! Shared test fixtures (feature `fixtures`): random `process_logits` inputs as host data, and the
//! runs that compare a backend with [`ReferenceDevice`](crate::ReferenceDevice) bit for bit.
//!
//! The backend test crates (wgpu, xpu-sim, the CUDA emulator) generate their cases here, so that
//! one generator covers what each of them needs:
//!
//! - [`Shape`]: fixed mixed shapes ([`Shape::MIXED`]: V = 1, V not a multiple of 32, V wider than
//!   a workgroup), random shapes ([`Shape::random`], an empty batch now and then) and the slot
//!   shape of the emulator ([`Shape::slots`]);
//! - [`Layout`]: 0 ..= S rows per slot, 1 ..= S rows per slot followed by padding rows, or every
//!   slot kind (decode rows at several positions, one prefill row, none) with padding rows;
//! - histories with repeats (tokens of a small alphabet), drafts, bias lists with duplicate ids,
//!   bad words that match the end of a row's history across the draft boundary, allowed masks,
//!   bitmasks, penalties with min_p, min_tokens and end tokens;
//! - `hostile`: garbage everywhere the contract allows it (layouts, offsets, malformed bad-word
//!   entries, ids outside the vocabulary, counts at the f32 limits, NaN / inf / subnormal
//!   parameters, temperatures and scores);
//! - every float dtype ([`ProcessCase::score_bytes`]).
//!
//! [`run_process`] uploads a case to any [`Device`], runs `process_logits` and returns the
//! downloaded outputs; [`compare_process`] compares two devices. [`SampleCase`] / [`run_sampling`]
//! do the same for the `fallback` input of `top_k_top_p_sample` and `top_p_candidates`, and
//! [`StateCase`] / [`run_state`] for `update_state` with `token_counts`. Everything is seeded
//! ([`Rng`]): a seed gives the same cases on every machine.

use half::{bf16, f16};
use specula_backend_api::ops::process_logits::mask_words;
use specula_backend_api::ops::{
    BatchDims, CandidatesInputs, CandidatesOutputs, CandidatesParams, DecodeState, OutputLayout,
    ProcessInputs, ProcessOutputs, ProcessParams, RowBlock, RowShape, SampleInputs, SampleParams,
    Scores, SlotProcessing, TokenHistory, UpdateStateInputs, UpdateStateParams, VocabSlice,
};
use specula_backend_api::{Buffer, DType, Device, DeviceExt, Result};

/// splitmix64: a small deterministic generator.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (0 when `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    /// An item of `items` (not empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[lo, hi)`.
    pub fn float(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }
}

/// Hostile f32 values: NaN of both signs, infinities, subnormals, huge and tiny magnitudes,
/// signed zeros, 2^-32 and 2^32.
pub const HOSTILE_F32: [f32; 18] = [
    f32::NAN,
    -f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::from_bits(1),
    -f32::from_bits(0x0040_0000),
    1e-40,
    0.0,
    -0.0,
    1e30,
    -1e30,
    3.0e38,
    f32::MAX,
    2e-30,
    -3.5,
    -1.0,
    f32::from_bits(0x2f80_0000),
    f32::from_bits(0x4f80_0000),
];

/// A garbage i32: negative, huge or the extremes.
pub fn garbage_i32(rng: &mut Rng) -> i32 {
    rng.pick(&[-1, -7, i32::MIN, i32::MAX, 1 << 20, 12_345_678])
}

/// A hostile f32 parameter (NaN more often than the others: it reads as 0 or as off).
pub fn hostile_f32(rng: &mut Rng) -> f32 {
    if rng.chance(1, 4) {
        f32::NAN
    } else {
        rng.pick(&HOSTILE_F32)
    }
}

/// A token id: mostly from a few small ids (so histories, drafts, bias and bad words meet),
/// sometimes any id, and when `hostile` now and then an id outside `[0, vocab)`.
pub fn token(rng: &mut Rng, vocab: usize, hostile: bool) -> i32 {
    if hostile && rng.chance(1, 10) {
        return rng.pick(&[
            -1,
            vocab as i32,
            vocab as i32 + 5,
            vocab as i32 + 7,
            i32::MIN,
            i32::MAX,
        ]);
    }
    let alphabet = rng.pick(&[4usize, 6]);
    if rng.chance(3, 4) {
        rng.below(vocab.min(alphabet)) as i32
    } else {
        rng.below(vocab) as i32
    }
}

/// A logit: ties from a few values, halves (ties), random values, and (hostile) NaN, ±inf,
/// subnormals, huge values.
pub fn logit(rng: &mut Rng, hostile: bool) -> f32 {
    let special = if hostile { 15 } else { 3 };
    if rng.chance(special, 100) {
        return rng.pick(&HOSTILE_F32);
    }
    match rng.below(4) {
        0 => rng.pick(&[0.0, 1.0, -1.0, 2.5, -20.0, 0.5]),
        1 => rng.range(-16, 16) as f32 * 0.5,
        _ => rng.float(-8.0, 8.0),
    }
}

/// A probability: small values, ties, and (hostile, or now and then) NaN, negatives, values
/// above 1, infinities, subnormals.
pub fn prob(rng: &mut Rng, hostile: bool) -> f32 {
    if rng.chance(if hostile { 13 } else { 3 }, 100) {
        return rng.pick(&[
            f32::NAN,
            -0.25,
            1.5,
            f32::INFINITY,
            f32::from_bits(5),
            -0.0,
            1.0,
            1e-40,
        ]);
    }
    match rng.below(10) {
        0 | 1 => rng.pick(&[0.0, 0.125, 0.25, 0.5]),
        2 => rng.unit(),
        _ => rng.float(0.0, 0.2),
    }
}

/// A mask word with mostly set bits, or none now and then.
fn mask_word(rng: &mut Rng) -> u32 {
    if rng.chance(1, 10) {
        0
    } else {
        !((rng.next_u64() & rng.next_u64() & rng.next_u64()) as u32)
    }
}

/// The shape of a generated case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Slots.
    pub max_bsz: usize,
    /// Live slots.
    pub real_bsz: usize,
    /// Rows a slot may have (`max_step_tokens`).
    pub s: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// History length of a slot.
    pub max_model_len: usize,
}

impl Shape {
    /// Fixed shapes: V not a multiple of 32, V = 1, vocabularies wider than a workgroup (300,
    /// 1031), one slot, several.
    pub const MIXED: [Shape; 7] = [
        Shape::new(3, 2, 4, 37, 16),
        Shape::new(2, 2, 3, 1, 8),
        Shape::new(4, 3, 5, 300, 24),
        Shape::new(1, 1, 1, 64, 6),
        Shape::new(5, 4, 3, 7, 12),
        Shape::new(2, 1, 6, 33, 10),
        Shape::new(3, 3, 4, 1031, 20),
    ];

    /// A shape.
    pub const fn new(
        max_bsz: usize,
        real_bsz: usize,
        s: usize,
        vocab: usize,
        max_model_len: usize,
    ) -> Self {
        Shape {
            max_bsz,
            real_bsz,
            s,
            vocab,
            max_model_len,
        }
    }

    /// A random small batch over `vocab`: 1 to 4 slots, now and then none live, S of 1 to 4.
    pub fn random(rng: &mut Rng, vocab: usize) -> Self {
        let max_bsz = 1 + rng.below(4);
        let real_bsz = if rng.chance(1, 10) {
            0
        } else {
            1 + rng.below(max_bsz)
        };
        Shape::new(
            max_bsz,
            real_bsz,
            1 + rng.below(4),
            vocab,
            4 + rng.below(12),
        )
    }

    /// Five slots of S = 4 (four or five live), histories of 12: room for every slot kind.
    pub fn slots(rng: &mut Rng, vocab: usize) -> Self {
        Shape::new(5, 5 - rng.below(2), 4, vocab, 12)
    }
}

/// How the rows of a case map to slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// 0 ..= S rows per live slot; the matrix has the capacity `real_bsz · S` rows or one less.
    Packed,
    /// 1 ..= S rows per live slot, then 0 to 2 padding rows.
    Padded,
    /// Every slot kind: S decode rows, 3, 2 or 1 rows (a prefill row), none; then a padding row
    /// and a row of the first dead slot (and, hostile, rows of slot `i32::MAX` and slot 0, with
    /// slot 0's rows moved past its first row).
    SlotKinds,
}

impl Layout {
    /// Every layout.
    pub const ALL: [Layout; 3] = [Layout::Packed, Layout::Padded, Layout::SlotKinds];
}

/// What to generate.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// The batch.
    pub shape: Shape,
    /// The dtype of the score matrix.
    pub dtype: DType,
    /// Logits (with temperatures) or probabilities.
    pub logits: bool,
    /// Garbage everywhere the contract allows it.
    pub hostile: bool,
    /// The layout; `None`: one chosen at random.
    pub layout: Option<Layout>,
}

/// One `process_logits` call, every input as host data.
#[derive(Clone, Debug)]
pub struct ProcessCase {
    /// The batch.
    pub dims: BatchDims,
    /// Vocabulary.
    pub vocab: usize,
    /// History length of a slot.
    pub max_model_len: usize,
    /// Rows of the score matrix.
    pub rows: usize,
    /// The dtype of the score matrix.
    pub dtype: DType,
    /// Logits (with `temperature`) or probabilities.
    pub logits: bool,
    /// The score matrix as f32 values (converted to `dtype` by [`ProcessCase::score_bytes`]).
    pub scores: Vec<f32>,
    /// Per-row temperatures (logits rows).
    pub temperature: Vec<f32>,
    /// `cu_seqlens_q_output`, `[real_bsz + 1]`.
    pub cu_out: Vec<i32>,
    /// `batch_id_per_token_output`: the slot of each row (-1: padding).
    pub batch_id: Vec<i32>,
    /// `[max_bsz, max_model_len]`: prompt then generated tokens.
    pub token_ids_all: Vec<i32>,
    /// Prompt length per slot.
    pub prompt_lens: Vec<i32>,
    /// Tokens generated so far per slot.
    pub step_idx: Vec<i32>,
    /// `[max_bsz, S]`: the last accepted token, then the drafts.
    pub draft_tokens: Vec<i32>,
    /// `[max_bsz, V]`: per-slot counts of the generated tokens.
    pub token_counts: Vec<i32>,
    /// `[max_bsz, ceil(V/32)]`: the prompt's tokens as bits.
    pub prompt_mask: Vec<u32>,
    /// `[max_bsz, 5]`: `α, α⁻¹, β, γ, min_p` per slot.
    pub penalties: Vec<f32>,
    /// Per slot: end tokens are masked below this generated position.
    pub min_tokens: Vec<i32>,
    /// The end tokens.
    pub end_tokens: Vec<i32>,
    /// `[max_bsz + 1]`: each slot's range of the bias entries.
    pub bias_offsets: Vec<i32>,
    /// Token ids of the bias entries.
    pub bias_ids: Vec<i32>,
    /// Values of the bias entries.
    pub bias_values: Vec<f32>,
    /// `[max_bsz + 1]`: each slot's range of `bad_words`.
    pub bad_word_offsets: Vec<i32>,
    /// Encoded bad words: a length, then that many tokens.
    pub bad_words: Vec<i32>,
    /// Optional `[max_bsz, ceil(V/32)]` allowed-token masks.
    pub allowed: Option<Vec<u32>>,
    /// Optional `[rows, ceil(V/32)]` runner bitmask.
    pub bitmask: Option<Vec<u32>>,
}

/// Offsets of per-slot lists of `lens[b]` entries; when `hostile`, some are garbage.
fn list_offsets(rng: &mut Rng, lens: &[usize], total: usize, hostile: bool) -> Vec<i32> {
    let mut out = vec![0i32];
    for &n in lens {
        out.push(out[out.len() - 1] + n as i32);
    }
    if hostile {
        for o in out.iter_mut() {
            if rng.chance(1, 6) {
                *o = if rng.chance(1, 2) {
                    garbage_i32(rng)
                } else {
                    rng.range(-3, total as i64 + 3) as i32
                };
            }
        }
    }
    out
}

/// The rows of each live slot and the row-to-slot map of `layout`.
fn layout_rows(rng: &mut Rng, spec: &Spec, layout: Layout) -> (Vec<i32>, Vec<i32>, usize) {
    let Shape {
        max_bsz,
        real_bsz,
        s,
        ..
    } = spec.shape;
    let hostile = spec.hostile;
    let mut cu_out = vec![0i32; real_bsz + 1];
    let mut batch_id = Vec::new();
    for b in 0..real_bsz {
        let n = match layout {
            Layout::Packed => rng.below(s + 1),
            Layout::Padded => 1 + rng.below(s),
            Layout::SlotKinds => [s, 3, 1, 0, 2][(b + rng.below(5)) % 5].min(s),
        };
        cu_out[b + 1] = cu_out[b] + n as i32;
        batch_id.extend(std::iter::repeat_n(b as i32, n));
    }
    let cap = (real_bsz * s).max(1);
    let rows = match layout {
        Layout::Packed => cap - rng.below(2).min(cap - 1),
        Layout::Padded => batch_id.len() + rng.below(3),
        Layout::SlotKinds => {
            batch_id.push(-1);
            batch_id.push(real_bsz as i32);
            if hostile {
                batch_id.push(i32::MAX);
                batch_id.push(0);
                if real_bsz > 0 {
                    cu_out[1] = cu_out[1].max(0) + 9;
                }
            }
            batch_id.len()
        }
    };
    batch_id.resize(rows.max(cap), -1);
    if hostile {
        for id in batch_id.iter_mut() {
            if rng.chance(1, 10) {
                *id = rng.pick(&[-1, -3, real_bsz as i32, max_bsz as i32 + 2, i32::MAX, 0]);
            }
        }
        for c in cu_out.iter_mut() {
            if rng.chance(1, 8) {
                *c = rng.pick(&[-3, -1, 1, rows as i32 + 2, i32::MIN, i32::MAX]);
            }
        }
    }
    (cu_out, batch_id, rows)
}

impl ProcessCase {
    /// A random case of `spec`.
    pub fn random(rng: &mut Rng, spec: &Spec) -> Self {
        let Shape {
            max_bsz,
            real_bsz,
            s,
            vocab,
            max_model_len: mml,
        } = spec.shape;
        let hostile = spec.hostile;
        let words = mask_words(vocab);
        let layout = spec.layout.unwrap_or_else(|| rng.pick(&Layout::ALL));
        let (cu_out, batch_id, rows) = layout_rows(rng, spec, layout);
        let mut prompt_lens: Vec<i32> = (0..max_bsz)
            .map(|_| rng.below(mml / 2 + 1) as i32)
            .collect();
        let mut step_idx: Vec<i32> = (0..max_bsz).map(|_| rng.below(mml) as i32).collect();
        if hostile {
            for b in 0..max_bsz {
                if rng.chance(1, 5) {
                    prompt_lens[b] = rng.pick(&[-5, -2, mml as i32 + 3, 40, i32::MAX, i32::MIN]);
                }
                if rng.chance(1, 5) {
                    step_idx[b] = rng.pick(&[-5, -1, mml as i32 + 3, i32::MAX, i32::MIN]);
                }
            }
        }
        let token_ids_all: Vec<i32> = (0..max_bsz * mml)
            .map(|_| token(rng, vocab, hostile))
            .collect();
        let draft_tokens: Vec<i32> = (0..max_bsz * s)
            .map(|_| token(rng, vocab, hostile))
            .collect();
        let token_counts: Vec<i32> = (0..max_bsz * vocab)
            .map(|_| match rng.below(10) {
                0..=5 => 0,
                6..=8 => 1 + rng.below(5) as i32,
                _ if hostile => rng.pick(&[
                    -1,
                    -5,
                    i32::MIN,
                    i32::MAX,
                    (1 << 24) - 1,
                    1 << 24,
                    (1 << 24) + 3,
                ]),
                _ => rng.below(100) as i32,
            })
            .collect();
        let prompt_mask: Vec<u32> = (0..max_bsz * words)
            .map(|_| (rng.next_u64() & rng.next_u64()) as u32)
            .collect();
        let mut penalties = Vec::new();
        for _ in 0..max_bsz {
            let alpha = rng.pick(&[1.0f32, 1.3, 0.7, 2.0, 1.1]);
            let mut row = [
                alpha,
                1.0 / alpha,
                rng.pick(&[0.0, 0.5, -0.25, 0.1, 1e-3, 1.25]),
                rng.pick(&[0.0, 0.3, 0.7, -1.0]),
                rng.pick(&[0.0, 0.0, 0.05, 0.3, 0.9, 1.0, 1e-8]),
            ];
            if hostile {
                for v in row.iter_mut() {
                    if rng.chance(1, 4) {
                        *v = hostile_f32(rng);
                    }
                }
                if rng.chance(1, 6) {
                    row[0] = rng.pick(&[
                        f32::from_bits(0x2f80_0000),
                        f32::from_bits(0x4f80_0000),
                        4.3e9,
                        1e10,
                    ]);
                    row[1] = rng.pick(&[
                        f32::from_bits(0x2f80_0000),
                        f32::from_bits(0x4f80_0000),
                        2e-10,
                        5e9,
                    ]);
                }
                if rng.chance(1, 6) {
                    row[4] = rng.pick(&[2.0, -0.1, 1e-30, 0.999, f32::INFINITY]);
                }
            }
            penalties.extend_from_slice(&row);
        }
        let min_tokens: Vec<i32> = (0..max_bsz)
            .map(|_| {
                if hostile && rng.chance(1, 6) {
                    garbage_i32(rng)
                } else {
                    rng.range(-1, (mml / 2 + s + 1) as i64) as i32
                }
            })
            .collect();
        let mut end_tokens: Vec<i32> = if rng.chance(1, 3) {
            vec![(vocab - 1) as i32, 2.min(vocab as i32 - 1)]
        } else {
            (0..1 + rng.below(3))
                .map(|_| token(rng, vocab, hostile))
                .collect()
        };
        if hostile && rng.chance(1, 3) {
            end_tokens.extend([-5, vocab as i32 + 1]);
        }
        // Bias lists: duplicate ids (the last entry counts), out-of-range ids and hostile values.
        let bias_lens: Vec<usize> = (0..max_bsz).map(|_| rng.below(5)).collect();
        let nb = bias_lens.iter().sum::<usize>().max(1);
        let bias_offsets = list_offsets(rng, &bias_lens, nb, hostile);
        let bias_ids = (0..nb).map(|_| token(rng, vocab, hostile)).collect();
        let bias_values = (0..nb)
            .map(|_| {
                if hostile && rng.chance(1, 3) {
                    rng.pick(&[
                        f32::NAN,
                        f32::NAN,
                        f32::INFINITY,
                        f32::NEG_INFINITY,
                        1e-40,
                        f32::from_bits(7),
                        3.0e38,
                        -1e30,
                        -0.0,
                        3e19,
                    ])
                } else {
                    rng.pick(&[-100.0, 5.0, -1.5, 0.25, 3.0, 10.0, -1e3, 1e-3])
                }
            })
            .collect();
        let allowed = rng.chance(1, 2).then(|| {
            let mut m: Vec<u32> = (0..max_bsz * words).map(|_| mask_word(rng)).collect();
            if max_bsz > 1 && rng.chance(1, 3) {
                m[words..2 * words].fill(0); // slot 1 allows nothing
            }
            m
        });
        let bitmask = rng.chance(1, 2).then(|| {
            let mut m: Vec<u32> = (0..rows * words).map(|_| mask_word(rng)).collect();
            if rows > 1 && rng.chance(1, 3) {
                m[words..2 * words].fill(0); // row 1 allows nothing
            }
            m
        });
        let mut scores = Vec::with_capacity(rows * vocab);
        for _ in 0..rows {
            let dead = rng.chance(1, 10);
            for _ in 0..vocab {
                scores.push(if dead {
                    if spec.logits {
                        rng.pick(&[f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NAN])
                    } else {
                        rng.pick(&[0.0, 0.0, -0.5, f32::NAN, f32::NEG_INFINITY])
                    }
                } else if spec.logits {
                    logit(rng, hostile)
                } else {
                    prob(rng, hostile)
                });
            }
        }
        let temperature: Vec<f32> = (0..rows)
            .map(|_| {
                if hostile && rng.chance(1, 4) {
                    rng.pick(&[0.0, f32::INFINITY, f32::NAN, -1.0, 1e-30, 1e-40, -0.0])
                } else {
                    rng.pick(&[1.0, 0.7, 2.5, 1.0, 0.0, 1e-3])
                }
            })
            .collect();
        let mut case = ProcessCase {
            dims: BatchDims::new(max_bsz, real_bsz, s),
            vocab,
            max_model_len: mml,
            rows,
            dtype: spec.dtype,
            logits: spec.logits,
            scores,
            temperature,
            cu_out,
            batch_id,
            token_ids_all,
            prompt_lens,
            step_idx,
            draft_tokens,
            token_counts,
            prompt_mask,
            penalties,
            min_tokens,
            end_tokens,
            bias_offsets,
            bias_ids,
            bias_values,
            bad_word_offsets: Vec::new(),
            bad_words: Vec::new(),
            allowed,
            bitmask,
        };
        case.bad_words(rng, hostile);
        case
    }

    /// Bad words: single tokens, entries whose prefix is the end of some row's history (crossing
    /// the draft boundary when the row has drafts before it), random entries; hostile lists have
    /// malformed length fields, malformed entries at the end, and garbage offsets.
    fn bad_words(&mut self, rng: &mut Rng, hostile: bool) {
        let (max_bsz, real_bsz, s) = (
            self.dims.max_bsz,
            self.dims.real_bsz,
            self.dims.max_step_tokens,
        );
        let (vocab, mml) = (self.vocab, self.max_model_len);
        let mut lens = Vec::new();
        let mut list = Vec::new();
        for b in 0..max_bsz {
            let start = list.len();
            for _ in 0..rng.below(4) {
                match rng.below(3) {
                    0 => list.extend([1, token(rng, vocab, hostile)]),
                    1 => {
                        let pos = rng.below(s);
                        let h = if b < real_bsz
                            && self.prompt_lens[b] >= 0
                            && self.step_idx[b] >= 0
                            && (self.prompt_lens[b] as usize) < mml
                        {
                            history(self, b, pos)
                        } else {
                            Vec::new()
                        };
                        let n = 1 + rng.below(3).min(h.len());
                        list.push(n as i32);
                        list.extend_from_slice(&h[h.len() - (n - 1)..]);
                        list.push(token(rng, vocab, hostile));
                    }
                    _ => {
                        let n = 1 + rng.below(3);
                        list.push(if hostile && rng.chance(1, 10) {
                            rng.pick(&[0, -1, 100, i32::MIN])
                        } else {
                            n as i32
                        });
                        for _ in 0..n {
                            list.push(token(rng, vocab, hostile));
                        }
                    }
                }
            }
            if hostile && rng.chance(1, 4) {
                list.extend(rng.pick(&[
                    [0, 1, 2],
                    [-3, 1, 1],
                    [9, 1, 1],
                    [2, 1, 1],
                    [99, 1, 0],
                    [i32::MAX, 1, 0],
                ]));
            }
            lens.push(list.len() - start);
        }
        if list.is_empty() {
            list.push(1);
        }
        self.bad_word_offsets = list_offsets(rng, &lens, list.len(), hostile);
        self.bad_words = list;
    }

    /// The score matrix in the case's dtype (f16 and bf16 rounded to nearest), little-endian.
    pub fn score_bytes(&self) -> Vec<u8> {
        score_bytes(&self.scores, self.dtype)
    }

    /// A short description for failure messages.
    pub fn label(&self) -> String {
        format!(
            "{:?} vocab {} rows {} {:?} logits {}",
            self.dims, self.vocab, self.rows, self.dtype, self.logits
        )
    }
}

/// The history of slot `b` at row position `pos`, as the definition builds it.
fn history(c: &ProcessCase, b: usize, pos: usize) -> Vec<i32> {
    let mml = c.max_model_len;
    let prompt = (c.prompt_lens[b].max(0) as usize).min(mml);
    let end = (prompt + c.step_idx[b].max(0) as usize).min(mml);
    let mut h = c.token_ids_all[b * mml + prompt..b * mml + end].to_vec();
    let s = c.dims.max_step_tokens;
    h.extend_from_slice(&c.draft_tokens[b * s + 1..b * s + 1 + pos.min(s - 1)]);
    h
}

/// `values` in `dtype` (f16 and bf16 rounded to nearest even, NaN kept a NaN), little-endian.
pub fn score_bytes(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Uploads a float matrix given as f32 values in `dtype`.
pub fn upload_scores(device: &dyn Device, values: &[f32], dtype: DType) -> Result<Buffer> {
    device.upload_bytes(dtype, &score_bytes(values, dtype))
}

/// What `process_logits` wrote: the processed rows as f32 bits, and the fallbacks.
pub type ProcessOut = (Vec<u32>, Vec<i32>);

/// Uploads `c` to `device`, runs `process_logits` and downloads its outputs.
pub fn run_process(device: &dyn Device, c: &ProcessCase) -> Result<ProcessOut> {
    run_process_block(device, c, None)
}

/// [`run_process`] on the rows of `block` only (every row when `None`): the outputs hold the
/// block's rows.
pub fn run_process_block(
    device: &dyn Device,
    c: &ProcessCase,
    block: Option<RowBlock>,
) -> Result<ProcessOut> {
    let token_counts = device.upload(&c.token_counts)?;
    run_process_with_counts(device, c, block, &token_counts)
}

/// [`run_process_block`] with the count table already on `device` (`token_counts`, which should
/// hold `c.token_counts`): a device that keeps something derived from a table between calls is
/// tested on the same buffer across calls.
pub fn run_process_with_counts(
    device: &dyn Device,
    c: &ProcessCase,
    block: Option<RowBlock>,
    token_counts: &Buffer,
) -> Result<ProcessOut> {
    run_process_on(device, c, (block, None), token_counts)
}

/// [`run_process`] of one rank's slice of the rows (`docs/semantics.md` §4d): the scores are
/// cut to the ids of `slice`, every table stays whole; the outputs hold `[rows, slice.len]`.
pub fn run_process_slice(
    device: &dyn Device,
    c: &ProcessCase,
    slice: VocabSlice,
) -> Result<ProcessOut> {
    let token_counts = device.upload(&c.token_counts)?;
    run_process_on(device, c, (None, Some(slice)), &token_counts)
}

/// [`run_process_with_counts`] of a block of the rows and of a slice of their ids.
fn run_process_on(
    device: &dyn Device,
    c: &ProcessCase,
    (block, slice): (Option<RowBlock>, Option<VocabSlice>),
    token_counts: &Buffer,
) -> Result<ProcessOut> {
    let rows = block.map_or(c.rows, |b| b.rows);
    let ids = slice.unwrap_or_else(|| VocabSlice::whole(c.vocab));
    let cut: Vec<f32> = c
        .scores
        .chunks(c.vocab.max(1))
        .flat_map(|row| row[ids.first..ids.end()].to_vec())
        .collect();
    let scores = upload_scores(device, &cut, c.dtype)?;
    let temperature = device.upload(&c.temperature)?;
    let cu_out = device.upload(&c.cu_out)?;
    let batch_id = device.upload(&c.batch_id)?;
    let token_ids_all = device.upload(&c.token_ids_all)?;
    let prompt_lens = device.upload(&c.prompt_lens)?;
    let step_idx = device.upload(&c.step_idx)?;
    let draft_tokens = device.upload(&c.draft_tokens)?;
    let prompt_mask = device.upload(&c.prompt_mask)?;
    let penalties = device.upload(&c.penalties)?;
    let min_tokens = device.upload(&c.min_tokens)?;
    let end_tokens = device.upload(&c.end_tokens)?;
    let bias_offsets = device.upload(&c.bias_offsets)?;
    let bias_ids = device.upload(&c.bias_ids)?;
    let bias_values = device.upload(&c.bias_values)?;
    let bad_word_offsets = device.upload(&c.bad_word_offsets)?;
    let bad_words = device.upload(&c.bad_words)?;
    let allowed = c.allowed.as_deref().map(|a| device.upload(a)).transpose()?;
    let bitmask = c.bitmask.as_deref().map(|m| device.upload(m)).transpose()?;
    let mut processed = device.alloc::<f32>(rows * ids.len)?;
    let mut fallback = device.alloc::<i32>(rows)?;
    let scores = if c.logits {
        Scores::logits(&scores, &temperature)
    } else {
        Scores::probs(&scores)
    };
    device.process_logits(
        &ProcessInputs {
            scores,
            layout: OutputLayout {
                cu_seqlens_q_output: &cu_out,
                batch_id_per_token_output: &batch_id,
            },
            history: TokenHistory {
                token_ids_all: &token_ids_all,
                prompt_lens: &prompt_lens,
                step_idx: &step_idx,
                draft_tokens: &draft_tokens,
                token_counts,
                prompt_mask: &prompt_mask,
            },
            slots: SlotProcessing {
                penalties: &penalties,
                min_tokens: &min_tokens,
                end_tokens: &end_tokens,
                bias_offsets: &bias_offsets,
                bias_ids: &bias_ids,
                bias_values: &bias_values,
                bad_word_offsets: &bad_word_offsets,
                bad_words: &bad_words,
                allowed: allowed.as_ref(),
            },
            bitmask: bitmask.as_ref(),
        },
        &mut ProcessOutputs {
            processed: &mut processed,
            fallback: &mut fallback,
        },
        &ProcessParams {
            dims: c.dims,
            shape: RowShape {
                rows: c.rows,
                vocab: c.vocab,
            },
            block,
            slice,
            max_model_len: c.max_model_len,
            host: None,
        },
    )?;
    device.synchronize()?;
    let processed: Vec<f32> = device.download(&processed)?;
    Ok((
        processed.iter().map(|x| x.to_bits()).collect(),
        device.download(&fallback)?,
    ))
}

/// The first difference between `got` and `want` (outputs of case `c`), bit for bit; `what`
/// names the case in the message.
pub fn check_process(
    c: &ProcessCase,
    got: &ProcessOut,
    want: &ProcessOut,
    what: &str,
) -> std::result::Result<(), String> {
    if let Some(i) = (0..want.0.len()).find(|&i| got.0.get(i) != Some(&want.0[i])) {
        let (r, v) = (i / c.vocab, i % c.vocab);
        let g = got.0.get(i).copied().unwrap_or_default();
        return Err(format!(
            "{what}: processed[{r}, {v}] = {} ({g:#010x}), expected {} ({:#010x}); input {} \
             batch_id {} ({c:?})",
            f32::from_bits(g),
            f32::from_bits(want.0[i]),
            want.0[i],
            c.scores[i],
            c.batch_id[r]
        ));
    }
    if got.0.len() != want.0.len() {
        return Err(format!(
            "{what}: {} processed values, expected {}",
            got.0.len(),
            want.0.len()
        ));
    }
    if got.1 != want.1 {
        return Err(format!(
            "{what}: fallback {:?}, expected {:?} ({c:?})",
            got.1, want.1
        ));
    }
    Ok(())
}

/// Runs `c` on `device` and on `reference` and compares the outputs bit for bit.
pub fn compare_process(
    device: &dyn Device,
    reference: &dyn Device,
    c: &ProcessCase,
    what: &str,
) -> std::result::Result<(), String> {
    let want = run_process(reference, c).map_err(|e| format!("{what}: reference: {e}"))?;
    let got = run_process(device, c).map_err(|e| format!("{what}: device: {e}"))?;
    check_process(c, &got, &want, what)
}

/// A case of fixed hand-made rows: a slot with every rule on (bias on a draft token, a
/// two-token bad word crossing the draft boundary, min_tokens, min_p), an all-masked row (its
/// fallback is -1), and a row whose unmasked tokens (0 and 1) are all -inf (its fallback is 0).
/// Row 1 (history 3, 4, 7) bans token 8; row 0 (history 3, 4) does not.
pub fn hand_case() -> ProcessCase {
    let vocab = 10;
    let s = 3;
    let mml = 8;
    let words = mask_words(vocab);
    let mut allowed = vec![u32::MAX; 2 * words];
    allowed[words] = 0b11; // slot 1 allows tokens 0 and 1 only
    let mut scores = vec![0.0f32; 4 * vocab];
    for (v, x) in scores.iter_mut().enumerate().take(3 * vocab) {
        *x = (v % vocab) as f32 * 0.5 - 2.0;
    }
    scores[2 * vocab..3 * vocab]
        .iter_mut()
        .for_each(|x| *x = -1.0);
    scores[3 * vocab] = f32::NEG_INFINITY;
    scores[3 * vocab + 1] = f32::NEG_INFINITY;
    ProcessCase {
        dims: BatchDims::new(2, 2, s),
        vocab,
        max_model_len: mml,
        rows: 4,
        dtype: DType::F32,
        logits: true,
        scores,
        temperature: vec![1.0, 0.8, 1.0, 1.0],
        // slot 0: rows 0..3; slot 1: row 3.
        cu_out: vec![0, 3, 4],
        batch_id: vec![0, 0, 0, 1, -1, -1],
        // slot 0: prompt [1, 2], generated [3, 4]; slot 1: prompt [5].
        token_ids_all: vec![1, 2, 3, 4, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0],
        prompt_lens: vec![2, 1],
        step_idx: vec![2, 0],
        draft_tokens: vec![4, 7, 7, 0, 0, 0],
        token_counts: {
            let mut t = vec![0; 2 * vocab];
            t[3] = 1;
            t[4] = 1;
            t
        },
        prompt_mask: vec![0b110, 0b10_0000],
        penalties: vec![1.2, 1.0 / 1.2, 0.5, 0.25, 0.2, 1.0, 1.0, 0.0, 0.0, 0.0],
        min_tokens: vec![4, 0],
        end_tokens: vec![9],
        bias_offsets: vec![0, 2, 2],
        bias_ids: vec![7, 8],
        bias_values: vec![1.5, -0.5],
        bad_word_offsets: vec![0, 4, 4],
        // slot 0: ban 8 after [4, 7] (the last generated token, then the first draft).
        bad_words: vec![3, 4, 7, 8],
        allowed: Some(allowed),
        bitmask: Some({
            let mut m = vec![u32::MAX; 4 * words];
            m[2 * words] = 0; // row 2 all masked
            m
        }),
    }
}

/// Rows of `vocab` values where every third row weighs nothing (-inf or NaN logits; zero,
/// negative or NaN probabilities); the others hostile logits or probabilities.
pub fn weightless_rows(rng: &mut Rng, rows: usize, vocab: usize, logits: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        for _ in 0..vocab {
            out.push(if r % 3 == 0 {
                if logits {
                    rng.pick(&[f32::NEG_INFINITY, f32::NAN])
                } else {
                    rng.pick(&[0.0, -0.5, f32::NAN])
                }
            } else if logits {
                logit(rng, true)
            } else {
                prob(rng, true)
            });
        }
    }
    out
}

/// The sampling ops on given rows with a `fallback` input, as host data.
#[derive(Clone, Debug)]
pub struct SampleCase {
    /// The rows as f32 values (converted to `dtype`).
    pub values: Vec<f32>,
    /// The float dtype of the rows.
    pub dtype: DType,
    /// Whether the rows are logits (weighed at `temperature`).
    pub logits: bool,
    /// The matrix shape.
    pub shape: RowShape,
    /// Per-row temperatures (logits rows).
    pub temperature: Vec<f32>,
    /// Per-row `top_k`.
    pub top_k: Vec<i32>,
    /// Per-row `top_p`.
    pub top_p: Vec<f32>,
    /// Per-row seeds.
    pub seed: Vec<u64>,
    /// Per-row fallbacks.
    pub fallback: Vec<i32>,
    /// `top_p_candidates`' row-to-slot map, if any.
    pub batch_id: Option<Vec<i32>>,
    /// Candidates per row.
    pub candidates: usize,
}

impl SampleCase {
    /// Random sampling parameters for `values` (top_k of -1 to 4, top_p of 0.1 to 1, temperatures
    /// of 0, 1/2, 1 and 2) with `fallback`; `hostile`: some fallbacks out of range.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rng: &mut Rng,
        values: Vec<f32>,
        dtype: DType,
        logits: bool,
        shape: RowShape,
        mut fallback: Vec<i32>,
        batch_id: Option<Vec<i32>>,
        hostile: bool,
    ) -> Self {
        let rows = shape.rows;
        if hostile {
            for f in fallback.iter_mut() {
                if rng.chance(1, 5) {
                    *f = rng.pick(&[-7, shape.vocab as i32 + 3, i32::MIN]);
                }
            }
        }
        SampleCase {
            values,
            dtype,
            logits,
            shape,
            temperature: (0..rows).map(|_| rng.pick(&[1.0, 0.5, 0.0, 2.0])).collect(),
            top_k: (0..rows).map(|_| rng.range(-1, 4) as i32).collect(),
            top_p: (0..rows)
                .map(|_| rng.pick(&[1.0, 0.7, 0.3, 0.95, 0.5, 0.9, 0.1]))
                .collect(),
            seed: (0..rows).map(|_| rng.next_u64()).collect(),
            fallback,
            batch_id,
            candidates: 4,
        }
    }
}

/// Sampled tokens and candidates (ids, score bits, lens).
pub type SampleOut = (Vec<i32>, Vec<i32>, Vec<u32>, Vec<i32>);

/// `top_k_top_p_sample` and `top_p_candidates` of `c` on `device`.
pub fn run_sampling(device: &dyn Device, c: &SampleCase) -> Result<SampleOut> {
    let rows = c.shape.rows;
    let m = upload_scores(device, &c.values, c.dtype)?;
    let t = device.upload(&c.temperature)?;
    let (k, p, s, f) = (
        device.upload(&c.top_k)?,
        device.upload(&c.top_p)?,
        device.upload(&c.seed)?,
        device.upload(&c.fallback)?,
    );
    let batch_id = c
        .batch_id
        .as_deref()
        .map(|b| device.upload(b))
        .transpose()?;
    let scores = if c.logits {
        Scores::logits(&m, &t)
    } else {
        Scores::probs(&m)
    };
    let mut tokens = device.alloc::<i32>(rows)?;
    device.top_k_top_p_sample(
        &SampleInputs::new(scores, &k, &p, &s).with_fallback(Some(&f)),
        &mut tokens,
        &SampleParams::new(c.shape),
    )?;
    let n = c.candidates;
    let mut ids = device.alloc::<i32>(rows * n)?;
    let mut sc = device.alloc::<f32>(rows * n)?;
    let mut lens = device.alloc::<i32>(rows)?;
    device.top_p_candidates(
        &CandidatesInputs::new(scores, &p)
            .with_batch_id(batch_id.as_ref())
            .with_fallback(Some(&f)),
        &mut CandidatesOutputs {
            ids: &mut ids,
            scores: &mut sc,
            lens: &mut lens,
        },
        &CandidatesParams::new(c.shape, n),
    )?;
    device.synchronize()?;
    let sc: Vec<f32> = device.download(&sc)?;
    Ok((
        device.download(&tokens)?,
        device.download(&ids)?,
        sc.iter().map(|x| x.to_bits()).collect(),
        device.download(&lens)?,
    ))
}

/// Runs `c` on `device` and on `reference` and compares the outputs.
pub fn compare_sampling(
    device: &dyn Device,
    reference: &dyn Device,
    c: &SampleCase,
    what: &str,
) -> std::result::Result<(), String> {
    let want = run_sampling(reference, c).map_err(|e| format!("{what}: reference: {e}"))?;
    let got = run_sampling(device, c).map_err(|e| format!("{what}: device: {e}"))?;
    if got != want {
        return Err(format!(
            "{what}: fallback {:?}\n got {got:?}\n expected {want:?}",
            c.fallback
        ));
    }
    Ok(())
}

/// The host inputs of one `update_state` call.
#[derive(Clone, Debug)]
pub struct StateCase {
    /// The batch shape.
    pub dims: BatchDims,
    /// `max_model_len`: the row length of `token_ids_all`.
    pub mml: usize,
    /// The vocabulary of `token_counts`.
    pub vocab: usize,
    /// `[max_bsz, S]`: the emitted tokens.
    pub accept_tokens: Vec<i32>,
    /// Per-slot blocked flags.
    pub is_block: Vec<u8>,
    /// Prompt length per slot.
    pub prompt_lens: Vec<i32>,
    /// Per-slot generation limits.
    pub max_dec_len: Vec<i32>,
    /// The end tokens.
    pub end_tokens: Vec<i32>,
    /// Per-slot emitted counts.
    pub accept_num: Vec<i32>,
    /// Per-slot stop flags.
    pub stop_flags: Vec<u8>,
    /// `[max_bsz, max_model_len]`: prompt then generated tokens.
    pub token_ids_all: Vec<i32>,
    /// Tokens generated so far per slot.
    pub step_idx: Vec<i32>,
    /// Per-slot seeds.
    pub infer_seed: Vec<u64>,
    /// `[max_bsz, S]`: the last accepted token, then the drafts.
    pub draft_tokens: Vec<i32>,
    /// `seq_lens_encoder`.
    pub encoder: Vec<i32>,
    /// `seq_lens_decoder`.
    pub decoder: Vec<i32>,
    /// The token counts; `None`: `update_state` without them.
    pub token_counts: Option<Vec<i32>>,
}

impl StateCase {
    /// A random case: either 6 slots of S = 4 and histories of 12 over V of 1, 5 or 33, or a
    /// random small batch (none live now and then); hostile accepted tokens, counts at the
    /// `i32` limits, negative lengths and positions; without token counts one time in four.
    pub fn random(rng: &mut Rng) -> Self {
        let (max_bsz, real_bsz, s, mml, vocab) = if rng.chance(1, 2) {
            (6, 1 + rng.below(6), 4, 12, rng.pick(&[1usize, 5, 33]))
        } else {
            let max_bsz = 1 + rng.below(5);
            (
                max_bsz,
                rng.below(max_bsz + 1),
                1 + rng.below(4),
                2 + rng.below(8),
                1 + rng.below(40),
            )
        };
        let n = max_bsz;
        let counts_on = !rng.chance(1, 4);
        StateCase {
            dims: BatchDims::new(max_bsz, real_bsz, s),
            mml,
            vocab,
            accept_tokens: (0..n * s).map(|_| token(rng, vocab, true)).collect(),
            is_block: (0..n).map(|_| u8::from(rng.chance(1, 9))).collect(),
            prompt_lens: (0..n)
                .map(|_| rng.range(-2, mml as i64 + 1) as i32)
                .collect(),
            max_dec_len: (0..n).map(|_| rng.pick(&[3, 100, 0, 7, 20])).collect(),
            end_tokens: (0..1 + rng.below(2))
                .map(|_| {
                    let hostile = rng.chance(1, 2);
                    token(rng, vocab, hostile)
                })
                .collect(),
            accept_num: (0..n).map(|_| rng.range(-1, s as i64 + 3) as i32).collect(),
            stop_flags: (0..n).map(|_| u8::from(rng.chance(1, 9))).collect(),
            token_ids_all: (0..n * mml).map(|_| token(rng, vocab, false)).collect(),
            step_idx: (0..n).map(|_| rng.range(-2, mml as i64) as i32).collect(),
            infer_seed: (0..n).map(|_| rng.next_u64()).collect(),
            draft_tokens: (0..n * s).map(|_| token(rng, vocab, false)).collect(),
            encoder: (0..n).map(|_| rng.pick(&[0, 0, 3, 1])).collect(),
            decoder: (0..n).map(|_| rng.range(0, 30) as i32).collect(),
            token_counts: counts_on.then(|| {
                (0..n * vocab)
                    .map(|_| rng.pick(&[0, 0, 1, 3, 7, -4, i32::MAX, i32::MAX - 1, i32::MIN]))
                    .collect()
            }),
        }
    }
}

/// Every buffer `update_state` may write (the token counts empty when the case has none).
pub type StateOut = (
    Vec<i32>,
    Vec<u8>,
    Vec<i32>,
    Vec<i32>,
    Vec<u64>,
    Vec<i32>,
    Vec<i32>,
    Vec<i32>,
    Vec<i32>,
);

/// Uploads `c` to `device`, runs `update_state` and downloads every buffer it may write.
pub fn run_state(device: &dyn Device, c: &StateCase) -> Result<StateOut> {
    let mut counts = c
        .token_counts
        .as_deref()
        .map(|t| device.upload(t))
        .transpose()?;
    run_state_with_counts(device, c, counts.as_mut())
}

/// [`run_state`] with the count table already on `device` (`counts`, which should hold
/// `c.token_counts`; `None`: `update_state` without counts). The downloaded counts are the
/// buffer's after the call.
pub fn run_state_with_counts(
    device: &dyn Device,
    c: &StateCase,
    mut counts: Option<&mut Buffer>,
) -> Result<StateOut> {
    let accept_tokens = device.upload(&c.accept_tokens)?;
    let is_block = device.upload(&c.is_block)?;
    let prompt_lens = device.upload(&c.prompt_lens)?;
    let max_dec_len = device.upload(&c.max_dec_len)?;
    let end_tokens = device.upload(&c.end_tokens)?;
    let mut accept_num = device.upload(&c.accept_num)?;
    let mut stop_flags = device.upload(&c.stop_flags)?;
    let mut token_ids_all = device.upload(&c.token_ids_all)?;
    let mut step_idx = device.upload(&c.step_idx)?;
    let mut infer_seed = device.upload(&c.infer_seed)?;
    let mut draft_tokens = device.upload(&c.draft_tokens)?;
    let mut encoder = device.upload(&c.encoder)?;
    let mut decoder = device.upload(&c.decoder)?;
    device.update_state(
        &UpdateStateInputs {
            accept_tokens: &accept_tokens,
            is_block_step: &is_block,
            prompt_lens: &prompt_lens,
            max_dec_len: &max_dec_len,
            end_tokens: &end_tokens,
        },
        &mut DecodeState {
            accept_num: &mut accept_num,
            stop_flags: &mut stop_flags,
            token_ids_all: &mut token_ids_all,
            step_idx: &mut step_idx,
            infer_seed: &mut infer_seed,
            draft_tokens: &mut draft_tokens,
            seq_lens_encoder: &mut encoder,
            seq_lens_decoder: &mut decoder,
            token_counts: counts.as_deref_mut(),
        },
        &UpdateStateParams {
            dims: c.dims,
            max_model_len: c.mml,
            vocab: c.vocab,
        },
    )?;
    device.synchronize()?;
    Ok((
        device.download(&accept_num)?,
        device.download(&stop_flags)?,
        device.download(&token_ids_all)?,
        device.download(&step_idx)?,
        device.download(&infer_seed)?,
        device.download(&draft_tokens)?,
        device.download(&encoder)?,
        device.download(&decoder)?,
        counts
            .map(|t| device.download(&*t))
            .transpose()?
            .unwrap_or_default(),
    ))
}

/// Runs `c` on `device` and on `reference` and compares every output.
pub fn compare_state(
    device: &dyn Device,
    reference: &dyn Device,
    c: &StateCase,
    what: &str,
) -> std::result::Result<(), String> {
    let want = run_state(reference, c).map_err(|e| format!("{what}: reference: {e}"))?;
    let got = run_state(device, c).map_err(|e| format!("{what}: device: {e}"))?;
    if got != want {
        return Err(format!("{what}: got {got:?}\n expected {want:?} ({c:?})"));
    }
    Ok(())
}
