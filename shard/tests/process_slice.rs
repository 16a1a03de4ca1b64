//! `process_logits` over one rank's slice (`docs/semantics.md` §4d, §5.12): for random batches
//! with every §4c parameter on (hostile device contents included), every partition's slices of
//! the processed rows are the slices of the whole rows' processing without min_p, and the
//! largest rank key of the slices' fallbacks names the whole row's fallback — on the reference
//! and on the CPU backend.

use specula_backend_api::Device;
use specula_backend_api::ops::VocabSlice;
use specula_backend_api::ops::process_logits::{PENALTY_FIELDS, penalty};
use specula_backend_api::shard::{KeyOrder, NO_KEY, key_id, token_key};
use specula_backend_cpu::CpuDevice;
use specula_reference::ReferenceDevice;
use specula_reference::fixtures::{self, Layout, ProcessCase, Rng, Shape, Spec};

/// The partitions of `vocab` a case is cut into: one slice, two even ones, a one-token first
/// slice, and three uneven ones.
fn partitions(vocab: usize) -> Vec<Vec<VocabSlice>> {
    let cut = |ends: &[usize]| {
        let mut first = 0;
        ends.iter()
            .map(|&end| {
                let s = VocabSlice {
                    first,
                    len: end - first,
                    vocab,
                };
                first = end;
                s
            })
            .collect::<Vec<_>>()
    };
    let mut out = vec![cut(&[vocab])];
    if vocab >= 2 {
        out.push(cut(&[vocab / 2, vocab]));
        out.push(cut(&[1, vocab]));
    }
    if vocab >= 4 {
        out.push(cut(&[vocab / 3 + 1, vocab - 2, vocab]));
    }
    out
}

/// The case with min_p off (a slice does not apply it).
fn without_min_p(mut c: ProcessCase) -> ProcessCase {
    for row in c.penalties.chunks_exact_mut(PENALTY_FIELDS) {
        row[penalty::MIN_P] = 0.0;
    }
    c
}

/// The whole row's fallback from the slices' (`docs/semantics.md` §4d): the largest rank key of
/// the slices' fallback tokens, at their processed values.
fn joined_fallback(c: &ProcessCase, row: usize, processed: &[u32], fallbacks: &[i32]) -> i32 {
    let key = fallbacks
        .iter()
        .filter_map(|&t| usize::try_from(t).ok())
        .map(|id| {
            let value = f32::from_bits(processed[row * c.vocab + id]);
            token_key(KeyOrder::Rank, c.logits, value, id)
        })
        .max()
        .unwrap_or(NO_KEY);
    match key {
        NO_KEY => -1,
        key => key_id(key) as i32,
    }
}

fn check(device: &dyn Device, name: &str, c: &ProcessCase) {
    let reference = ReferenceDevice::new();
    let (whole, whole_fallback) = fixtures::run_process(&reference, c).expect("whole rows");
    for partition in partitions(c.vocab) {
        let mut fallbacks = vec![Vec::new(); c.rows];
        for slice in &partition {
            let (processed, fallback) =
                fixtures::run_process_slice(device, c, *slice).expect("a slice");
            for r in 0..c.rows {
                let want = &whole[r * c.vocab + slice.first..r * c.vocab + slice.end()];
                let got = &processed[r * slice.len..(r + 1) * slice.len];
                assert_eq!(got, want, "{name}: row {r} of slice {slice:?}");
                fallbacks[r].push(fallback[r]);
            }
        }
        for (r, f) in fallbacks.iter().enumerate() {
            assert_eq!(
                joined_fallback(c, r, &whole, f),
                whole_fallback[r],
                "{name}: the fallback of row {r} from the slices {partition:?} ({f:?})"
            );
        }
    }
}

#[test]
fn slices_of_processed_rows_are_the_processed_slices() {
    let cpu = CpuDevice::with_threads(2).expect("cpu");
    let reference = ReferenceDevice::new();
    let mut rng = Rng(30);
    let mut rows = 0;
    for i in 0..48 {
        let vocab = [1, 2, 7, 33, 97, 300, 1025][i % 7];
        let spec = Spec {
            shape: Shape::random(&mut rng, vocab),
            dtype: [
                specula_backend_api::DType::F32,
                specula_backend_api::DType::BF16,
            ][i % 2],
            logits: i % 3 != 0,
            hostile: i % 4 == 3,
            layout: Some(Layout::ALL[i % Layout::ALL.len()]),
        };
        let c = without_min_p(ProcessCase::random(&mut rng, &spec));
        let name = format!("case {i} (V = {vocab}, {spec:?})");
        check(&reference, &format!("reference: {name}"), &c);
        check(&cpu, &format!("cpu: {name}"), &c);
        rows += c.rows;
    }
    assert!(rows >= 100, "only {rows} rows checked");
}
