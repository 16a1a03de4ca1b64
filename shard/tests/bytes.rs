//! The exchange's size (`docs/semantics.md` §4d), from the counters (bytes are deterministic):
//! at V = 151936, 4 ranks, 64 rows, the bytes a rank exchanges per row are at most 1 % of
//! gathering the row (4 · V) with top-k 50, and at most 5 % with top-k 0 and top-p 0.9.

use std::time::Duration;

use specula_backend_api::DeviceExt;
use specula_backend_api::ops::{Scores, VocabSlice};
use specula_backend_cpu::CpuDevice;
use specula_shard::check::{Lcg, Rows};
use specula_shard::{
    Group, HostRows, Partition, Shard, SliceRows, ThreadGroup, top_k_top_p_sample,
};

const VOCAB: usize = 151_936;
const RANKS: usize = 4;
const ROWS: usize = 64;

/// Bytes rank 0 exchanges per row sampling 64 random logits rows with `top_k`, `top_p`.
fn bytes_per_row(top_k: i32, top_p: f32) -> f64 {
    let handles: Vec<_> = ThreadGroup::with_timeout(RANKS, Duration::from_secs(120))
        .into_iter()
        .map(|member| {
            std::thread::spawn(move || {
                let group = Group::new(member);
                let slice = VocabSlice::even(VOCAB, RANKS, group.rank()).expect("a slice");
                let mut rows = Rows::random(&mut Lcg::new(30), ROWS, VOCAB, true);
                rows.top_k = vec![top_k; ROWS];
                rows.top_p = vec![top_p; ROWS];
                rows.temperature = vec![1.0; ROWS];
                let device = CpuDevice::with_threads(1).expect("cpu");
                let cut: Vec<f32> = rows
                    .values
                    .chunks(VOCAB)
                    .flat_map(|r| r[slice.first..slice.first + slice.len].to_vec())
                    .collect();
                let logits = device.upload(&cut).expect("upload");
                let temperature = device.upload(&rows.temperature).expect("upload");
                let partition = Partition::agree(&group, slice).expect("partition");
                let shard = Shard {
                    device: &device,
                    group: &group,
                    partition: &partition,
                };
                let host = HostRows {
                    top_k: &rows.top_k,
                    top_p: &rows.top_p,
                    seed: &rows.seed,
                    temperature: Some(&rows.temperature),
                    min_p: None,
                };
                let before = group.stats();
                top_k_top_p_sample(
                    &shard,
                    &SliceRows::new(Scores::logits(&logits, &temperature)),
                    &host,
                )
                .expect("sample");
                let spent = group.stats().since(&before);
                (group.rank(), spent)
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("a rank"))
        .collect();
    let spent = results.iter().find(|(r, _)| *r == 0).expect("rank 0").1;
    assert!(
        results.iter().all(|(_, s)| *s == spent),
        "every rank exchanges the same: {results:?}"
    );
    let per_row = spent.bytes as f64 / ROWS as f64;
    let ratio = per_row / (4 * VOCAB) as f64;
    eprintln!(
        "top_k {top_k} top_p {top_p}: {} calls, {per_row:.0} bytes per row = {:.3} % of gathering ({} bytes)",
        spent.calls,
        100.0 * ratio,
        4 * VOCAB
    );
    ratio
}

#[test]
fn a_top_k_50_row_costs_at_most_one_percent_of_gathering_it() {
    assert!(bytes_per_row(50, 1.0) <= 0.01);
    assert!(bytes_per_row(50, 0.9) <= 0.01);
}

#[test]
fn a_top_p_row_costs_at_most_five_percent_of_gathering_it() {
    assert!(bytes_per_row(0, 0.9) <= 0.05);
}
