//! Cases of `softmax` (contract §4.9).

use specula_backend_api::DType;

use super::generate::{FLOAT_DTYPES, Rng, f32s, float_tensor, logit_row};
use super::{Size, full_shape_for, row_shapes};
use crate::case::{Case, CaseParams};

fn case(name: String, dtype: DType, vocab: usize, values: &[f32], temperature: &[f32]) -> Case {
    let rows = temperature.len();
    Case::new(name, CaseParams::Softmax { rows, vocab })
        .with("logits", float_tensor(dtype, &[rows, vocab], values))
        .with("temperature", f32s(temperature))
}

/// Every case of `softmax`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for dtype in FLOAT_DTYPES {
        for (rows, vocab) in row_shapes(size) {
            if !full_shape_for(dtype, rows, vocab) {
                continue;
            }
            let mut rng = Rng::new(
                &format!("softmax/{dtype}"),
                (rows * 1_000_003 + vocab) as u64,
            );
            let values: Vec<f32> = (0..rows).flat_map(|_| logit_row(&mut rng, vocab)).collect();
            let temperature: Vec<f32> = (0..rows)
                .map(|r| {
                    if r == 0 {
                        1.0
                    } else {
                        rng.pick(&[0.0, 0.2, 0.7, 1.0, 1.0, 1.3, 2.5])
                    }
                })
                .collect();
            out.push(case(
                format!("{dtype}::{rows}x{vocab}"),
                dtype,
                vocab,
                &values,
                &temperature,
            ));
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
        out.push(
            case(format!("golden::{name}"), DType::F32, 4, &logits, &[t])
                .expect("probs", float_tensor(DType::F32, &[1, 4], &expected)),
        );
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
    let mut values = Vec::new();
    for r in 0..rows {
        let mut row = logit_row(&mut rng, vocab);
        for x in row.iter_mut() {
            match (r % 4, rng.below(6)) {
                (0, 0) => *x = f32::NAN,
                (1, 1) => *x = f32::INFINITY,
                (2, 2) => *x = f32::NEG_INFINITY,
                (3, _) => *x = f32::from_bits(rng.next_u64() as u32),
                _ => {}
            }
        }
        values.extend(row);
    }
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
