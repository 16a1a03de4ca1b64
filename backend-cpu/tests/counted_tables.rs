//! The CPU keeps the counted bits of a count table between calls (`ops/process_logits/counted.rs`):
//! one count table on the device, processed again after each way its contents can change —
//! `update_state` counting tokens, a write to one slot's row, a write over the whole table —
//! must give exactly what the reference device gives from the new contents uploaded afresh.

use specula_backend_api::ops::BatchDims;
use specula_backend_api::{Buffer, DType, Device, DeviceExt, WriteAt};
use specula_backend_cpu::CpuDevice;
use specula_reference::ReferenceDevice;
use specula_reference::fixtures::{
    ProcessCase, Rng, Shape, Spec, StateCase, check_process, run_process, run_process_with_counts,
    run_state, run_state_with_counts,
};

/// `update_state` of case `c`'s batch: every live slot emits 1 ..= S tokens, mostly tokens it
/// has not counted yet (so counts go from 0 to 1) and repeats of them.
fn counting_step(rng: &mut Rng, c: &ProcessCase) -> StateCase {
    let BatchDims {
        max_bsz,
        max_step_tokens: s,
        ..
    } = c.dims;
    let fresh: Vec<i32> = (0..max_bsz * s)
        .map(|_| rng.below(c.vocab) as i32)
        .collect();
    let accept_tokens = fresh
        .iter()
        .enumerate()
        .map(|(i, &t)| if i % 3 == 2 { fresh[i - 1] } else { t })
        .collect();
    StateCase {
        dims: c.dims,
        mml: c.max_model_len,
        vocab: c.vocab,
        accept_tokens,
        is_block: vec![0; max_bsz],
        prompt_lens: vec![0; max_bsz],
        max_dec_len: vec![i32::MAX; max_bsz],
        end_tokens: vec![-1],
        accept_num: (0..max_bsz).map(|_| 1 + rng.below(s) as i32).collect(),
        stop_flags: vec![0; max_bsz],
        token_ids_all: vec![0; max_bsz * c.max_model_len],
        step_idx: vec![0; max_bsz],
        infer_seed: vec![0; max_bsz],
        draft_tokens: vec![0; max_bsz * s],
        encoder: vec![0; max_bsz],
        decoder: vec![0; max_bsz],
        token_counts: Some(c.token_counts.clone()),
    }
}

/// Random counts for one row of `vocab`: mostly 0, some positive, some negative.
fn counts_row(rng: &mut Rng, vocab: usize) -> Vec<i32> {
    (0..vocab)
        .map(|_| rng.pick(&[0, 0, 0, 0, 1, 2, 9, -3]))
        .collect()
}

#[test]
fn kept_bits_follow_every_change_of_the_table() {
    let cpu = CpuDevice::with_threads(2).expect("cpu device");
    let reference = ReferenceDevice::new();
    for seed in 0..120u64 {
        let mut rng = Rng(0x00c0_47ed ^ seed);
        let vocab = rng.pick(&[37, 300, 1031]);
        let spec = Spec {
            shape: Shape::slots(&mut rng, vocab),
            dtype: DType::F32,
            logits: !rng.chance(1, 4),
            hostile: rng.chance(1, 3),
            layout: None,
        };
        let mut c = ProcessCase::random(&mut rng, &spec);
        let mut counts = cpu.upload(&c.token_counts).expect("upload");
        let check = |c: &ProcessCase, counts: &Buffer, what: &str| {
            let want = run_process(&reference, c).expect("reference");
            let got = run_process_with_counts(&cpu, c, None, counts).expect("cpu");
            if let Err(e) = check_process(c, &got, &want, &format!("seed {seed}: {what}")) {
                panic!("{e}");
            }
        };
        check(&c, &counts, "first call");
        check(&c, &counts, "same table again");

        let step = counting_step(&mut rng, &c);
        let got = run_state_with_counts(&cpu, &step, Some(&mut counts)).expect("cpu state");
        let want = run_state(&reference, &step).expect("reference state");
        assert_eq!(got, want, "seed {seed}: update_state");
        c.token_counts = want.8;
        check(&c, &counts, "after update_state counted tokens");

        let b = rng.below(c.dims.max_bsz);
        let row = counts_row(&mut rng, vocab);
        cpu.write_many(&mut [WriteAt::new(&mut counts, b * vocab, &row)])
            .expect("write one slot");
        c.token_counts[b * vocab..(b + 1) * vocab].copy_from_slice(&row);
        check(&c, &counts, "after a write to one slot");

        let table: Vec<i32> = (0..c.dims.max_bsz)
            .flat_map(|_| counts_row(&mut rng, vocab))
            .collect();
        cpu.write(&mut counts, &table).expect("write the table");
        c.token_counts = table;
        check(&c, &counts, "after a write of the whole table");
    }
}
