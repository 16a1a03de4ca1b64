//! Cases of `build_sampling_params` (`docs/semantics.md` §3).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;

use super::Size;
use super::build_output_layout::batch_shapes;
use super::generate::{Batch, EDGE_SEEDS, Rng, batch_name, dims, f32s, i32s, u64s};
use super::top_k_top_p_sample::{pick_top_k, pick_top_p};
use crate::Result;
use crate::case::{Dims, TensorSpec, Want};
use crate::cases::Case;
use crate::exec::{HostLens, OpCase, Runner};

/// The parameters of a `build_sampling_params` case (the JSON header of a case file, beside `"op"`).
/// Inputs `top_p`, `top_k`, `temperature`, `infer_seed` (per slot), `seq_lens_this_time`,
/// `seq_lens_encoder`, `cu_seqlens_q_output`, `batch_id_per_token_output`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Batch shape.
    pub dims: Dims,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let d = &self.dims;
        let n = d.max_bsz;
        vec![
            TensorSpec::new("top_p", Want::Is(DType::F32), n),
            TensorSpec::i32("top_k", n),
            TensorSpec::new("temperature", Want::Is(DType::F32), n),
            TensorSpec::new("infer_seed", Want::Is(DType::U64), n),
            TensorSpec::i32("seq_lens_this_time", n),
            TensorSpec::i32("seq_lens_encoder", n),
            TensorSpec::i32("cu_seqlens_q_output", d.real_bsz + 1),
            TensorSpec::i32("batch_id_per_token_output", d.real_bsz * d.max_step_tokens).at_least(),
        ]
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let dims = self.dims.into();
        let device = r.device();
        let host_lens = r.host_lens()?;
        let host_top_p = r.host::<f32>("top_p")?;
        let host_temperature = r.host::<f32>("temperature")?;
        let [top_p, top_k, temperature, infer_seed] =
            r.inputs(["top_p", "top_k", "temperature", "infer_seed"])?;
        let (lens, layout) = (r.lens()?, r.layout()?);
        let rows = layout.rows();
        let [row_top_p, row_top_k, row_temperature, row_seed] = r.outputs([
            ("row_top_p", DType::F32, &[rows]),
            ("row_top_k", DType::I32, &[rows]),
            ("row_temperature", DType::F32, &[rows]),
            ("row_seed", DType::U64, &[rows]),
        ])?;
        device.build_sampling_params(
            &SamplingParamsInputs {
                slots: SlotSamplingParams {
                    top_p: &top_p,
                    top_k: &top_k,
                    temperature: &temperature,
                    infer_seed: &infer_seed,
                },
                lens: lens.slot_lens(),
                layout: layout.output_layout(),
            },
            &mut RowSamplingParams {
                top_p: row_top_p,
                top_k: row_top_k,
                temperature: row_temperature,
                seed: row_seed,
            },
            &SamplingParamsParams {
                dims,
                host: host_lens.as_ref().map(HostLens::slot_lens),
                host_top_p: host_top_p.as_deref(),
                host_temperature: host_temperature.as_deref(),
            },
        )?;
        Ok(())
    }
}

/// Per-slot sampling parameters.
struct Slots {
    top_p: Vec<f32>,
    top_k: Vec<i32>,
    temperature: Vec<f32>,
    infer_seed: Vec<u64>,
}

fn case(name: String, batch: &Batch, rows: usize, slots: &Slots) -> Case {
    batch
        .with_lens(Case::new(name, Params { dims: batch.dims }))
        .with("top_p", f32s(&slots.top_p))
        .with("top_k", i32s(&slots.top_k))
        .with("temperature", f32s(&slots.temperature))
        .with("infer_seed", u64s(&slots.infer_seed))
        .with("cu_seqlens_q_output", i32s(&batch.cu_seqlens_q_output()))
        .with("batch_id_per_token_output", i32s(&batch.batch_id(rows)))
}

fn random_slots(rng: &mut Rng, n: usize) -> Slots {
    Slots {
        top_p: (0..n).map(|_| pick_top_p(rng)).collect(),
        top_k: (0..n).map(|_| pick_top_k(rng, 32000)).collect(),
        temperature: (0..n)
            .map(|_| rng.pick(&[0.0, 0.3, 0.7, 1.0, 1.0, 1.5]))
            .collect(),
        infer_seed: (0..n).map(|_| rng.seed()).collect(),
    }
}

/// Every case of `build_sampling_params`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    for (i, d) in batch_shapes(size).into_iter().enumerate() {
        let mut rng = Rng::new("sampling_params", i as u64);
        let batch = Batch::random(&mut rng, d, 40);
        let slots = random_slots(&mut rng, d.max_bsz);
        let rows = batch.capacity() + if i % 2 == 0 { 0 } else { 4 };
        out.push(case(batch_name(&d), &batch, rows, &slots));
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    // The contract's known answer: top_p [.9, .8, .7, 1], top_k [10, 20, 30, 40], infer_seed
    // [100, 200, 300, 400], encoder [0, 5, 0, 0], this_time [3, 5, 0, 2].
    let batch = Batch::new(dims(4, 4, 3), vec![3, 5, 0, 2], vec![0, 5, 0, 0]);
    let slots = Slots {
        top_p: vec![0.9, 0.8, 0.7, 1.0],
        top_k: vec![10, 20, 30, 40],
        temperature: vec![0.5, 0.0, 2.0, 1.25],
        infer_seed: vec![100, 200, 300, 400],
    };
    let pad = 6;
    let golden = case("golden::contract_known_answer".into(), &batch, 12, &slots)
        .expect(
            "row_top_p",
            f32s(&[[0.9, 0.9, 0.9, 0.8, 1.0, 1.0].as_slice(), &[1.0; 6]].concat()),
        )
        .expect(
            "row_top_k",
            i32s(&[[10, 10, 10, 20, 40, 40].as_slice(), &[0; 6]].concat()),
        )
        .expect(
            "row_temperature",
            f32s(&[[0.5, 0.5, 0.5, 0.0, 1.25, 1.25].as_slice(), &[1.0; 6]].concat()),
        )
        .expect(
            "row_seed",
            u64s(&[[100, 104, 108, 200, 400, 404].as_slice(), &[0; 6]].concat()),
        );
    // Seeds wrap modulo MAX_INFER_SEED = 2^63 - 2 (raw values above it are reduced first).
    let m = specula_backend_api::abi::MAX_INFER_SEED;
    let batch2 = Batch::new(dims(3, 3, 4), vec![4, 1, 3], vec![0, 1, 0]);
    let slots2 = Slots {
        top_p: vec![0.5, f32::NAN, 2.0],
        top_k: vec![-3, 0, 7],
        temperature: vec![-1.0, 1.0, 0.25],
        infer_seed: vec![m - 4, u64::MAX, m - 1],
    };
    // Raw device values (NaN top_p, negative temperature) are copied as they are: device-only.
    let wrap = case(
        "golden::seed_wrap_raw_values".into(),
        &batch2,
        12 + pad,
        &slots2,
    )
    .device_only()
    .expect(
        "row_seed",
        u64s(
            &[
                [m - 4, 0, 4, 8, u64::MAX % m, m - 1, 3, 7].as_slice(),
                &[0; 10],
            ]
            .concat(),
        ),
    )
    .expect(
        "row_top_k",
        i32s(&[[-3, -3, -3, -3, 0, 7, 7, 7].as_slice(), &[0; 10]].concat()),
    )
    .expect(
        "row_temperature",
        f32s(
            &[
                [-1.0, -1.0, -1.0, -1.0, 1.0, 0.25, 0.25, 0.25].as_slice(),
                &[1.0; 10],
            ]
            .concat(),
        ),
    );
    vec![golden, wrap]
}

fn hostile() -> Vec<Case> {
    let mut out = Vec::new();
    for (i, d) in [dims(8, 8, 4), dims(37, 33, 6)].into_iter().enumerate() {
        let mut rng = Rng::new("sampling_params/hostile", i as u64);
        let batch = Batch::random(&mut rng, d, 10);
        let mut slots = random_slots(&mut rng, d.max_bsz);
        for (k, s) in slots.infer_seed.iter_mut().enumerate() {
            *s = EDGE_SEEDS[k % EDGE_SEEDS.len()];
        }
        for p in slots.top_p.iter_mut().step_by(3) {
            *p = rng.pick(&[f32::NAN, -1.0, 0.0, 7.0, f32::INFINITY]);
        }
        for t in slots.temperature.iter_mut().step_by(4) {
            *t = rng.pick(&[f32::NAN, -1.0, f32::INFINITY]);
        }
        let rows = batch.capacity();
        out.push(case(
            format!("hostile::seeds_near_2p63_bad_values_{i}"),
            &batch,
            rows,
            &slots,
        ));
        let garbage: Vec<i32> = (0..rows)
            .map(|_| rng.range(0, 3 * d.max_bsz) as i32 - d.max_bsz as i32)
            .collect();
        let offsets: Vec<i32> = (0..=d.real_bsz)
            .map(|_| rng.next_u64() as i32 % (2 * rows as i32 + 1))
            .collect();
        out.push(
            case(format!("hostile::garbage_layout_{i}"), &batch, rows, &slots)
                .with("batch_id_per_token_output", i32s(&garbage))
                .with("cu_seqlens_q_output", i32s(&offsets)),
        );
        let lens: Vec<i32> = (0..d.max_bsz)
            .map(|_| rng.pick(&[-5, 0, 1, 3, 9, i32::MAX, i32::MIN]))
            .collect();
        out.push(
            case(
                format!("hostile::garbage_lengths_{i}"),
                &batch,
                rows,
                &slots,
            )
            .with("seq_lens_this_time", i32s(&lens)),
        );
    }
    out
}
