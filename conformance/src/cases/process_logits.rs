//! Cases of `process_logits` (`docs/semantics.md` §5.12, §4c): each parameter alone and all
//! together over random batches, hand-computed golden rows, and hostile device contents.

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::process_logits::{PENALTY_FIELDS, mask_words, penalty};
use specula_backend_api::ops::*;

use super::Size;
use super::generate::{
    Batch, Kind, Rng, batch_name, dims, f32s, float_tensor, garbage_i32s, hostile_logit_rows, i32s,
    logit_row, pick_temperature, prob_row,
};
use crate::Result;
use crate::case::{Dims, TensorSpec, Want, scores_specs};
use crate::cases::Case;
use specula_backend_api::Buffer;
use crate::exec::{LayoutBuffers, OpCase, Runner};
use crate::tensor::HostTensor;

/// The parameters of a `process_logits` case (the JSON header of a case file, beside `"op"`).
/// Inputs: the rows (`logits` + `temperature`, or `probs`), `cu_seqlens_q_output`,
/// `batch_id_per_token_output`, `token_ids_all`, `prompt_lens`, `step_idx`, `draft_tokens`,
/// `token_counts`, `prompt_mask`, `penalties`, `min_tokens`, `end_tokens`, `bias_offsets`,
/// `bias_ids`, `bias_values`, `bad_word_offsets`, `bad_words`, optional `allowed` and `bitmask`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Batch shape.
    pub dims: Dims,
    /// Rows processed (≤ the layout's capacity `real_bsz · S`).
    pub rows: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
    /// Logits with per-row temperatures (tensors `logits`, `temperature`) instead of `probs`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logits: bool,
    /// Only a block of the rows is processed (`first`, `rows`): the outputs hold its rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<(usize, usize)>,
    /// The rows are one rank's slice of sharded rows (`first`, `len`; `docs/semantics.md`
    /// §4d): the scores and `processed` hold the ids `[first, first + len)` of the vocabulary,
    /// every other input is whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<(usize, usize)>,
}

impl Params {
    /// The rows of the outputs: the block's, or all of them.
    fn out_rows(&self) -> usize {
        self.block.map_or(self.rows, |(_, rows)| rows)
    }

    /// The ids the rows hold: the slice, or the whole vocabulary.
    fn ids(&self) -> VocabSlice {
        match self.slice {
            Some((first, len)) => VocabSlice {
                first,
                len,
                vocab: self.vocab,
            },
            None => VocabSlice::whole(self.vocab),
        }
    }
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let width = self.ids().len;
        let mut specs = scores_specs(self.logits, ("probs", "logits"), self.rows, width);
        specs.extend(processing_specs(
            self.dims,
            self.rows,
            self.vocab,
            self.max_model_len,
        ));
        specs
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let Params {
            dims,
            rows,
            vocab,
            max_model_len,
            logits,
            block,
            slice,
        } = *self;
        let out_rows = self.out_rows();
        let device = r.device();
        let buffers = ProcessingBuffers::load(r)?;
        let scores = r.scores(logits, "probs", "logits")?;
        let [processed, fallback] = r.outputs([
            ("processed", DType::F32, &[out_rows, self.ids().len]),
            ("fallback", DType::I32, &[out_rows]),
        ])?;
        let processing = buffers.processing(dims, max_model_len);
        let shape = RowShape { rows, vocab };
        device.process_logits(
            &processing.inputs(scores.scores()),
            &mut ProcessOutputs {
                processed,
                fallback,
            },
            &ProcessParams {
                block: block.map(|(first, rows)| RowBlock { first, rows }),
                slice: slice.map(|_| self.ids()),
                ..processing.params(shape)
            },
        )?;
        Ok(())
    }
}

/// The tensors of the processing of `rows` rows (every input of `process_logits` but the
/// scores).
pub(crate) fn processing_specs(
    dims: Dims,
    rows: usize,
    vocab: usize,
    max_model_len: usize,
) -> Vec<TensorSpec> {
    let (n, s, v) = (dims.max_bsz, dims.max_step_tokens, vocab);
    let words = mask_words(v);
    vec![
        TensorSpec::i32("cu_seqlens_q_output", dims.real_bsz + 1),
        TensorSpec::i32("batch_id_per_token_output", rows).at_least(),
        TensorSpec::i32("token_ids_all", n * max_model_len),
        TensorSpec::i32("prompt_lens", n),
        TensorSpec::i32("step_idx", n),
        TensorSpec::i32("draft_tokens", n * s),
        TensorSpec::i32("token_counts", n * v),
        TensorSpec::new("prompt_mask", Want::Is(DType::U32), n * words),
        TensorSpec::new("penalties", Want::Is(DType::F32), n * PENALTY_FIELDS),
        TensorSpec::i32("min_tokens", n),
        TensorSpec::i32("end_tokens", 1).at_least(),
        TensorSpec::i32("bias_offsets", n + 1),
        TensorSpec::i32("bias_ids", 1).at_least(),
        TensorSpec::new("bias_values", Want::Is(DType::F32), 1).at_least(),
        TensorSpec::i32("bad_word_offsets", n + 1),
        TensorSpec::i32("bad_words", 1).at_least(),
        TensorSpec::new("allowed", Want::Is(DType::U32), n * words).optional(),
        TensorSpec::new("bitmask", Want::Is(DType::U32), rows * words).optional(),
    ]
}

/// The processing inputs of a case on the device, with their host copies.
pub(crate) struct ProcessingBuffers {
    layout: LayoutBuffers,
    history: [Buffer; 6],
    tables: ProcessingTables,
    end_tokens: Buffer,
    allowed: Option<Buffer>,
    bitmask: Option<Buffer>,
    host: HostCopies,
}

impl ProcessingBuffers {
    /// Uploads the case's processing inputs ([`processing_specs`]).
    pub(crate) fn load(r: &mut Runner<'_>) -> Result<Self> {
        let host = HostCopies {
            penalties: r.host::<f32>("penalties")?,
            bias_ids: r.host::<i32>("bias_ids")?,
            bias_values: r.host::<f32>("bias_values")?,
            bad_words: r.host::<i32>("bad_words")?,
            bias_used: r.host::<i32>("bias_offsets")?,
            words_used: r.host::<i32>("bad_word_offsets")?,
        };
        Ok(ProcessingBuffers {
            layout: r.layout()?,
            history: r.inputs([
                "token_ids_all",
                "prompt_lens",
                "step_idx",
                "draft_tokens",
                "token_counts",
                "prompt_mask",
            ])?,
            tables: ProcessingTables {
                penalties: r.input("penalties")?,
                min_tokens: r.input("min_tokens")?,
                bias_offsets: r.input("bias_offsets")?,
                bias_ids: r.input("bias_ids")?,
                bias_values: r.input("bias_values")?,
                bad_word_offsets: r.input("bad_word_offsets")?,
                bad_words: r.input("bad_words")?,
            },
            end_tokens: r.input("end_tokens")?,
            allowed: r.optional("allowed")?,
            bitmask: r.optional("bitmask")?,
            host,
        })
    }

    /// The processing of a `dims` batch whose `token_ids_all` rows hold `max_model_len` tokens.
    pub(crate) fn processing(&self, dims: Dims, max_model_len: usize) -> RowProcessing<'_> {
        let [token_ids_all, prompt_lens, step_idx, draft_tokens, counts, prompt] = &self.history;
        RowProcessing {
            layout: self.layout.output_layout(),
            history: TokenHistory {
                token_ids_all,
                prompt_lens,
                step_idx,
                draft_tokens,
                token_counts: counts,
                prompt_mask: prompt,
            },
            slots: self.tables.slots(&self.end_tokens, self.allowed.as_ref()),
            bitmask: self.bitmask.as_ref(),
            dims: dims.into(),
            max_model_len,
            host: self.host.view(),
        }
    }
}

/// Host copies of the validated values (none for device-only cases). The lists' host copies are
/// the entries in use: up to the last offset.
struct HostCopies {
    penalties: Option<Vec<f32>>,
    bias_ids: Option<Vec<i32>>,
    bias_values: Option<Vec<f32>>,
    bad_words: Option<Vec<i32>>,
    bias_used: Option<Vec<i32>>,
    words_used: Option<Vec<i32>>,
}

impl HostCopies {
    fn view(&self) -> Option<HostProcessing<'_>> {
        let used = |offsets: &Option<Vec<i32>>| {
            offsets
                .as_ref()
                .and_then(|o| o.last())
                .map_or(0, |&n| usize::try_from(n).unwrap_or(0))
        };
        let (nb, nw) = (used(&self.bias_used), used(&self.words_used));
        Some(HostProcessing {
            penalties: self.penalties.as_deref()?,
            bias_ids: self.bias_ids.as_deref()?.get(..nb)?,
            bias_values: self.bias_values.as_deref()?.get(..nb)?,
            bad_words: self.bad_words.as_deref()?.get(..nw)?,
        })
    }
}

/// Which parameters a generated case turns on.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Features {
    bias: bool,
    repetition: bool,
    frequency: bool,
    min_p: bool,
    min_tokens: bool,
    bad_words: bool,
    allowed: bool,
    bitmask: bool,
}

impl Features {
    const ALL: Features = Features {
        bias: true,
        repetition: true,
        frequency: true,
        min_p: true,
        min_tokens: true,
        bad_words: true,
        allowed: true,
        bitmask: true,
    };

    /// Each feature alone, by name.
    fn singles() -> Vec<(&'static str, Features)> {
        let none = Features::default();
        vec![
            ("none", none),
            ("bias", Features { bias: true, ..none }),
            (
                "repetition",
                Features {
                    repetition: true,
                    ..none
                },
            ),
            (
                "frequency_presence",
                Features {
                    frequency: true,
                    ..none
                },
            ),
            (
                "min_p",
                Features {
                    min_p: true,
                    ..none
                },
            ),
            (
                "min_tokens",
                Features {
                    min_tokens: true,
                    ..none
                },
            ),
            (
                "bad_words",
                Features {
                    bad_words: true,
                    ..none
                },
            ),
            (
                "allowed",
                Features {
                    allowed: true,
                    ..none
                },
            ),
            (
                "bitmask",
                Features {
                    bitmask: true,
                    ..none
                },
            ),
            ("all", Features::ALL),
        ]
    }
}

/// One slot's bias entries.
type BiasList = Vec<(i32, f32)>;

/// Every input of a case, on the host.
#[derive(Clone, Debug)]
pub(crate) struct Setup {
    pub(crate) batch: Batch,
    pub(crate) vocab: usize,
    pub(crate) max_model_len: usize,
    pub(crate) rows: usize,
    pub(crate) dtype: DType,
    pub(crate) scores: Vec<f32>,
    pub(crate) temperature: Option<Vec<f32>>,
    pub(crate) batch_id: Vec<i32>,
    pub(crate) cu_out: Vec<i32>,
    pub(crate) token_ids_all: Vec<i32>,
    pub(crate) prompt_lens: Vec<i32>,
    pub(crate) step_idx: Vec<i32>,
    pub(crate) draft_tokens: Vec<i32>,
    pub(crate) token_counts: Vec<i32>,
    pub(crate) prompt_mask: Vec<u32>,
    pub(crate) penalties: Vec<f32>,
    pub(crate) min_tokens: Vec<i32>,
    pub(crate) end_tokens: Vec<i32>,
    pub(crate) bias_offsets: Vec<i32>,
    pub(crate) bias_ids: Vec<i32>,
    pub(crate) bias_values: Vec<f32>,
    pub(crate) bad_word_offsets: Vec<i32>,
    pub(crate) bad_words: Vec<i32>,
    pub(crate) allowed: Option<Vec<u32>>,
    pub(crate) bitmask: Option<Vec<u32>>,
}

fn u32s(v: &[u32]) -> HostTensor {
    HostTensor::vector(v)
}

/// Sets bit `v` of a mask row.
fn set_bit(mask: &mut [u32], v: usize) {
    mask[v / 32] |= 1 << (v % 32);
}

/// A list of per-slot lists flattened, with its `[max_bsz + 1]` offsets (at least one element,
/// so an empty list is one unused `pad`).
fn flatten<T: Copy>(lists: &[Vec<T>], pad: T) -> (Vec<i32>, Vec<T>) {
    let mut offsets = vec![0];
    let mut flat = Vec::new();
    for list in lists {
        flat.extend_from_slice(list);
        offsets.push(flat.len() as i32);
    }
    if flat.is_empty() {
        flat.push(pad);
    }
    (offsets, flat)
}

/// Per-slot bias lists flattened: `bias_offsets`, `bias_ids` and `bias_values` (see [`flatten`]).
fn flatten_biases(biases: &[BiasList]) -> (Vec<i32>, Vec<i32>, Vec<f32>) {
    let ids: Vec<Vec<i32>> = biases.iter().map(|l| l.iter().map(|e| e.0).collect()).collect();
    let values: Vec<Vec<f32>> = biases.iter().map(|l| l.iter().map(|e| e.1).collect()).collect();
    let (offsets, ids) = flatten(&ids, 0);
    (offsets, ids, flatten(&values, 0.0).1)
}

impl Setup {
    /// A random batch with the parameters of `features` on: histories with repeats (so that the
    /// penalties meet counts above 1), drafts that repeat generated tokens, bad words that end in
    /// the drafts, masks that sometimes leave one token or none.
    pub(crate) fn random(
        rng: &mut Rng,
        d: Dims,
        vocab: usize,
        logits: bool,
        dtype: DType,
        f: Features,
    ) -> Self {
        let max_model_len = 48;
        let batch = Batch::random(rng, d, 8);
        let (n, s) = (d.max_bsz, d.max_step_tokens);
        let rows = batch.capacity();
        let words = mask_words(vocab);
        // A small pool of tokens, so histories, drafts, bans and biases meet.
        let pool: Vec<i32> = (0..6.min(vocab)).map(|_| rng.token(vocab)).collect();
        let token = |rng: &mut Rng| {
            if rng.chance(7, 10) {
                rng.pick(&pool)
            } else {
                rng.token(vocab)
            }
        };
        let mut st = Setup {
            batch: batch.clone(),
            vocab,
            max_model_len,
            rows,
            dtype,
            scores: Vec::new(),
            temperature: None,
            batch_id: batch.batch_id(rows),
            cu_out: batch.cu_seqlens_q_output(),
            token_ids_all: (0..n * max_model_len).map(|_| token(rng)).collect(),
            prompt_lens: vec![0; n],
            step_idx: vec![0; n],
            draft_tokens: (0..n * s).map(|_| token(rng)).collect(),
            token_counts: vec![0; n * vocab],
            prompt_mask: vec![0; n * words],
            penalties: [1.0, 1.0, 0.0, 0.0, 0.0].repeat(n),
            min_tokens: vec![0; n],
            end_tokens: (0..rng.range(1, 3)).map(|_| token(rng)).collect(),
            bias_offsets: Vec::new(),
            bias_ids: Vec::new(),
            bias_values: Vec::new(),
            bad_word_offsets: Vec::new(),
            bad_words: Vec::new(),
            allowed: None,
            bitmask: None,
        };
        let mut biases = Vec::new();
        let mut bans = Vec::new();
        for b in 0..n {
            let prompt = rng.range(1, 12);
            let step = if batch.kind(b) == Kind::Prefill {
                rng.below(2)
            } else {
                rng.below(24)
            };
            st.prompt_lens[b] = prompt as i32;
            st.step_idx[b] = step as i32;
            let row = &st.token_ids_all[b * max_model_len..(b + 1) * max_model_len];
            for &t in &row[..prompt] {
                set_bit(&mut st.prompt_mask[b * words..(b + 1) * words], t as usize);
            }
            for &t in &row[prompt..prompt + step] {
                st.token_counts[b * vocab + t as usize] += 1;
            }
            st.slot_parameters(rng, b, f, &pool, (&mut biases, &mut bans));
        }
        (st.bias_offsets, st.bias_ids, st.bias_values) = flatten_biases(&biases);
        (st.bad_word_offsets, st.bad_words) = flatten(&bans, 0);
        if f.allowed {
            st.allowed = Some(st.random_masks(rng, n, &pool));
        }
        if f.bitmask {
            st.bitmask = Some(st.random_masks(rng, rows, &pool));
        }
        st.fill_rows(rng, logits);
        st
    }

    /// Slot `b`'s penalties, min_tokens, bias entries and bad words.
    fn slot_parameters(
        &mut self,
        rng: &mut Rng,
        b: usize,
        f: Features,
        pool: &[i32],
        (biases, bans): (&mut Vec<BiasList>, &mut Vec<Vec<i32>>),
    ) {
        let p = &mut self.penalties[b * PENALTY_FIELDS..(b + 1) * PENALTY_FIELDS];
        if f.repetition {
            let alpha: f32 = rng.pick(&[1.0, 1.1, 1.3, 0.8, 2.0, 1.05]);
            p[penalty::REPETITION] = alpha;
            p[penalty::REPETITION_INVERSE] = 1.0 / alpha;
        }
        if f.frequency {
            p[penalty::FREQUENCY] = rng.pick(&[0.0, 0.1, 0.5, 1.25, -0.3]);
            p[penalty::PRESENCE] = rng.pick(&[0.0, 0.2, 1.0, -0.5]);
        }
        if f.min_p {
            p[penalty::MIN_P] = rng.pick(&[0.0, 0.05, 0.1, 0.3, 1.0, 1e-30]);
        }
        if f.min_tokens {
            self.min_tokens[b] = self.step_idx[b] + rng.range(0, 4) as i32;
        }
        let mut bias = Vec::new();
        if f.bias {
            for _ in 0..rng.below(5) {
                let t = if rng.chance(3, 5) {
                    rng.pick(pool)
                } else {
                    rng.token(self.vocab)
                };
                bias.push((t, rng.pick(&[-100.0, -2.5, 0.5, 3.0, 1e-3, 8.0])));
            }
        }
        biases.push(bias);
        let mut list = Vec::new();
        if f.bad_words {
            for _ in 0..rng.below(4) {
                let n = rng.range(1, 4);
                list.push(n as i32);
                // Entries ending like the history (the last generated token, then the drafts).
                let s = self.batch.dims.max_step_tokens;
                let drafts = &self.draft_tokens[b * s + 1..(b + 1) * s];
                for k in 0..n {
                    let t = match (rng.chance(1, 2), drafts.get(k)) {
                        (true, Some(&d)) => d,
                        _ => rng.pick(pool),
                    };
                    list.push(t);
                }
            }
        }
        bans.push(list);
    }

    /// `count` mask rows: mostly dense, some allowing a handful of tokens, some one token, some
    /// none.
    fn random_masks(&self, rng: &mut Rng, count: usize, pool: &[i32]) -> Vec<u32> {
        let words = mask_words(self.vocab);
        let mut out = vec![0u32; count * words];
        for row in out.chunks_mut(words) {
            match rng.below(10) {
                0 => {}
                1 => set_bit(row, rng.token(self.vocab) as usize),
                2..5 => pool.iter().for_each(|&t| set_bit(row, t as usize)),
                _ => {
                    for v in 0..self.vocab {
                        if !rng.chance(1, 5) {
                            set_bit(row, v);
                        }
                    }
                }
            }
        }
        out
    }

    /// The rows: logits (with temperatures, some rows all −inf but one masked token) or
    /// probabilities.
    fn fill_rows(&mut self, rng: &mut Rng, logits: bool) {
        let v = self.vocab;
        let rows = self.rows;
        if logits {
            self.scores = (0..rows).flat_map(|_| logit_row(rng, v)).collect();
            for r in 0..rows {
                if rng.chance(1, 20) {
                    self.scores[r * v..(r + 1) * v].fill(f32::NEG_INFINITY);
                }
            }
            self.temperature = Some((0..rows).map(|_| pick_temperature(rng)).collect());
        } else {
            self.scores = (0..rows).flat_map(|_| prob_row(rng, v)).collect();
        }
    }

    /// The case.
    pub(crate) fn case(&self, name: String) -> Case {
        self.block_case(name, None)
    }

    /// The case, processing only the block `(first, rows)` of the rows when one is given.
    pub(crate) fn block_case(&self, name: String, block: Option<(usize, usize)>) -> Case {
        self.with_inputs(Case::new(name, self.params(block, None)))
    }

    /// The parameters of the setup's case, processing the rows of `block` or the slice `slice`
    /// of each row when given.
    fn params(&self, block: Option<(usize, usize)>, slice: Option<(usize, usize)>) -> Params {
        Params {
            dims: self.batch.dims,
            rows: self.rows,
            vocab: self.vocab,
            max_model_len: self.max_model_len,
            logits: self.temperature.is_some(),
            block,
            slice,
        }
    }

    /// The case of one rank's slice `(first, len)` of the rows (`docs/semantics.md` §4d).
    pub(crate) fn slice_case(&self, name: String, (first, len): (usize, usize)) -> Case {
        let params = self.params(None, Some((first, len)));
        let cut: Vec<f32> = self
            .scores
            .chunks(self.vocab)
            .flat_map(|row| row[first..first + len].to_vec())
            .collect();
        let case = self.with_scores(Case::new(name, params), (&cut, len));
        self.with_processing(case)
    }

    /// `case` with every input of the setup: the rows and their processing.
    pub(crate) fn with_inputs(&self, case: Case) -> Case {
        let case = self.with_scores(case, (&self.scores, self.vocab));
        self.with_processing(case)
    }

    /// `case` with `scores`, `[rows, width]` (the logits with their temperatures, or the
    /// probabilities).
    fn with_scores(&self, case: Case, (scores, width): (&[f32], usize)) -> Case {
        let shape = [self.rows, width];
        match &self.temperature {
            Some(t) => case
                .with("logits", float_tensor(self.dtype, &shape, scores))
                .with("temperature", f32s(t)),
            None => case.with("probs", float_tensor(self.dtype, &shape, scores)),
        }
    }

    /// `case` with every input of the setup's processing (all but the rows).
    fn with_processing(&self, mut case: Case) -> Case {
        case = case
            .with("cu_seqlens_q_output", i32s(&self.cu_out))
            .with("batch_id_per_token_output", i32s(&self.batch_id))
            .with("token_ids_all", i32s(&self.token_ids_all))
            .with("prompt_lens", i32s(&self.prompt_lens))
            .with("step_idx", i32s(&self.step_idx))
            .with("draft_tokens", i32s(&self.draft_tokens))
            .with("token_counts", i32s(&self.token_counts))
            .with("prompt_mask", u32s(&self.prompt_mask))
            .with("penalties", f32s(&self.penalties))
            .with("min_tokens", i32s(&self.min_tokens))
            .with("end_tokens", i32s(&self.end_tokens))
            .with("bias_offsets", i32s(&self.bias_offsets))
            .with("bias_ids", i32s(&self.bias_ids))
            .with("bias_values", f32s(&self.bias_values))
            .with("bad_word_offsets", i32s(&self.bad_word_offsets))
            .with("bad_words", i32s(&self.bad_words));
        if let Some(allowed) = &self.allowed {
            case = case.with("allowed", u32s(allowed));
        }
        if let Some(bitmask) = &self.bitmask {
            case = case.with("bitmask", u32s(bitmask));
        }
        case
    }
}

/// Every case of `process_logits`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for (name, st) in random_setups(size) {
        if name.starts_with("all_") && st.rows > 0 {
            out.extend(block_cases(&st, &name));
            out.extend(slice_cases(&st, &name));
        }
        out.push(st.case(name));
    }
    out.extend(hostile_setups().into_iter().map(|(name, st)| st.case(name)));
    let (name, st) = penalized_leaders();
    out.push(st.case(name));
    out
}

/// The random setups of the cases, by case name: each parameter alone and all of them, over
/// batches of several shapes, logits and probabilities.
pub(crate) fn random_setups(size: Size) -> Vec<(String, Setup)> {
    let mut out = Vec::new();
    let mut shapes = vec![
        (dims(4, 3, 3), 37),
        (dims(9, 8, 5), 100),
        (dims(6, 6, 4), 1000),
    ];
    shapes.push((
        dims(2, 2, 3),
        if size == Size::Full { 151_936 } else { 32_000 },
    ));
    if size == Size::Full {
        shapes.push((dims(64, 64, 7), 32_000));
    }
    for (i, (d, vocab)) in shapes.into_iter().enumerate() {
        for (name, f) in Features::singles() {
            for logits in [true, false] {
                if !logits && (f.bias || f.repetition || f.frequency) {
                    continue;
                }
                let dtype = [DType::F32, DType::F16, DType::BF16][(i + name.len()) % 3];
                let mut rng = Rng::new(
                    &format!("process_logits/{name}"),
                    (i * 2 + usize::from(logits)) as u64,
                );
                let st = Setup::random(&mut rng, d, vocab, logits, dtype, f);
                let kind = if logits { "logits" } else { "probs" };
                out.push((
                    format!("{name}_{kind}_{}_v{vocab}_{dtype}", batch_name(&d)),
                    st,
                ));
            }
        }
    }
    out
}

/// Rows whose largest logits are the tokens a penalty lowers (each slot's counted and prompt
/// tokens and drafts), every other rule on, under penalties that only lower (so a backend may
/// skip the tokens whose input stays below its top-k floor): which of them stay at the top is
/// the penalties' doing, at vocabulary 4099, far past the first chunks of a row.
pub(crate) fn penalized_leaders() -> (String, Setup) {
    let mut rng = Rng::new("process_logits/penalized_leaders", 0);
    let (d, vocab) = (dims(8, 8, 4), 4099);
    // Dense masks only (each word drops a token or two), so that most leaders stay.
    let f = Features {
        allowed: false,
        bitmask: false,
        ..Features::ALL
    };
    let mut st = Setup::random(&mut rng, d, vocab, true, DType::F32, f);
    let mut dense_masks = |count: usize| -> Vec<u32> {
        (0..count * mask_words(vocab))
            .map(|_| !(1u32 << rng.below(32)) & !(1u32 << rng.below(32)))
            .collect()
    };
    st.allowed = Some(dense_masks(d.max_bsz));
    st.bitmask = Some(dense_masks(st.rows));
    for p in st.penalties.chunks_exact_mut(PENALTY_FIELDS) {
        let alpha = rng.pick(&[1.0, 1.5, 3.0]);
        p[penalty::REPETITION] = alpha;
        p[penalty::REPETITION_INVERSE] = 1.0 / alpha;
        p[penalty::FREQUENCY] = rng.pick(&[0.0, 0.75, 4.0]);
        p[penalty::PRESENCE] = rng.pick(&[0.0, 0.5, 2.0]);
    }
    for r in 0..st.rows {
        let Some(b) = usize::try_from(st.batch_id[r]).ok().filter(|&b| b < d.real_bsz) else {
            continue;
        };
        let row = &mut st.scores[r * vocab..(r + 1) * vocab];
        let top = row.iter().copied().fold(0.0f32, f32::max);
        let s = d.max_step_tokens;
        let drafts = st.draft_tokens[b * s..(b + 1) * s].iter();
        let words = &st.prompt_mask[b * mask_words(vocab)..(b + 1) * mask_words(vocab)];
        for v in 0..vocab {
            let counted = st.token_counts[b * vocab + v] > 0 || words[v / 32] >> (v % 32) & 1 == 1;
            if counted || drafts.clone().any(|&t| t as usize == v) {
                row[v] = top + (1 + rng.below(40)) as f32 * 0.25;
            }
        }
        // The tokens a sparse rule names (biased, banned, end tokens) above them all, so that
        // one offered at a value its rule does not give would be drawn.
        let list = |offsets: &[i32], all: &[i32]| {
            let range = offsets[b].max(0) as usize..offsets[b + 1].max(0) as usize;
            all.get(range).unwrap_or_default().to_vec()
        };
        let mut named = list(&st.bias_offsets, &st.bias_ids);
        named.extend(list(&st.bad_word_offsets, &st.bad_words));
        named.extend(&st.end_tokens);
        for t in named {
            if let Some(x) = usize::try_from(t).ok().and_then(|v| row.get_mut(v)) {
                *x = top + 10.0 + rng.below(32) as f32 * 0.25;
            }
        }
    }
    ("penalized_leaders_logits_4099_f32".to_owned(), st)
}

/// Blocks of the rows of an "all" case: a middle block, the last row alone, and an empty block
/// at the end (nothing is written).
fn block_cases(st: &Setup, name: &str) -> Vec<Case> {
    let rows = st.rows;
    let first = rows / 3;
    [
        ("middle", (first, (rows - first).div_ceil(2))),
        ("last_row", (rows - 1, 1)),
        ("empty", (rows, 0)),
    ]
    .into_iter()
    .map(|(which, block)| st.block_case(format!("{name}_block_{which}"), Some(block)))
    .collect()
}

/// Slices of the ids of an "all" case (`docs/semantics.md` §4d): the first token alone, a
/// middle slice starting and ending inside a mask word, and the last tokens.
fn slice_cases(st: &Setup, name: &str) -> Vec<Case> {
    let v = st.vocab;
    let middle = (v / 3 + 5).min(v - 1);
    [
        ("first_token", (0, 1)),
        ("middle", (middle, ((v - middle) / 2).max(1))),
        ("last", (v - v.div_ceil(4), v.div_ceil(4))),
    ]
    .into_iter()
    .map(|(which, slice)| st.slice_case(format!("{name}_slice_{which}"), slice))
    .collect()
}

/// Hand-computed rows: one slot, prompt `[1]`, generated `[2, 2]`, one draft `3`; vocabulary 6.
fn golden() -> Vec<Case> {
    let [base, masked, min_p] = golden_setups();
    // Row 0 (history [2, 2]): 1 in the prompt → 0.5; 2 counted twice → 1.5 − 0.5 − 1 = 0;
    // 4 biased → 2.0; 5 an end token before min_tokens → masked; 0 banned.
    // Row 1 (history [2, 2, 3]): 3 counted once → −1·2 − 0.25 − 1 = −3.25; 4 banned.
    let ninf = f32::NEG_INFINITY;
    let mut out = vec![
        base.case("golden::every_rule_two_rows".into())
            .expect(
                "processed",
                float_tensor(
                    DType::F32,
                    &[2, 6],
                    &[
                        ninf, 1.0, 0.0, -1.0, 2.0, ninf, ninf, 1.0, 0.0, -3.25, ninf, ninf,
                    ],
                ),
            )
            .expect("fallback", i32s(&[4, 1])),
    ];
    // One rank's slices of the same rows (§4d): ids 2 .. 5 keep their values, the fallback is
    // the slice's first unmasked token in rank order; id 0 alone is masked in both rows.
    out.push(
        base.slice_case("golden::every_rule_slice_2_5".into(), (2, 3))
            .expect(
                "processed",
                float_tensor(DType::F32, &[2, 3], &[0.0, -1.0, 2.0, 0.0, -3.25, ninf]),
            )
            .expect("fallback", i32s(&[4, 2])),
    );
    out.push(
        base.slice_case("golden::every_rule_slice_0_1_masked".into(), (0, 1))
            .expect("processed", float_tensor(DType::F32, &[2, 1], &[ninf, ninf]))
            .expect("fallback", i32s(&[-1, -1])),
    );
    out.push(
        masked
            .case("golden::all_masked_and_all_minus_inf".into())
            .expect("processed", float_tensor(DType::F32, &[2, 6], &[ninf; 12]))
            .expect("fallback", i32s(&[-1, 2])),
    );
    out.extend(rank_order_golden());
    out.push(infinite_parameters_golden());
    out.push(
        min_p
            .case("golden::min_p_half".into())
            .expect(
                "processed",
                float_tensor(
                    DType::F32,
                    &[2, 6],
                    &[
                        ninf, ninf, 3.0, 2.5, ninf, ninf, ninf, ninf, 3.0, 2.5, ninf, ninf,
                    ],
                ),
            )
            .expect("fallback", i32s(&[2, 2])),
    );
    out
}

/// `2^64`: the largest magnitude a logit or an additive parameter is read as (§4b step 1, §4c).
const HUGE: f32 = 18_446_744_073_709_551_616.0;

/// Neutral penalties: α = α⁻¹ = 1, β = γ = 0, no min_p.
const NEUTRAL: [f32; PENALTY_FIELDS] = [1.0, 1.0, 0.0, 0.0, 0.0];

/// One decode slot per row (S = 1) over a vocabulary of 3: row `b` is slot `b`, with logits
/// `rows[b]` at temperature `temperature[b]`, penalties `penalties[b]` and the bias entry
/// `bias[b]`. Every slot's prompt is `[0]` and its one generated token `0`, so token 0 is in the
/// prompt and counted once (the repetition, frequency and presence steps apply to it).
pub(crate) fn one_row_slots(
    rows: &[[f32; 3]],
    temperature: &[f32],
    penalties: &[[f32; PENALTY_FIELDS]],
    bias: &[Option<(i32, f32)>],
) -> Setup {
    let n = rows.len();
    let d = dims(n, n, 1);
    let batch = Batch::new(d, vec![1; n], vec![0; n]);
    let vocab = 3;
    let biases: Vec<BiasList> = bias.iter().map(|e| e.iter().copied().collect()).collect();
    let (bias_offsets, bias_ids, bias_values) = flatten_biases(&biases);
    Setup {
        batch: batch.clone(),
        vocab,
        max_model_len: 4,
        rows: n,
        dtype: DType::F32,
        scores: rows.iter().flatten().copied().collect(),
        temperature: Some(temperature.to_vec()),
        batch_id: batch.batch_id(n),
        cu_out: batch.cu_seqlens_q_output(),
        token_ids_all: vec![0; n * 4],
        prompt_lens: vec![1; n],
        step_idx: vec![1; n],
        draft_tokens: vec![0; n],
        token_counts: (0..n).flat_map(|_| [1, 0, 0]).collect(),
        prompt_mask: vec![1; n],
        penalties: penalties.iter().flatten().copied().collect(),
        min_tokens: vec![0; n],
        end_tokens: vec![2],
        bias_offsets,
        bias_ids,
        bias_values,
        bad_word_offsets: vec![0; n + 1],
        bad_words: vec![0],
        allowed: None,
        bitmask: None,
    }
}

/// The rank order of processed rows (`docs/semantics.md` §4b step 1, §4c): a token whose float
/// steps leave its reading as it was keeps its logit, so logits that read alike (both `2^64`,
/// both +0) keep their order and the fallback is the argmax. Rows: `[1e30, 3e38, −1]` and
/// `[1e-30, 2e-30, −5]` under neutral penalties (token 0 counted and in the prompt); `[3e38,
/// 1e30, −1]` with a bias of +1 on token 0 (`2^64 ⊕ 1 = 2^64`: unchanged); NaN and −inf; −0 and
/// +0 (one rank). The setup at T = 0 is also sampled (the tokens are the argmax).
pub(crate) fn rank_order_setup(temperature: f32) -> Setup {
    let nan = f32::NAN;
    let ninf = f32::NEG_INFINITY;
    let rows = [
        [1e30, 3e38, -1.0],
        [1e-30, 2e-30, -5.0],
        [3e38, 1e30, -1.0],
        [nan, ninf, 0.5],
        [-0.0, 0.0, -1.0],
    ];
    let bias = [None, None, Some((0, 1.0)), None, None];
    one_row_slots(&rows, &[temperature; 5], &[NEUTRAL; 5], &bias)
}

/// The golden cases of [`rank_order_setup`].
fn rank_order_golden() -> Vec<Case> {
    let ninf = f32::NEG_INFINITY;
    let processed = [
        1e30, 3e38, -1.0, 1e-30, 2e-30, -5.0, 3e38, 1e30, -1.0, ninf, ninf, 0.5, -0.0, 0.0, -1.0,
    ];
    vec![
        rank_order_setup(1.0)
            .case("golden::rank_order_of_logits_that_read_alike".into())
            .expect("processed", float_tensor(DType::F32, &[5, 3], &processed))
            .expect("fallback", i32s(&[1, 1, 0, 2, 0])),
    ]
}

/// Device-side bias, α⁻¹, β and γ of ±inf and NaN (`docs/semantics.md` §4c: an additive
/// parameter is read with NaN → 0 and `|x| > 2^64` → ±2^64, infinities included; a repetition
/// factor outside `[2^-32, 2^32]` turns the step off), one slot each, on the row
/// `[0.5, 1, −inf]` at T = 1 (token 0 counted once and in the prompt; α = 2 where α⁻¹ is
/// hostile). The last slot has a bias of +inf under min_p = 0.5 at T = +inf, where both finite
/// tokens weigh `2^40` and stay. Device contents only: host validation refuses such values.
pub(crate) fn infinite_parameters_setup() -> Setup {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let with = |field: usize, value: f32| {
        let mut p = NEUTRAL;
        p[field] = value;
        if field == penalty::REPETITION_INVERSE {
            p[penalty::REPETITION] = 2.0;
        }
        p
    };
    let mut penalties = Vec::new();
    let mut bias = Vec::new();
    for value in [inf, -inf, nan] {
        penalties.push(NEUTRAL);
        bias.push(Some((0, value)));
    }
    for field in [
        penalty::REPETITION_INVERSE,
        penalty::FREQUENCY,
        penalty::PRESENCE,
    ] {
        for value in [inf, -inf, nan] {
            penalties.push(with(field, value));
            bias.push(None);
        }
    }
    // β = +inf with γ = −inf: −2^64, then −2^64 ⊖ −2^64 = 0 (no NaN).
    let mut both = with(penalty::FREQUENCY, inf);
    both[penalty::PRESENCE] = -inf;
    penalties.push(both);
    bias.push(None);
    // Bias +inf under min_p = 0.5 at T = +inf.
    let mut min_p = NEUTRAL;
    min_p[penalty::MIN_P] = 0.5;
    penalties.push(min_p);
    bias.push(Some((0, inf)));
    let n = penalties.len();
    let mut temperature = vec![1.0; n];
    temperature[n - 1] = inf;
    one_row_slots(&vec![[0.5, 1.0, f32::NEG_INFINITY]; n], &temperature, &penalties, &bias)
}

/// The golden case of [`infinite_parameters_setup`].
fn infinite_parameters_golden() -> Case {
    let ninf = f32::NEG_INFINITY;
    // Token 0 of each slot, in the order of the setup; tokens 1 and 2 stay 1 and −inf.
    let first = [
        HUGE, -HUGE, 0.5, // bias +inf, −inf, NaN
        0.5, 0.5, 0.5, // α⁻¹ +inf, −inf, NaN: the repetition step is off
        -HUGE, HUGE, 0.5, // β +inf, −inf, NaN
        -HUGE, HUGE, 0.5, // γ +inf, −inf, NaN
        0.0,  // β = +inf, γ = −inf
        HUGE, // bias +inf, min_p 0.5 at T = +inf
    ];
    let processed: Vec<f32> = first.iter().flat_map(|&x| [x, 1.0, ninf]).collect();
    let fallback: Vec<i32> = first.iter().map(|&x| i32::from(x < 1.0)).collect();
    infinite_parameters_setup()
        .case("golden::device_parameters_at_infinity".into())
        .device_only()
        .expect(
            "processed",
            float_tensor(DType::F32, &[first.len(), 3], &processed),
        )
        .expect("fallback", i32s(&fallback))
}

/// The setups of the golden cases: every rule on two rows; every token masked in row 0 by the
/// bitmask and row 1's only kept token −inf; min_p = 0.5 at T = 1 (keeps the tokens within
/// ln 2 of the maximum).
pub(crate) fn golden_setups() -> [Setup; 3] {
    let d = dims(1, 1, 2);
    let batch = Batch::new(d, vec![2], vec![0]);
    let base = Setup {
        batch: batch.clone(),
        vocab: 6,
        max_model_len: 8,
        rows: 2,
        dtype: DType::F32,
        scores: vec![1.0, 2.0, 3.0, -1.0, 0.5, 0.0, 1.0, 2.0, 3.0, -1.0, 0.5, 0.0],
        temperature: Some(vec![1.0, 1.0]),
        batch_id: batch.batch_id(2),
        cu_out: batch.cu_seqlens_q_output(),
        token_ids_all: vec![1, 2, 2, 0, 0, 0, 0, 0],
        prompt_lens: vec![1],
        step_idx: vec![2],
        draft_tokens: vec![2, 3],
        token_counts: vec![0, 0, 2, 0, 0, 0],
        prompt_mask: vec![0b10],
        // α = 2 (α⁻¹ = 0.5), β = 0.25, γ = 1.
        penalties: vec![2.0, 0.5, 0.25, 1.0, 0.0],
        min_tokens: vec![4],
        end_tokens: vec![5],
        bias_offsets: vec![0, 1],
        bias_ids: vec![4],
        bias_values: vec![1.5],
        // Ban 0 always; ban 4 after [2, 3] (only row 1, whose history ends with the draft 3).
        bad_word_offsets: vec![0, 6],
        bad_words: vec![1, 0, 3, 2, 3, 4],
        allowed: None,
        bitmask: None,
    };
    // Every token masked in row 0 by the bitmask; row 1's only kept token is −inf.
    let mut masked = base.clone();
    masked.scores[6 + 2] = f32::NEG_INFINITY;
    masked.bitmask = Some(vec![0, 0b100]);
    // min_p = 0.5 at T = 1 keeps the tokens within ln 2 of the maximum.
    let mut min_p = base.clone();
    min_p.penalties = vec![1.0, 1.0, 0.0, 0.0, 0.5];
    min_p.bias_offsets = vec![0, 0];
    min_p.bad_word_offsets = vec![0, 0];
    min_p.min_tokens = vec![0];
    min_p.scores = vec![1.0, 2.0, 3.0, 2.5, 2.2, 0.0, 1.0, 2.0, 3.0, 2.5, 2.2, 0.0];
    [base, masked, min_p]
}

/// Garbage in every buffer: rows of no slot, positions past `S`, offsets out of range, malformed
/// bad words, NaN / ±inf / subnormal / huge parameters and logits, ids outside the vocabulary,
/// negative and huge counts.
pub(crate) fn hostile_setups() -> Vec<(String, Setup)> {
    let mut out = Vec::new();
    for (i, (d, vocab)) in [(dims(8, 6, 4), 67), (dims(5, 5, 3), 300)]
        .into_iter()
        .enumerate()
    {
        let mut rng = Rng::new("process_logits/hostile", i as u64);
        let mut st = Setup::random(&mut rng, d, vocab, true, DType::F32, Features::ALL);
        let (n, rows) = (d.max_bsz, st.rows);
        st.scores = hostile_logit_rows(&mut rng, rows, vocab);
        st.temperature = Some(
            (0..rows)
                .map(|r| [f32::NAN, -1.0, 0.0, 1.0, f32::INFINITY, 1e-38][r % 6])
                .collect(),
        );
        st.batch_id = (0..rows)
            .map(|r| [0, -1, 1, 99, 2, i32::MIN, 3][r % 7])
            .collect();
        st.cu_out = garbage_i32s(&mut rng, d.real_bsz + 1, rows);
        st.prompt_lens = garbage_i32s(&mut rng, n, 60);
        st.step_idx = garbage_i32s(&mut rng, n, 60);
        for t in st.draft_tokens.iter_mut().step_by(2) {
            *t = rng.pick(&[-1, i32::MAX, vocab as i32, i32::MIN]);
        }
        for c in st.token_counts.iter_mut().step_by(5) {
            *c = rng.pick(&[-7, i32::MAX, i32::MIN, 1 << 25]);
        }
        for p in st.penalties.iter_mut() {
            *p = rng.pick(&[
                f32::NAN,
                f32::INFINITY,
                -f32::INFINITY,
                1e-40,
                -3.0,
                0.0,
                1e30,
                2.0,
                0.5,
                1e-20,
            ]);
        }
        st.min_tokens = garbage_i32s(&mut rng, n, 40);
        st.end_tokens = vec![-1, i32::MAX, st.end_tokens[0]];
        st.bias_offsets = garbage_i32s(&mut rng, n + 1, st.bias_ids.len() + 2);
        for v in st.bias_values.iter_mut() {
            *v = rng.pick(&[f32::NAN, f32::INFINITY, -f32::INFINITY, 1e-40, 3e38, -2.0]);
        }
        for t in st.bias_ids.iter_mut().step_by(2) {
            *t = rng.pick(&[-5, vocab as i32, i32::MAX]);
        }
        st.bad_word_offsets = garbage_i32s(&mut rng, n + 1, st.bad_words.len() + 2);
        for w in st.bad_words.iter_mut().step_by(3) {
            *w = rng.pick(&[0, -1, 1000, i32::MAX, vocab as i32 + 3]);
        }
        out.push((format!("hostile::garbage_{i}"), st));
    }
    out
}
