//! Cases of `update_state` (`docs/semantics.md` §5.9).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;

use crate::Result;
use crate::case::{Dims, TensorSpec, Want};
use crate::cases::Case;
use crate::exec::{OpCase, Runner, named_inouts, named_inputs};
use specula_backend_api::abi::MAX_INFER_SEED;

use super::Size;
use super::build_output_layout::batch_shapes;
use super::generate::{
    Batch, EDGE_SEEDS, Kind, Rng, batch_name, dims, garbage_i32s, i32s, u8s, u64s,
};

/// The parameters of a `update_state` case (the JSON header of a case file, beside `"op"`).
/// Inputs `accept_tokens`, `is_block_step`, `prompt_lens`, `max_dec_len`, `end_tokens`; in/out
/// `accept_num`, `stop_flags`, `token_ids_all`, `step_idx`, `infer_seed`, `draft_tokens`,
/// `seq_lens_encoder`, `seq_lens_decoder`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Batch shape.
    pub dims: Dims,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
    /// The vocabulary of the optional in/out `token_counts [max_bsz, vocab]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<usize>,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let d = &self.dims;
        let (n, s) = (d.max_bsz, d.max_step_tokens);
        vec![
            TensorSpec::i32("accept_tokens", n * s),
            TensorSpec::new("is_block_step", Want::Is(DType::U8), n),
            TensorSpec::i32("prompt_lens", n),
            TensorSpec::i32("max_dec_len", n),
            TensorSpec::i32("end_tokens", 1).at_least(),
            TensorSpec::i32("accept_num", n),
            TensorSpec::new("stop_flags", Want::Is(DType::U8), n),
            TensorSpec::i32("token_ids_all", n * self.max_model_len),
            TensorSpec::i32("step_idx", n),
            TensorSpec::new("infer_seed", Want::Is(DType::U64), n),
            TensorSpec::i32("draft_tokens", n * s),
            TensorSpec::i32("seq_lens_encoder", n),
            TensorSpec::i32("seq_lens_decoder", n),
            TensorSpec::i32("token_counts", n * self.vocab.unwrap_or(0)).optional(),
        ]
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let Params {
            dims,
            max_model_len,
            vocab,
        } = *self;
        let device = r.device();
        named_inputs!(
            r,
            let inputs = UpdateStateInputs {
                accept_tokens,
                is_block_step,
                prompt_lens,
                max_dec_len,
                end_tokens,
            }
        );
        let mut state = named_inouts!(
            r,
            DecodeState {
                accept_num,
                stop_flags,
                token_ids_all,
                step_idx,
                infer_seed,
                draft_tokens,
                seq_lens_encoder,
                seq_lens_decoder,
            } + token_counts if vocab.is_some()
        );
        device.update_state(
            &inputs,
            &mut state,
            &UpdateStateParams {
                dims: dims.into(),
                max_model_len,
                vocab: vocab.unwrap_or(0),
            },
        )?;
        Ok(())
    }
}

/// The inputs of an `update_state` case.
#[derive(Clone, Debug)]
struct State {
    dims: Dims,
    max_model_len: usize,
    accept_tokens: Vec<i32>,
    is_block_step: Vec<u8>,
    prompt_lens: Vec<i32>,
    max_dec_len: Vec<i32>,
    end_tokens: Vec<i32>,
    accept_num: Vec<i32>,
    stop_flags: Vec<u8>,
    token_ids_all: Vec<i32>,
    step_idx: Vec<i32>,
    infer_seed: Vec<u64>,
    draft_tokens: Vec<i32>,
    seq_lens_encoder: Vec<i32>,
    seq_lens_decoder: Vec<i32>,
    /// `(vocab, counts)`: the optional token counts.
    token_counts: Option<(usize, Vec<i32>)>,
}

impl State {
    fn case(&self, name: String) -> Case {
        let case = Case::new(
            name,
            Params {
                dims: self.dims,
                max_model_len: self.max_model_len,
                vocab: self.token_counts.as_ref().map(|c| c.0),
            },
        )
        .with("accept_tokens", i32s(&self.accept_tokens))
        .with("is_block_step", u8s(&self.is_block_step))
        .with("prompt_lens", i32s(&self.prompt_lens))
        .with("max_dec_len", i32s(&self.max_dec_len))
        .with("end_tokens", i32s(&self.end_tokens))
        .with("accept_num", i32s(&self.accept_num))
        .with("stop_flags", u8s(&self.stop_flags))
        .with("token_ids_all", i32s(&self.token_ids_all))
        .with("step_idx", i32s(&self.step_idx))
        .with("infer_seed", u64s(&self.infer_seed))
        .with("draft_tokens", i32s(&self.draft_tokens))
        .with("seq_lens_encoder", i32s(&self.seq_lens_encoder))
        .with("seq_lens_decoder", i32s(&self.seq_lens_decoder));
        match &self.token_counts {
            Some((_, counts)) => case.with("token_counts", i32s(counts)),
            None => case,
        }
    }

    /// A realistic end of step: what verify emitted for a random batch, requests at every stage
    /// (some right at `max_model_len` or `max_dec_len`), a few stopped or blocked slots.
    fn random(rng: &mut Rng, d: Dims, max_model_len: usize) -> Self {
        let vocab = 1000;
        let s = d.max_step_tokens;
        let batch = Batch::random(rng, d, max_model_len / 4);
        let n = d.max_bsz;
        let end_tokens: Vec<i32> = (0..rng.range(1, 3)).map(|_| rng.token(vocab)).collect();
        let mut st = State {
            dims: d,
            max_model_len,
            accept_tokens: vec![-1; n * s],
            is_block_step: (0..n).map(|_| u8::from(rng.chance(1, 20))).collect(),
            prompt_lens: vec![0; n],
            max_dec_len: vec![0; n],
            end_tokens,
            accept_num: vec![0; n],
            stop_flags: (0..n).map(|_| u8::from(rng.chance(1, 20))).collect(),
            token_ids_all: (0..n * max_model_len).map(|_| rng.token(vocab)).collect(),
            step_idx: vec![0; n],
            infer_seed: (0..n).map(|_| rng.seed()).collect(),
            draft_tokens: (0..n * s).map(|_| rng.token(vocab)).collect(),
            seq_lens_encoder: batch.encoder.clone(),
            seq_lens_decoder: vec![0; n],
            token_counts: rng
                .chance(1, 2)
                .then(|| (vocab, (0..n * vocab).map(|_| rng.below(3) as i32).collect())),
        };
        for b in 0..n {
            let prefill = batch.kind(b) == Kind::Prefill;
            let p = if prefill {
                batch.encoder[b] as usize
            } else {
                rng.range(1, max_model_len / 2)
            };
            let step = if prefill {
                0
            } else if rng.chance(3, 20) {
                max_model_len - p - rng.below(s.min(max_model_len - p) + 1)
            } else {
                rng.below(max_model_len - p)
            };
            st.prompt_lens[b] = p as i32;
            st.step_idx[b] = step as i32;
            st.seq_lens_decoder[b] = if prefill { 0 } else { (p + step) as i32 };
            st.max_dec_len[b] = if rng.chance(1, 5) {
                (step + rng.range(1, s + 1)) as i32
            } else {
                100_000
            };
            let emitted = match batch.kind(b) {
                Kind::Empty => 0,
                Kind::Prefill => 1,
                Kind::Decode => rng.range(1, batch.rows_of(b)),
            };
            st.accept_num[b] = emitted as i32;
            for k in 0..emitted {
                st.accept_tokens[b * s + k] = if rng.chance(1, 20) {
                    st.end_tokens[0]
                } else {
                    rng.token(vocab)
                };
            }
        }
        st
    }
}

/// Every case of `update_state`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    let lens = [16, 64, 97, 512, 2048];
    for (i, d) in batch_shapes(size).into_iter().enumerate() {
        let max_model_len = if d.max_bsz > 256 {
            4096
        } else {
            lens[i % lens.len()]
        };
        let mut rng = Rng::new("update_state", i as u64);
        let st = State::random(&mut rng, d, max_model_len);
        out.push(st.case(format!("{}_len{max_model_len}", batch_name(&d))));
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    let m = MAX_INFER_SEED;
    let base = State {
        dims: dims(5, 4, 3),
        max_model_len: 10,
        accept_tokens: vec![7, 8, 9, 2, -1, -1, 11, 12, 13, 5, 5, 5, 6, 6, 6],
        is_block_step: vec![0, 0, 0, 1, 0],
        prompt_lens: vec![3, 4, 6, 2, 2],
        max_dec_len: vec![100; 5],
        end_tokens: vec![2],
        accept_num: vec![3, 1, 3, 2, 2],
        stop_flags: vec![0; 5],
        token_ids_all: [
            [1, 1, 1, 5, 6, 0, 0, 0, 0, 0],
            [4, 4, 4, 4, 0, 0, 0, 0, 0, 0],
            [3, 3, 3, 3, 3, 3, 7, 7, 0, 0],
            [9; 10],
            [8; 10],
        ]
        .concat(),
        step_idx: vec![2, 0, 2, 1, 1],
        infer_seed: vec![100, m - 2, u64::MAX, 50, 60],
        draft_tokens: vec![6, 0, 0, 0, 0, 0, 7, 0, 0, 9, 9, 9, 8, 8, 8],
        seq_lens_encoder: vec![0, 4, 0, 0, 0],
        seq_lens_decoder: vec![5, 0, 8, 3, 3],
        token_counts: Some((14, vec![1; 5 * 14])),
    };
    // Slot 0 appends 3 tokens; slot 1 (prefill) emits an end token and becomes a decode slot;
    // slot 2 has room for 2 of its 3 tokens and stops; slot 3 is blocked; slot 4 is not described.
    let first = base
        .case("golden::append_prefill_room_blocked".into())
        .expect("accept_num", i32s(&[3, 1, 2, 2, 2]))
        .expect("stop_flags", u8s(&[0, 1, 1, 0, 0]))
        .expect(
            "token_ids_all",
            i32s(
                &[
                    [1, 1, 1, 5, 6, 7, 8, 9, 0, 0],
                    [4, 4, 4, 4, 2, 0, 0, 0, 0, 0],
                    [3, 3, 3, 3, 3, 3, 7, 7, 11, 12],
                    [9; 10],
                    [8; 10],
                ]
                .concat(),
            ),
        )
        .expect("step_idx", i32s(&[5, 1, 4, 1, 1]))
        .expect("infer_seed", u64s(&[112, 2, 11, 50, 60]))
        .expect(
            "draft_tokens",
            i32s(&[9, 0, 0, 2, 0, 0, 12, 0, 0, 9, 9, 9, 8, 8, 8]),
        )
        .expect("seq_lens_encoder", i32s(&[0; 5]))
        .expect("seq_lens_decoder", i32s(&[8, 4, 10, 3, 3]))
        .expect("token_counts", i32s(&golden_counts()));
    // max_dec_len reached; no room at all (stop, accept_num 0, nothing else changes).
    let second = State {
        dims: dims(2, 2, 2),
        max_model_len: 8,
        accept_tokens: vec![4, 5, 6, 6],
        is_block_step: vec![0, 0],
        prompt_lens: vec![2, 5],
        max_dec_len: vec![3, 100],
        end_tokens: vec![0],
        accept_num: vec![2, 2],
        stop_flags: vec![0, 0],
        token_ids_all: [[1, 1, 9, 0, 0, 0, 0, 0], [2, 2, 2, 2, 2, 6, 6, 6]].concat(),
        step_idx: vec![1, 3],
        infer_seed: vec![7, 9],
        draft_tokens: vec![9, 1, 7, 7],
        seq_lens_encoder: vec![0, 0],
        seq_lens_decoder: vec![3, 8],
        token_counts: None,
    }
    .case("golden::max_dec_len_and_no_room".into())
    .expect("accept_num", i32s(&[2, 0]))
    .expect("stop_flags", u8s(&[1, 1]))
    .expect(
        "token_ids_all",
        i32s(&[[1, 1, 9, 4, 5, 0, 0, 0], [2, 2, 2, 2, 2, 6, 6, 6]].concat()),
    )
    .expect("step_idx", i32s(&[3, 3]))
    .expect("infer_seed", u64s(&[15, 9]))
    .expect("draft_tokens", i32s(&[5, 1, 7, 7]))
    .expect("seq_lens_decoder", i32s(&[5, 8]));
    vec![first, second]
}

/// The counts after `golden::append_prefill_room_blocked` (all 1 before): slot 0 appended 7, 8,
/// 9; slot 1 the end token 2; slot 2 (room for 2) 11, 12; slots 3 and 4 nothing.
fn golden_counts() -> Vec<i32> {
    let mut counts = vec![1; 5 * 14];
    for (b, t) in [(0, 7), (0, 8), (0, 9), (1, 2), (2, 11), (2, 12)] {
        counts[b * 14 + t] += 1;
    }
    counts
}

fn hostile() -> Vec<Case> {
    let mut out = Vec::new();
    for (i, d) in [dims(16, 16, 4), dims(33, 30, 6)].into_iter().enumerate() {
        let mut rng = Rng::new("update_state/hostile", i as u64);
        let mut st = State::random(&mut rng, d, 64);
        let n = d.max_bsz;
        let garbage = |rng: &mut Rng, hi| garbage_i32s(rng, n, hi);
        st.accept_num = garbage(&mut rng, 2 * d.max_step_tokens);
        st.step_idx = garbage(&mut rng, 80);
        st.prompt_lens = garbage(&mut rng, 80);
        st.max_dec_len = garbage(&mut rng, 40);
        st.seq_lens_encoder = garbage(&mut rng, 10);
        st.seq_lens_decoder = garbage(&mut rng, 100);
        st.infer_seed = (0..n).map(|b| EDGE_SEEDS[b % EDGE_SEEDS.len()]).collect();
        st.stop_flags = (0..n).map(|b| [0, 0, 0, 3, 255][b % 5]).collect();
        st.is_block_step = (0..n).map(|b| [0, 0, 0, 0, 64, 0, 0][b % 7]).collect();
        st.end_tokens = vec![-1, i32::MAX, st.end_tokens[0]];
        for t in st.accept_tokens.iter_mut().step_by(3) {
            *t = rng.pick(&[-1, -1000, i32::MIN, i32::MAX]);
        }
        // Counts at the top of i32 saturate; negative ones grow.
        st.token_counts = Some((
            1000,
            (0..n * 1000)
                .map(|i| [i32::MAX, -5, 0, i32::MAX - 1][i % 4])
                .collect(),
        ));
        out.push(st.case(format!("hostile::garbage_state_{i}")));
    }
    out
}
