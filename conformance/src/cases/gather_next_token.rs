//! Cases of `gather_next_token` (`docs/semantics.md` §5.2).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;

use super::Size;
use super::build_output_layout::batch_shapes;
use super::generate::{Batch, FLOAT_DTYPES, Rng, batch_name, dims, float_tensor, i32s};
use crate::Result;
use crate::case::{Dims, TensorSpec, Want};
use crate::cases::{Case, CaseParams};
use crate::exec::{HostLens, OpCase, Runner};
use crate::tensor::HostTensor;

/// The parameters of a `gather_next_token` case (the JSON header of a case file, beside `"op"`).
/// Inputs `hidden_states`, `cu_seqlens_q`, `seq_lens_this_time`, `seq_lens_encoder`,
/// `cu_seqlens_q_output`, `batch_id_per_token_output`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Batch shape.
    pub dims: Dims,
    /// Rows of `hidden_states`.
    pub token_num: usize,
    /// Row width.
    pub hidden: usize,
    /// Speculative (per output row) or not (per slot).
    pub is_speculative: bool,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let d = &self.dims;
        let bytes = self.token_num.saturating_mul(self.hidden);
        vec![
            TensorSpec::new("hidden_states", Want::Any, bytes),
            TensorSpec::i32("cu_seqlens_q", d.real_bsz + 1),
            TensorSpec::i32("seq_lens_this_time", d.max_bsz),
            TensorSpec::i32("seq_lens_encoder", d.max_bsz),
            TensorSpec::i32("cu_seqlens_q_output", d.real_bsz + 1),
            TensorSpec::i32("batch_id_per_token_output", d.real_bsz * d.max_step_tokens).at_least(),
        ]
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let Params {
            dims,
            token_num,
            hidden,
            is_speculative,
        } = *self;
        let device = r.device();
        let host_lens = r.host_lens()?;
        let [x, cu_q] = r.inputs(["hidden_states", "cu_seqlens_q"])?;
        let (lens, layout) = (r.lens()?, r.layout()?);
        let rows = match is_speculative {
            true => layout.rows(),
            false => dims.max_bsz,
        };
        let [out] = r.outputs([("out", x.dtype(), &[rows, hidden])])?;
        device.gather_next_token(
            &GatherInputs {
                hidden_states: &x,
                cu_seqlens_q: &cu_q,
                lens: lens.slot_lens(),
                layout: layout.output_layout(),
            },
            out,
            &GatherParams {
                dims: dims.into(),
                token_num,
                hidden,
                is_speculative,
                host: host_lens.as_ref().map(HostLens::slot_lens),
            },
        )?;
        Ok(())
    }
}

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
    let params = Params {
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
            if let CaseParams::GatherNextToken(Params { is_speculative, .. }) = &mut c.params {
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
