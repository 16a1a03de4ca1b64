//! Cases of `ngram_match` (`docs/semantics.md` §5.10).

use serde::{Deserialize, Serialize};
use specula_backend_api::ops::*;

use super::Size;
use super::build_output_layout::batch_shapes;
use super::generate::{Rng, batch_name, dims, garbage_i32s, i32s};
use crate::Result;
use crate::case::{Dims, TensorSpec};
use crate::cases::Case;
use crate::exec::{OpCase, Runner, named_inouts, named_inputs};

/// The parameters of a `ngram_match` case (the JSON header of a case file, beside `"op"`).
/// Inputs `token_ids_all`, `prompt_lens`, `step_idx`, `draft_token_num`, `seq_lens_encoder`,
/// `max_dec_len`; in/out `draft_tokens`, `seq_lens_this_time`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Batch shape.
    pub dims: Dims,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
    /// Longest n-gram.
    pub max_ngram_size: usize,
    /// Shortest n-gram.
    pub min_ngram_size: usize,
    /// Global token budget.
    pub threshold: usize,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let d = &self.dims;
        let n = d.max_bsz;
        vec![
            TensorSpec::i32("token_ids_all", n * self.max_model_len),
            TensorSpec::i32("prompt_lens", n),
            TensorSpec::i32("step_idx", n),
            TensorSpec::i32("draft_token_num", n),
            TensorSpec::i32("seq_lens_encoder", n),
            TensorSpec::i32("max_dec_len", n),
            TensorSpec::i32("draft_tokens", n * d.max_step_tokens),
            TensorSpec::i32("seq_lens_this_time", n),
        ]
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let Params {
            dims,
            max_model_len,
            max_ngram_size,
            min_ngram_size,
            threshold,
        } = *self;
        let device = r.device();
        named_inputs!(
            r,
            let inputs = NgramInputs {
                token_ids_all,
                prompt_lens,
                step_idx,
                draft_token_num,
                seq_lens_encoder,
                max_dec_len,
            }
        );
        device.ngram_match(
            &inputs,
            &mut named_inouts!(r, NgramOutputs { draft_tokens, seq_lens_this_time }),
            &NgramParams {
                dims: dims.into(),
                max_model_len,
                max_ngram_size,
                min_ngram_size,
                threshold,
            },
        )?;
        Ok(())
    }
}

/// The inputs of an `ngram_match` case.
#[derive(Clone, Debug)]
struct State {
    dims: Dims,
    max_model_len: usize,
    token_ids_all: Vec<i32>,
    prompt_lens: Vec<i32>,
    step_idx: Vec<i32>,
    draft_token_num: Vec<i32>,
    seq_lens_encoder: Vec<i32>,
    max_dec_len: Vec<i32>,
    draft_tokens: Vec<i32>,
    seq_lens_this_time: Vec<i32>,
}

impl State {
    fn case(
        &self,
        name: String,
        max_ngram_size: usize,
        min_ngram_size: usize,
        threshold: usize,
    ) -> Case {
        let params = Params {
            dims: self.dims,
            max_model_len: self.max_model_len,
            max_ngram_size,
            min_ngram_size,
            threshold,
        };
        Case::new(name, params)
            .with("token_ids_all", i32s(&self.token_ids_all))
            .with("prompt_lens", i32s(&self.prompt_lens))
            .with("step_idx", i32s(&self.step_idx))
            .with("draft_token_num", i32s(&self.draft_token_num))
            .with("seq_lens_encoder", i32s(&self.seq_lens_encoder))
            .with("max_dec_len", i32s(&self.max_dec_len))
            .with("draft_tokens", i32s(&self.draft_tokens))
            .with("seq_lens_this_time", i32s(&self.seq_lens_this_time))
    }

    /// Requests whose prompts and histories repeat motifs of a small alphabet (so n-grams match,
    /// in the prompt and in the history), running, idle and prefill slots mixed.
    fn random(rng: &mut Rng, d: Dims, max_model_len: usize) -> Self {
        let n = d.max_bsz;
        let s = d.max_step_tokens;
        let mut st = State {
            dims: d,
            max_model_len,
            token_ids_all: vec![0; n * max_model_len],
            prompt_lens: vec![0; n],
            step_idx: vec![0; n],
            draft_token_num: vec![0; n],
            seq_lens_encoder: vec![0; n],
            max_dec_len: vec![0; n],
            draft_tokens: (0..n * s).map(|_| rng.token(50)).collect(),
            seq_lens_this_time: vec![0; n],
        };
        for b in 0..n {
            let alphabet = rng.range(2, 12);
            let motif: Vec<i32> = (0..rng.range(2, 7)).map(|_| rng.token(alphabet)).collect();
            let row = &mut st.token_ids_all[b * max_model_len..(b + 1) * max_model_len];
            for (k, t) in row.iter_mut().enumerate() {
                *t = if rng.chance(4, 5) {
                    motif[k % motif.len()]
                } else {
                    rng.token(alphabet)
                };
            }
            let p = rng.range(1, max_model_len / 2);
            let step = rng.below(max_model_len - p);
            st.prompt_lens[b] = p as i32;
            st.step_idx[b] = step as i32;
            st.draft_token_num[b] = rng.pick(&[0, 1, (s - 1) as i32, (s - 1) as i32, s as i32 + 3]);
            st.max_dec_len[b] = if rng.chance(1, 5) {
                (step + rng.range(0, s)) as i32
            } else {
                100_000
            };
            match rng.below(10) {
                0 => {}
                1 | 2 => {
                    st.seq_lens_encoder[b] = p as i32;
                    st.seq_lens_this_time[b] = p as i32;
                    st.step_idx[b] = 0;
                }
                _ => st.seq_lens_this_time[b] = 1,
            }
        }
        st
    }
}

/// Every case of `ngram_match`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    let lens = [16, 64, 97, 256, 1024];
    let ngrams = [(3, 1), (1, 1), (4, 2), (2, 2), (5, 1)];
    for (i, d) in batch_shapes(size).into_iter().enumerate() {
        let max_model_len = lens[i % lens.len()];
        let (max_ngram, min_ngram) = ngrams[i % ngrams.len()];
        let mut rng = Rng::new("ngram", i as u64);
        let st = State::random(&mut rng, d, max_model_len);
        for threshold in [128, 1 + d.max_bsz / 2 + rng.below(8)] {
            let name = format!(
                "{}_len{max_model_len}_ng{max_ngram}-{min_ngram}_t{threshold}",
                batch_name(&d)
            );
            out.push(st.case(name, max_ngram, min_ngram, threshold));
        }
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    // Slot 0 and 1: the contract's two golden cases; slot 2 a prefill (untouched); slot 3 is not
    // described (untouched).
    let mml = 16;
    let mut row0 = vec![10, 20, 30, 40, 50, 60, 10, 20, 30, 40];
    let mut row1 = vec![10, 20, 30, 40, 50, 10, 20, 30, 40, 50, 10];
    row0.resize(mml, 0);
    row1.resize(mml, 0);
    let st = State {
        dims: dims(4, 3, 4),
        max_model_len: mml,
        token_ids_all: [row0, row1, vec![10; mml], vec![10; mml]].concat(),
        prompt_lens: vec![6, 8, 5, 6],
        step_idx: vec![4, 3, 0, 4],
        draft_token_num: vec![3, 3, 3, 3],
        seq_lens_encoder: vec![0, 0, 5, 0],
        max_dec_len: vec![10, 10, 10, 10],
        draft_tokens: [
            [40, -7, -7, -7],
            [10, -7, -7, -7],
            [-7; 4],
            [40, -7, -7, -7],
        ]
        .concat(),
        seq_lens_this_time: vec![1, 1, 5, 1],
    };
    let contract = st
        .case("golden::contract_examples".into(), 3, 1, 128)
        .expect(
            "draft_tokens",
            i32s(
                &[
                    [40, 50, 60, -7],
                    [10, 20, 30, -7],
                    [-7; 4],
                    [40, -7, -7, -7],
                ]
                .concat(),
            ),
        )
        .expect("seq_lens_this_time", i32s(&[3, 3, 5, 1]));
    // The budget: mandatory = 5 (prefill) + 2 (decode slots) = 7; threshold 8 leaves 1 draft,
    // granted to slot 0.
    let budget = st
        .case("golden::budget_in_slot_order".into(), 3, 1, 8)
        .expect(
            "draft_tokens",
            i32s(
                &[
                    [40, 50, -7, -7],
                    [10, -7, -7, -7],
                    [-7; 4],
                    [40, -7, -7, -7],
                ]
                .concat(),
            ),
        )
        .expect("seq_lens_this_time", i32s(&[2, 1, 5, 1]));
    // The budget in 64 bits: two prefill slots of i32::MAX tokens make the mandatory count
    // 2^32 − 1; with threshold usize::MAX the decode slot still gets its drafts.
    let wide_state = State {
        dims: dims(3, 3, 3),
        max_model_len: 4,
        token_ids_all: vec![0, 0, 0, 0, 0, 0, 0, 0, 7, 7, 7, 7],
        prompt_lens: vec![1, 1, 0],
        step_idx: vec![0, 0, 4],
        draft_token_num: vec![2, 2, 2],
        seq_lens_encoder: vec![1, 1, 0],
        max_dec_len: vec![100, 100, 100],
        draft_tokens: vec![0; 9],
        seq_lens_this_time: vec![i32::MAX, i32::MAX, 1],
    };
    let wide = wide_state
        .case("golden::budget_beyond_32_bits".into(), 2, 1, usize::MAX)
        .device_only()
        .expect("seq_lens_this_time", i32s(&[i32::MAX, i32::MAX, 3]))
        .expect("draft_tokens", i32s(&[0, 0, 0, 0, 0, 0, 0, 7, 7]));
    vec![contract, budget, wide]
}

fn hostile() -> Vec<Case> {
    let mut out = Vec::new();
    for (i, d) in [dims(16, 16, 4), dims(33, 30, 6)].into_iter().enumerate() {
        let mut rng = Rng::new("ngram/hostile", i as u64);
        let mut st = State::random(&mut rng, d, 48);
        let n = d.max_bsz;
        let garbage = |rng: &mut Rng, hi| garbage_i32s(rng, n, hi);
        st.prompt_lens = garbage(&mut rng, 60);
        st.step_idx = garbage(&mut rng, 60);
        st.draft_token_num = garbage(&mut rng, 10);
        st.max_dec_len = garbage(&mut rng, 60);
        st.seq_lens_encoder = garbage(&mut rng, 3);
        st.seq_lens_this_time = garbage(&mut rng, 3);
        for t in st.token_ids_all.iter_mut().step_by(5) {
            *t = rng.pick(&[-1, i32::MIN, i32::MAX, 3]);
        }
        out.push(st.case(format!("hostile::garbage_lengths_{i}"), 4, 1, 128));
        out.push(st.case(format!("hostile::garbage_lengths_threshold0_{i}"), 2, 2, 0));
    }
    out
}
