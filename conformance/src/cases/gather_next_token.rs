//! Cases of `gather_next_token` (contract §4.1).

use specula_backend_api::DType;

use super::Size;
use super::build_output_layout::batch_shapes;
use super::generate::{Batch, FLOAT_DTYPES, Rng, batch_name, dims, float_tensor, i32s};
use crate::case::{Case, CaseParams};
use crate::tensor::HostTensor;

/// Rows of `hidden` values of `dtype`: floats with distinct bit patterns, or raw integers.
fn hidden_states(rng: &mut Rng, dtype: DType, rows: usize, hidden: usize) -> HostTensor {
    let n = rows * hidden;
    match dtype {
        DType::I32 => HostTensor::new(
            &[rows, hidden],
            &(0..n).map(|_| rng.next_u64() as i32).collect::<Vec<_>>(),
        ),
        DType::U8 => HostTensor::new(
            &[rows, hidden],
            &(0..n).map(|_| rng.next_u64() as u8).collect::<Vec<_>>(),
        ),
        _ => {
            let v: Vec<f32> = (0..n)
                .map(|i| (i / hidden) as f32 + rng.normal() as f32 * 0.01)
                .collect();
            float_tensor(dtype, &[rows, hidden], &v)
        }
    }
}

/// A gather case over `batch`, with layout tensors as `build_output_layout` writes them.
fn case(
    name: String,
    batch: &Batch,
    rows: usize,
    hidden: usize,
    is_speculative: bool,
    x: HostTensor,
) -> Case {
    let token_num = x.shape[0];
    let params = CaseParams::GatherNextToken {
        dims: batch.dims,
        token_num,
        hidden,
        is_speculative,
    };
    batch
        .with_lens(Case::new(name, params))
        .with("hidden_states", x)
        .with("cu_seqlens_q", i32s(&batch.cu_seqlens_q()))
        .with("cu_seqlens_q_output", i32s(&batch.cu_seqlens_q_output()))
        .with("batch_id_per_token_output", i32s(&batch.batch_id(rows)))
}

/// Every case of `gather_next_token`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    let dtypes = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U8];
    let mut hiddens = vec![1, 7, 64, 129, 1024];
    if size == Size::Full {
        hiddens.extend([4096, 8192]);
    }
    for (i, d) in batch_shapes(Size::Quick).into_iter().enumerate() {
        for (j, &hidden) in hiddens.iter().enumerate() {
            // Wide rows only with small batches in Quick.
            if size == Size::Quick && hidden >= 1024 && d.max_bsz > 8 {
                continue;
            }
            if hidden > 1024 && (i + j) % 3 != 0 {
                continue;
            }
            let dtype = dtypes[(i + j) % dtypes.len()];
            let mut rng = Rng::new(&format!("gather/{dtype}"), (i * 100 + j) as u64);
            let batch = Batch::random(&mut rng, d, 24);
            let x = hidden_states(&mut rng, dtype, batch.token_num(), hidden);
            let rows = batch.capacity() + if j % 2 == 0 { 0 } else { 5 };
            for spec in [true, false] {
                let mode = if spec { "spec" } else { "plain" };
                out.push(case(
                    format!("{mode}::{dtype}_{}_h{hidden}", batch_name(&d)),
                    &batch,
                    rows,
                    hidden,
                    spec,
                    x.clone(),
                ));
            }
        }
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    // Slots: decode 3 tokens (packed 0..3), prefill 4 (3..7), empty, decode 2 (7..9); S = 3.
    let batch = Batch::new(dims(5, 4, 3), vec![3, 4, 0, 2, 0], vec![0, 4, 0, 0, 0]);
    let x: Vec<f32> = (0..9).flat_map(|r| [r as f32, 100.0 + r as f32]).collect();
    let spec_rows = [0, 1, 2, 6, 7, 8];
    let mut spec: Vec<f32> = spec_rows
        .iter()
        .flat_map(|&r| [r as f32, 100.0 + r as f32])
        .collect();
    spec.resize(12 * 2, 0.0);
    let plain: Vec<f32> = [Some(2), Some(6), None, Some(8), None]
        .iter()
        .flat_map(|r| r.map_or([0.0, 0.0], |r| [r as f32, 100.0 + r as f32]))
        .collect();
    let mut out = Vec::new();
    for dtype in FLOAT_DTYPES {
        let tensor = float_tensor(dtype, &[9, 2], &x);
        out.push(
            case(
                format!("golden::spec_{dtype}"),
                &batch,
                12,
                2,
                true,
                tensor.clone(),
            )
            .expect("out", float_tensor(dtype, &[12, 2], &spec)),
        );
        out.push(
            case(
                format!("golden::plain_{dtype}"),
                &batch,
                12,
                2,
                false,
                tensor,
            )
            .expect("out", float_tensor(dtype, &[5, 2], &plain)),
        );
    }
    out
}

fn hostile() -> Vec<Case> {
    let mut out = Vec::new();
    for (i, d) in [dims(9, 9, 4), dims(33, 30, 6)].into_iter().enumerate() {
        let mut rng = Rng::new("gather/hostile", i as u64);
        let batch = Batch::random(&mut rng, d, 12);
        let x = hidden_states(&mut rng, DType::F32, batch.token_num(), 33);
        let rows = batch.capacity();
        let garbage = |rng: &mut Rng, n: usize| -> Vec<i32> {
            (0..n)
                .map(|_| match rng.below(6) {
                    0 => i32::MIN,
                    1 => -1,
                    2 => i32::MAX,
                    3 => rng.next_u64() as i32,
                    _ => rng.below(2 * rows + 2) as i32,
                })
                .collect()
        };
        let base = case(String::new(), &batch, rows, 33, true, x);
        for spec in [true, false] {
            let mode = if spec { "spec" } else { "plain" };
            let mut c = base.clone();
            if let CaseParams::GatherNextToken { is_speculative, .. } = &mut c.params {
                *is_speculative = spec;
            }
            let mut offsets = c.clone();
            offsets.name = format!("hostile::{mode}_garbage_offsets_{i}");
            offsets = offsets
                .with("cu_seqlens_q", i32s(&garbage(&mut rng, d.real_bsz + 1)))
                .with(
                    "cu_seqlens_q_output",
                    i32s(&garbage(&mut rng, d.real_bsz + 1)),
                )
                .with("batch_id_per_token_output", i32s(&garbage(&mut rng, rows)));
            out.push(offsets);
            let mut lens = c;
            lens.name = format!("hostile::{mode}_garbage_lengths_{i}");
            lens = lens
                .with("seq_lens_this_time", i32s(&garbage(&mut rng, d.max_bsz)))
                .with("seq_lens_encoder", i32s(&garbage(&mut rng, d.max_bsz)));
            out.push(lens);
        }
    }
    out
}
