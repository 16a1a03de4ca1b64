//! Cases of `accept_logprobs` (`docs/semantics.md` §5.11).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;

use super::Size;
use super::generate::{
    Batch, FLOAT_DTYPES, Kind, Rng, batch_name, dims, f32s, float_tensor, i32s, logit_row,
};
use crate::Result;
use crate::case::{Dims, TensorSpec, Want};
use crate::cases::Case;
use crate::exec::{OpCase, Runner, named_inputs};
use crate::tensor::HostTensor;

/// The parameters of a `accept_logprobs` case (the JSON header of a case file, beside `"op"`).
/// Inputs `logits`, `temperature`, `accept_tokens`, `accept_num`, `seq_lens_encoder`,
/// `cu_seqlens_q_output`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Batch shape.
    pub dims: Dims,
    /// Rows of `logits`.
    pub rows: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Top-K width.
    pub top_k: usize,
}

impl Params {
    /// Uploads the case's inputs, allocates its guarded outputs and runs `op` on them: the
    /// device's op for the plain run, the sharded op for the sharded run (`sharded.rs`).
    pub(crate) fn run_with(
        &self,
        r: &mut Runner<'_>,
        op: impl FnOnce(&LogprobsInputs<'_>, &mut LogprobsOutputs<'_>, &LogprobsParams<'_>) -> Result<()>,
    ) -> Result<()> {
        let Params {
            dims,
            rows,
            vocab,
            top_k,
        } = *self;
        let host_temperature = r.host::<f32>("temperature")?;
        named_inputs!(
            r,
            let inputs = LogprobsInputs {
                logits,
                temperature,
                accept_tokens,
                accept_num,
                seq_lens_encoder,
                cu_seqlens_q_output,
            }
        );
        let packed = dims.max_bsz * dims.max_step_tokens;
        let [cu_accept, token_ids, logprobs, ranks, top_ids, top_logprobs] = r.outputs([
            ("cu_accept", DType::I32, &[dims.max_bsz + 1]),
            ("token_ids", DType::I32, &[packed]),
            ("logprobs", DType::F32, &[packed]),
            ("ranks", DType::I32, &[packed]),
            ("top_ids", DType::I32, &[packed, top_k]),
            ("top_logprobs", DType::F32, &[packed, top_k]),
        ])?;
        op(
            &inputs,
            &mut LogprobsOutputs {
                cu_accept,
                token_ids,
                logprobs,
                ranks,
                top_ids,
                top_logprobs,
            },
            &LogprobsParams {
                dims: dims.into(),
                shape: RowShape { rows, vocab },
                top_k,
                host_temperature: host_temperature.as_deref(),
            },
        )
    }
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let d = &self.dims;
        vec![
            TensorSpec::new("logits", Want::Float, self.rows * self.vocab),
            TensorSpec::new("temperature", Want::Is(DType::F32), self.rows),
            TensorSpec::i32("accept_tokens", d.max_bsz * d.max_step_tokens),
            TensorSpec::i32("accept_num", d.max_bsz),
            TensorSpec::i32("seq_lens_encoder", d.max_bsz),
            TensorSpec::i32("cu_seqlens_q_output", d.real_bsz + 1),
        ]
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let device = r.device();
        self.run_with(r, |inputs, out, params| {
            Ok(device.accept_logprobs(inputs, out, params)?)
        })
    }

    fn reduction_width(&self) -> usize {
        self.vocab
    }
}

/// A case over `batch` with `logits` of `rows` rows.
#[allow(clippy::too_many_arguments)]
fn case(
    name: String,
    batch: &Batch,
    dtype: DType,
    vocab: usize,
    top_k: usize,
    logits: &[f32],
    temperature: &[f32],
    accept_tokens: &[i32],
    accept_num: &[i32],
) -> Case {
    let rows = temperature.len();
    let params = Params {
        dims: batch.dims,
        rows,
        vocab,
        top_k,
    };
    Case::new(name, params)
        .with("logits", float_tensor(dtype, &[rows, vocab], logits))
        .with("temperature", f32s(temperature))
        .with("accept_tokens", i32s(accept_tokens))
        .with("accept_num", i32s(accept_num))
        .with("seq_lens_encoder", i32s(&batch.encoder))
        .with("cu_seqlens_q_output", i32s(&batch.cu_seqlens_q_output()))
}

/// Every case of `accept_logprobs`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    let mut shapes = vec![
        (dims(1, 1, 1), 97, 0),
        (dims(1, 1, 8), 1000, 5),
        (dims(3, 3, 4), 7, 20),
        (dims(5, 3, 2), 4099, 1),
        (dims(8, 8, 6), 257, 64),
        (dims(13, 11, 5), 1025, 20),
        (dims(32, 29, 3), 129, 8),
        (dims(64, 64, 7), 97, 3),
        (dims(1, 1, 4), 32000, 20),
        (dims(2, 2, 2), 128256, 5),
        (dims(1, 1, 3), 151936, 64),
    ];
    if size == Size::Full {
        shapes.extend([
            (dims(64, 64, 6), 151936, 20),
            (dims(128, 128, 2), 128256, 5),
            (dims(256, 256, 1), 32000, 64),
        ]);
    }
    for (i, (d, vocab, top_k)) in shapes.into_iter().enumerate() {
        let dtype = FLOAT_DTYPES[i % 3];
        let mut rng = Rng::new(&format!("logprobs/{dtype}"), i as u64);
        let batch = Batch::random(&mut rng, d, 20);
        let rows = batch.t_out() + if i % 3 == 1 { 3 } else { 0 };
        let logits: Vec<f32> = (0..rows).flat_map(|_| logit_row(&mut rng, vocab)).collect();
        let temperature: Vec<f32> = (0..rows)
            .map(|_| rng.pick(&[1.0, 1.0, 0.0, 0.7, 1.3]))
            .collect();
        let s = d.max_step_tokens;
        let mut accept_tokens = vec![-1; d.max_bsz * s];
        let mut accept_num = vec![0; d.max_bsz];
        for b in 0..d.real_bsz {
            let n = match batch.kind(b) {
                Kind::Empty => 0,
                Kind::Prefill => 1,
                Kind::Decode => rng.range(1, batch.rows_of(b)),
            };
            accept_num[b] = n as i32;
            for k in 0..n {
                accept_tokens[b * s + k] = rng.token(vocab);
            }
        }
        let name = format!("{dtype}::{}_v{vocab}_k{top_k}", batch_name(&d));
        out.push(case(
            name,
            &batch,
            dtype,
            vocab,
            top_k,
            &logits,
            &temperature,
            &accept_tokens,
            &accept_num,
        ));
    }
    out.extend(hostile());
    out
}

/// `log_softmax(row)[v]` in f64, NaN as −inf.
fn log_softmax(row: &[f64], v: usize) -> f32 {
    let clean: Vec<f64> = row
        .iter()
        .map(|&x| if x.is_nan() { f64::NEG_INFINITY } else { x })
        .collect();
    let m = clean.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
    let lse = m + clean.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
    (clean[v] - lse) as f32
}

fn golden() -> Vec<Case> {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    // Slot 0 decodes 2 rows and accepts 2 tokens; slot 1 is a prefill (one row, temperature 0).
    let batch = Batch::new(dims(2, 2, 2), vec![2, 3], vec![0, 3]);
    let logits = [1.0, 3.0, 3.0, nan, 0.0, 0.0, 0.0, 0.0, 2.0, nan, -inf, 2.0];
    let row0 = [1.0, 3.0, 3.0, f64::NAN];
    let l = |v| log_softmax(&row0, v);
    let quarter = -(4f32.ln());
    let mut out = Vec::new();
    for dtype in FLOAT_DTYPES {
        out.push(
            case(
                format!("golden::ranks_top_k_t0_{dtype}"),
                &batch,
                dtype,
                4,
                3,
                &logits,
                &[1.0, 1.0, 0.0],
                &[0, 3, 3, 9],
                &[2, 1],
            )
            .expect("cu_accept", i32s(&[0, 2, 3]))
            .expect("token_ids", i32s(&[0, 3, 3, -1]))
            .expect("logprobs", f32s(&[l(0), quarter, -inf, -inf]))
            .expect("ranks", i32s(&[3, 1, 1, 0]))
            .expect(
                "top_ids",
                HostTensor::new(&[4, 3], &[1, 2, 0, 0, 1, 2, 0, 3, 2, -1, -1, -1]),
            )
            .expect(
                "top_logprobs",
                HostTensor::new(
                    &[4, 3],
                    &[
                        l(1),
                        l(2),
                        l(0),
                        quarter,
                        quarter,
                        quarter,
                        0.0,
                        -inf,
                        -inf,
                        -inf,
                        -inf,
                        -inf,
                    ],
                ),
            ),
        );
    }
    // An out-of-vocabulary token: logprob −inf, rank 0, top-K still filled.
    let batch = Batch::new(dims(1, 1, 2), vec![2], vec![0]);
    out.push(
        case(
            "golden::out_of_vocab_token".into(),
            &batch,
            DType::F32,
            4,
            1,
            &[0.0; 8],
            &[1.0, 1.0],
            &[7, -2],
            &[2],
        )
        .expect("cu_accept", i32s(&[0, 2]))
        .expect("token_ids", i32s(&[7, -2]))
        .expect("logprobs", f32s(&[-inf, -inf]))
        .expect("ranks", i32s(&[0, 0]))
        .expect("top_ids", HostTensor::new(&[2, 1], &[0, 0]))
        .expect(
            "top_logprobs",
            HostTensor::new(&[2, 1], &[quarter, quarter]),
        ),
    );
    // cu_seqlens_q_output[0] = -1: row base + 0 is missing (−inf, rank 0) but row base + 1 = 0
    // exists; rows are computed in 64 bits and missing only outside [0, rows).
    out.push(
        case(
            "golden::negative_base_back_in_range".into(),
            &batch,
            DType::F32,
            2,
            0,
            &[1.0, 0.0],
            &[1.0],
            &[0, 0],
            &[2],
        )
        .device_only()
        .with("cu_seqlens_q_output", i32s(&[-1, 1]))
        .expect("cu_accept", i32s(&[0, 2]))
        .expect("token_ids", i32s(&[0, 0]))
        .expect(
            "logprobs",
            f32s(&[-inf, -(1.0 + (-1.0f64).exp()).ln() as f32]),
        )
        .expect("ranks", i32s(&[0, 1])),
    );
    out
}

fn hostile() -> Vec<Case> {
    let mut out = Vec::new();
    for (i, dtype) in FLOAT_DTYPES.into_iter().enumerate() {
        let d = dims(12, 11, 4);
        let vocab = 301;
        let mut rng = Rng::new(&format!("logprobs/hostile/{dtype}"), i as u64);
        let batch = Batch::random(&mut rng, d, 10);
        let rows = batch.t_out();
        let mut logits = Vec::new();
        for r in 0..rows {
            let mut row = logit_row(&mut rng, vocab);
            match r % 5 {
                0 => row.iter_mut().step_by(2).for_each(|x| *x = f32::NAN),
                1 => row[rng.below(vocab)] = f32::INFINITY,
                2 => row.fill(f32::NEG_INFINITY),
                3 => row
                    .iter_mut()
                    .for_each(|x| *x = f32::from_bits(rng.next_u64() as u32)),
                _ => {}
            }
            logits.extend(row);
        }
        let temperature: Vec<f32> = (0..rows)
            .map(|_| rng.pick(&[f32::NAN, -1.0, 0.0, 1e-30, f32::INFINITY, 1.0]))
            .collect();
        let accept_tokens: Vec<i32> = (0..d.max_bsz * d.max_step_tokens)
            .map(|_| rng.pick(&[-1, i32::MIN, i32::MAX, 300, 301, 0, 5]))
            .collect();
        let accept_num: Vec<i32> = (0..d.max_bsz)
            .map(|_| rng.pick(&[-3, 0, 1, 2, 4, 9, i32::MAX, i32::MIN]))
            .collect();
        let garbage_offsets: Vec<i32> = (0..=d.real_bsz)
            .map(|_| rng.pick(&[-5, 0, 3, 1000, i32::MAX, i32::MIN]))
            .collect();
        let base = case(
            String::new(),
            &batch,
            dtype,
            vocab,
            7,
            &logits,
            &temperature,
            &accept_tokens,
            &accept_num,
        );
        let mut a = base.clone();
        a.name = format!("hostile::bad_rows_counts_ids_{dtype}");
        out.push(a);
        let mut b = base;
        b.name = format!("hostile::garbage_offsets_{dtype}");
        out.push(b.with("cu_seqlens_q_output", i32s(&garbage_offsets)));
    }
    out
}
