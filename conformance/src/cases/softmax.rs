//! Cases of `softmax` (`docs/semantics.md` §5.5).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;

use super::generate::{FLOAT_DTYPES, Rng, f32s, float_tensor, logit_row, spoiled_rows};
use super::{Size, row_gens};
use crate::Result;
use crate::case::{TensorSpec, Want};
use crate::cases::Case;
use crate::exec::{OpCase, Runner};

/// The parameters of a `softmax` case (the JSON header of a case file, beside `"op"`).
/// Inputs `logits`, `temperature`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Rows.
    pub rows: usize,
    /// Vocabulary.
    pub vocab: usize,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        vec![
            TensorSpec::new("logits", Want::Float, self.rows * self.vocab),
            TensorSpec::new("temperature", Want::Is(DType::F32), self.rows),
        ]
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let Params { rows, vocab } = *self;
        let device = r.device();
        let host_temperature = r.host::<f32>("temperature")?;
        let [logits, temperature] = r.inputs(["logits", "temperature"])?;
        let [probs] = r.outputs([("probs", DType::F32, &[rows, vocab])])?;
        let params = SoftmaxParams {
            shape: RowShape { rows, vocab },
            host_temperature: host_temperature.as_deref(),
        };
        device.softmax(&logits, &temperature, probs, &params)?;
        Ok(())
    }

    fn reduction_width(&self) -> usize {
        self.vocab
    }
}

fn case(name: String, dtype: DType, vocab: usize, values: &[f32], temperature: &[f32]) -> Case {
    let rows = temperature.len();
    Case::new(name, Params { rows, vocab })
        .with("logits", float_tensor(dtype, &[rows, vocab], values))
        .with("temperature", f32s(temperature))
}

/// Every case of `softmax`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for mut g in row_gens(size, "softmax", dtype) {
            let rng = &mut g.rng;
            let values: Vec<f32> = (0..g.rows).flat_map(|_| logit_row(rng, g.vocab)).collect();
            let temperature: Vec<f32> = (0..g.rows)
                .map(|r| match r {
                    0 => 1.0,
                    _ => rng.pick(&[0.0, 0.2, 0.7, 1.0, 1.0, 1.3, 2.5]),
                })
                .collect();
            out.push(case(g.name(), dtype, g.vocab, &values, &temperature));
        }
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    let inf = f32::INFINITY;
    let nan = f32::NAN;
    let ln3 = 3f32.ln();
    // Rows of 4 logits, their temperatures and the expected probabilities.
    let rows: [(&str, [f32; 4], f32, [f32; 4]); 8] = [
        (
            "t0_one_hot",
            [0.5, 2.0, -1.0, 2.0],
            0.0,
            [0.0, 1.0, 0.0, 0.0],
        ),
        (
            "t0_one_hot_nan",
            [nan, -3.0, nan, -4.0],
            0.0,
            [0.0, 1.0, 0.0, 0.0],
        ),
        ("uniform", [1.5, 1.5, 1.5, 1.5], 1.0, [0.25; 4]),
        (
            "one_to_three",
            [0.0, ln3, -inf, nan],
            1.0,
            [0.25, 0.75, 0.0, 0.0],
        ),
        (
            "temperature_half",
            [0.0, ln3 / 2.0, -inf, -inf],
            0.5,
            [0.25, 0.75, 0.0, 0.0],
        ),
        (
            "plus_inf_uniform",
            [inf, 1.0, inf, nan],
            1.0,
            [0.5, 0.0, 0.5, 0.0],
        ),
        (
            "all_minus_inf_uniform",
            [-inf, -inf, nan, -inf],
            1.0,
            [0.25; 4],
        ),
        (
            "bad_device_temperature_is_one",
            [0.0, ln3, -inf, -inf],
            -2.0,
            [0.25, 0.75, 0.0, 0.0],
        ),
    ];
    let mut out = Vec::new();
    for (name, logits, t, expected) in rows {
        let golden = case(format!("golden::{name}"), DType::F32, 4, &logits, &[t])
            .expect("probs", float_tensor(DType::F32, &[1, 4], &expected));
        // A negative temperature is a device-side value (host copies are validated).
        out.push(match t < 0.0 {
            true => golden.device_only(),
            false => golden,
        });
    }
    // The temperature-0 one-hot in every dtype, several rows at once.
    for dtype in FLOAT_DTYPES {
        let logits = [
            1.0, 3.0, 3.0, -2.0, 0.0, 0.0, 0.0, 0.0, -1.0, -0.5, -0.25, -0.5,
        ];
        let expected = [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        out.push(
            case(
                format!("golden::t0_rows_{dtype}"),
                dtype,
                4,
                &logits,
                &[0.0, 0.0, 0.0],
            )
            .expect("probs", float_tensor(DType::F32, &[3, 4], &expected)),
        );
    }
    // (l − m) / T subtracts first: a tiny T tends to T = 0 (uniform over the maxima), and a huge
    // finite logit next to +inf does not overflow into a second +inf.
    let tiny = f32::from_bits(1);
    for (name, dtype, logits, t, expected) in [
        (
            "tiny_temperature_one_hot",
            DType::F32,
            [1.0, 2.0, 3.0, -1.0],
            tiny,
            [0.0, 0.0, 1.0, 0.0],
        ),
        (
            "tiny_temperature_ties",
            DType::F32,
            [1.0, 3.0, 3.0, -1.0],
            tiny,
            [0.0, 0.5, 0.5, 0.0],
        ),
        (
            "huge_logit_beside_inf",
            DType::BF16,
            [3.0e38, f32::INFINITY, 0.0, -1.0],
            0.365,
            [0.0, 1.0, 0.0, 0.0],
        ),
        // At T = +inf every finite logit scales to 0, also where l − m overflows to −inf.
        (
            "infinite_temperature_uniform_over_finite",
            DType::F32,
            [3.0e38, -3.0e38, 0.0, f32::NEG_INFINITY],
            f32::INFINITY,
            [1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0],
        ),
    ] {
        out.push(
            case(format!("golden::{name}"), dtype, 4, &logits, &[t])
                .expect("probs", float_tensor(DType::F32, &[1, 4], &expected)),
        );
    }
    out
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("softmax/hostile", 1);
    let vocab = 1031;
    let temperature = [
        f32::NAN,
        -1.0,
        1e-30,
        f32::INFINITY,
        1e30,
        0.0,
        f32::MIN_POSITIVE,
        1.0,
    ];
    let rows = temperature.len();
    let values = spoiled_rows(
        &mut rng,
        rows,
        vocab,
        logit_row,
        6,
        |rng, r, draw, x| match (r % 4, draw) {
            (0, 0) => *x = f32::NAN,
            (1, 1) => *x = f32::INFINITY,
            (2, 2) => *x = f32::NEG_INFINITY,
            (3, _) => *x = f32::from_bits(rng.next_u64() as u32),
            _ => {}
        },
    );
    FLOAT_DTYPES
        .into_iter()
        .map(|dtype| {
            case(
                format!("hostile::nan_inf_temperatures_{dtype}"),
                dtype,
                vocab,
                &values,
                &temperature,
            )
        })
        .collect()
}
