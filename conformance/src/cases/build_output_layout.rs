//! Cases of `build_output_layout` (`docs/semantics.md` §2).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;

use super::Size;
use super::generate::{Batch, Rng, batch_name, dims, i32s};
use crate::Result;
use crate::case::{Dims, TensorSpec};
use crate::cases::Case;
use crate::exec::{HostLens, OpCase, Runner};

/// The parameters of a `build_output_layout` case (the JSON header of a case file, beside `"op"`).
/// Inputs `seq_lens_this_time`, `seq_lens_encoder`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Batch shape.
    pub dims: Dims,
    /// Rows of `batch_id_per_token_output` (≥ `real_bsz · S`).
    pub rows: usize,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let n = self.dims.max_bsz;
        vec![
            TensorSpec::i32("seq_lens_this_time", n),
            TensorSpec::i32("seq_lens_encoder", n),
        ]
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let Params { dims, rows } = *self;
        let device = r.device();
        let host_lens = r.host_lens()?;
        let lens = r.lens()?;
        let [
            seq_lens_output,
            cu_seqlens_q,
            cu_seqlens_q_output,
            batch_id_per_token_output,
        ] = r.outputs([
            ("seq_lens_output", DType::I32, &[dims.max_bsz]),
            ("cu_seqlens_q", DType::I32, &[dims.real_bsz + 1]),
            ("cu_seqlens_q_output", DType::I32, &[dims.real_bsz + 1]),
            ("batch_id_per_token_output", DType::I32, &[rows]),
        ])?;
        device.build_output_layout(
            &lens.slot_lens(),
            &mut LayoutOutputs {
                seq_lens_output,
                cu_seqlens_q,
                cu_seqlens_q_output,
                batch_id_per_token_output,
            },
            &LayoutParams {
                dims: dims.into(),
                host: host_lens.as_ref().map(HostLens::slot_lens),
            },
        )?;
        Ok(())
    }
}

fn case(name: String, dims: Dims, rows: usize, this_time: &[i32], encoder: &[i32]) -> Case {
    Case::new(name, Params { dims, rows })
        .with("seq_lens_this_time", i32s(this_time))
        .with("seq_lens_encoder", i32s(encoder))
}

/// The batch shapes of the batch ops: 1, primes, partial batches, every S from 1 to 8.
pub(crate) fn batch_shapes(size: Size) -> Vec<Dims> {
    let mut shapes = vec![
        dims(1, 1, 1),
        dims(1, 1, 8),
        dims(3, 3, 4),
        dims(5, 3, 2),
        dims(8, 8, 6),
        dims(13, 11, 5),
        dims(32, 29, 3),
        dims(64, 64, 7),
        dims(256, 200, 4),
        dims(256, 256, 8),
    ];
    if size == Size::Full {
        shapes.extend([dims(512, 509, 6), dims(1024, 1024, 8)]);
    }
    shapes
}

/// Every case of `build_output_layout`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for d in batch_shapes(size) {
        let mut rng = Rng::new(
            "layout",
            (d.max_bsz * 131 + d.real_bsz * 17 + d.max_step_tokens) as u64,
        );
        let batch = Batch::random(&mut rng, d, 40);
        out.push(case(
            batch_name(&d),
            d,
            batch.capacity(),
            &batch.this_time,
            &batch.encoder,
        ));
        // A larger row buffer than real_bsz · S (the caller's capacity with prefill rows).
        let rows = batch.capacity() + 3;
        out.push(case(
            format!("{}_rows{rows}", batch_name(&d)),
            d,
            rows,
            &batch.this_time,
            &batch.encoder,
        ));
    }
    // Nothing described this step.
    out.push(case(
        "bs4_s3_real0".into(),
        dims(4, 0, 3),
        0,
        &[2, 1, 5, 0],
        &[0, 0, 5, 0],
    ));
    out.push(case(
        "bs4_s3_real0_rows5".into(),
        dims(4, 0, 3),
        5,
        &[0; 4],
        &[0; 4],
    ));
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    // The contract's example batch: this_time [3, 5, 0, 2], encoder [0, 5, 0, 0], S = 3.
    let d = dims(5, 4, 3);
    vec![
        case(
            "golden::contract_example".into(),
            d,
            12,
            &[3, 5, 0, 2, 9],
            &[0, 5, 0, 0, 4],
        )
        .expect("seq_lens_output", i32s(&[3, 1, 0, 2, 0]))
        .expect("cu_seqlens_q", i32s(&[0, 3, 8, 8, 10]))
        .expect("cu_seqlens_q_output", i32s(&[0, 3, 4, 4, 6]))
        .expect(
            "batch_id_per_token_output",
            i32s(&[0, 0, 0, 1, 3, 3, -1, -1, -1, -1, -1, -1]),
        ),
        // Plain decoding: one row per running slot.
        case(
            "golden::plain_decoding".into(),
            dims(4, 4, 1),
            4,
            &[1, 0, 1, 7],
            &[0, 0, 0, 7],
        )
        .expect("seq_lens_output", i32s(&[1, 0, 1, 1]))
        .expect("cu_seqlens_q", i32s(&[0, 1, 1, 2, 9]))
        .expect("cu_seqlens_q_output", i32s(&[0, 1, 1, 2, 3]))
        .expect("batch_id_per_token_output", i32s(&[0, 2, 3, -1])),
        // Hostile lengths with their documented fallbacks: negative counts as 0, decode rows
        // clamped to S, prefill is one row whatever its length, saturating sums.
        case(
            "golden::hostile_lengths".into(),
            dims(6, 5, 4),
            20,
            &[-3, 9, 2, i32::MAX, 3, 77],
            &[0, 0, -1, 1, 5, 0],
        )
        .device_only()
        .expect("seq_lens_output", i32s(&[0, 4, 2, 1, 1, 0]))
        .expect("cu_seqlens_q", i32s(&[0, 0, 9, 11, i32::MAX, i32::MAX]))
        .expect("cu_seqlens_q_output", i32s(&[0, 0, 4, 6, 7, 8]))
        .expect(
            "batch_id_per_token_output",
            i32s(&[
                1, 1, 1, 1, 2, 2, 3, 4, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
            ]),
        ),
    ]
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("layout/hostile", 1);
    let mut out = Vec::new();
    for (i, d) in [dims(16, 16, 4), dims(37, 31, 8), dims(256, 256, 3)]
        .into_iter()
        .enumerate()
    {
        let garbage = |rng: &mut Rng| match rng.below(8) {
            0 => i32::MIN,
            1 => -1,
            2 => i32::MAX,
            3 => rng.next_u64() as i32,
            4 => (d.max_step_tokens + 1 + rng.below(100)) as i32,
            _ => rng.below(d.max_step_tokens + 1) as i32,
        };
        let this_time: Vec<i32> = (0..d.max_bsz).map(|_| garbage(&mut rng)).collect();
        let encoder: Vec<i32> = (0..d.max_bsz).map(|_| garbage(&mut rng)).collect();
        out.push(case(
            format!("hostile::garbage_lengths_{i}"),
            d,
            d.real_bsz * d.max_step_tokens,
            &this_time,
            &encoder,
        ));
    }
    out
}
