//! The quick cases of the sampling ops run sharded over in-process thread groups
//! (`docs/semantics.md` §4d): 2 ranks split evenly, 3 ranks with a one-token first slice, and 4
//! ranks split evenly, every rank on the CPU backend; each rank's outputs equal the reference's
//! outputs of the whole case (computed once). The same check runs across MPI processes in
//! `ci/test.sh` (`examples/sharded_decode_mpi.rs`). The sharded decoder runs on the CPU backend
//! for every partition, and on every other backend that opens here (wgpu, xpu-sim, CUDA: its
//! ranks share the backend's device) on 3 ranks with a one-token first slice.

use std::sync::Arc;
use std::time::Duration;

use specula_backend_cpu::CpuDevice;
use specula_conformance::cases::Size;
use specula_conformance::sharded::{ShardedCase, check_cases, sharded_cases};
use specula_shard::check::slice_of;
use specula_shard::{Group, Partition, Shard, ThreadGroup};

fn run(ranks: usize, uneven: bool, cases: Arc<Vec<ShardedCase>>) {
    let handles: Vec<_> = ThreadGroup::with_timeout(ranks, Duration::from_secs(300))
        .into_iter()
        .enumerate()
        .map(|(rank, member)| {
            let cases = cases.clone();
            std::thread::spawn(move || {
                let group = Group::new(member);
                let device = CpuDevice::with_threads(1).expect("cpu");
                let mut failures = Vec::new();
                for c in cases.iter() {
                    let vocab = specula_conformance::sharded::vocab(&c.case).unwrap_or(0);
                    if vocab < ranks {
                        continue;
                    }
                    let slice = slice_of(vocab, ranks, rank, uneven).expect("a slice");
                    let partition = Partition::agree(&group, slice).expect("partition");
                    let shard = Shard {
                        device: &device,
                        group: &group,
                        partition: &partition,
                    };
                    failures.extend(check_cases(&shard, std::slice::from_ref(c)));
                }
                failures
            })
        })
        .collect();
    let mut failed = Vec::new();
    for (rank, h) in handles.into_iter().enumerate() {
        for (name, why) in h.join().expect("a rank panicked") {
            failed.push(format!("rank {rank}/{ranks}: {name}: {why}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{} sharded failures:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn the_sampling_ops_cases_run_sharded_equal_the_reference() {
    let cases = Arc::new(sharded_cases(Size::Quick, 2).expect("cases"));
    assert!(cases.len() > 100, "{} cases", cases.len());
    for (ranks, uneven) in [(2, false), (3, true), (4, false)] {
        run(ranks, uneven, cases.clone());
    }
}

/// Whole decoder runs (n-gram speculative, every sampling parameter on, a bitmask,
/// log-probabilities; REJECTION with a draft model) emit the unsharded tokens on every rank, for
/// 1 to 4 ranks, even and uneven partitions.
#[test]
fn a_sharded_decoder_emits_the_unsharded_tokens() {
    use specula_conformance::sharded_decode::{Scenario, compare, run};
    for scenario in Scenario::all() {
        let device: Arc<dyn specula_backend_api::Device> =
            Arc::new(CpuDevice::with_threads(1).expect("cpu"));
        let want = run(&scenario, device, None).expect("unsharded run");
        eprintln!(
            "{}: {} steps, tokens {:?}, finished {:?}, drafts {}/{} accepted",
            scenario.name(),
            want.steps,
            want.tokens.iter().map(Vec::len).collect::<Vec<_>>(),
            want.finished,
            want.drafts_accepted,
            want.drafts_proposed
        );
        assert!(want.tokens.iter().all(|t| !t.is_empty()));
        // Speculation both accepts and rejects drafts.
        assert!(want.drafts_accepted > 0 && want.drafts_accepted < want.drafts_proposed);
        for (ranks, uneven) in [(1, false), (2, false), (3, true), (4, true)] {
            let handles: Vec<_> = ThreadGroup::with_timeout(ranks, Duration::from_secs(120))
                .into_iter()
                .enumerate()
                .map(|(rank, member)| {
                    std::thread::spawn(move || {
                        let slice = slice_of(scenario.vocab, ranks, rank, uneven).expect("slice");
                        let device: Arc<dyn specula_backend_api::Device> =
                            Arc::new(CpuDevice::with_threads(1).expect("cpu"));
                        run(&scenario, device, Some((Group::new(member), slice)))
                    })
                })
                .collect();
            for (rank, h) in handles.into_iter().enumerate() {
                let got = h
                    .join()
                    .expect("a rank panicked")
                    .unwrap_or_else(|e| panic!("{} rank {rank}/{ranks}: {e}", scenario.name()));
                if let Err(e) = compare(&scenario, &got, &want) {
                    panic!("{} rank {rank}/{ranks}: {e}", scenario.name());
                }
                if rank == 0 && ranks > 1 {
                    eprintln!(
                        "  {ranks} ranks: {} collective calls, {} bytes over {} steps",
                        got.exchanged.calls, got.exchanged.bytes, got.steps
                    );
                }
            }
        }
    }
}

/// The sharded decoder on the other backends (they process their slices on the device,
/// `Capabilities::sliced_processing`): every scenario on 3 ranks with a one-token first slice,
/// the ranks sharing one device, emits the tokens of the unsharded decoder on the CPU backend. A
/// backend that cannot open here is reported as skipped (a failure when `SPECULA_REQUIRE` names
/// it).
#[test]
fn a_sharded_decoder_on_every_backend_emits_the_unsharded_tokens() {
    use specula_backend_api::{BackendKind, Device};
    use specula_conformance::backends;
    use specula_conformance::sharded_decode::{Scenario, compare, run};
    let required = backends::required_from_env().expect("SPECULA_REQUIRE");
    let (ranks, uneven) = (3, true);
    for kind in [BackendKind::Wgpu, BackendKind::XpuSim, BackendKind::Cuda] {
        let backend = backends::probe(kind);
        let Some(device) = backend.device().cloned() else {
            assert!(
                !required.contains(&backend.name),
                "{} is required: {}",
                backend.name,
                backend.describe()
            );
            eprintln!("{}: skipped ({})", backend.name, backend.describe());
            continue;
        };
        let capabilities = device.capabilities();
        if !(capabilities.sharded && capabilities.sliced_processing && capabilities.processing) {
            eprintln!(
                "{}: skipped (the device does not process slices of sharded rows)",
                backend.name
            );
            continue;
        }
        for scenario in Scenario::all() {
            let cpu: Arc<dyn Device> = Arc::new(CpuDevice::with_threads(1).expect("cpu"));
            let want = run(&scenario, cpu, None).expect("unsharded run");
            let handles: Vec<_> = ThreadGroup::with_timeout(ranks, Duration::from_secs(120))
                .into_iter()
                .enumerate()
                .map(|(rank, member)| {
                    let device = device.clone();
                    std::thread::spawn(move || {
                        let slice = slice_of(scenario.vocab, ranks, rank, uneven).expect("slice");
                        run(&scenario, device, Some((Group::new(member), slice)))
                    })
                })
                .collect();
            for (rank, h) in handles.into_iter().enumerate() {
                let name = format!("{} {} rank {rank}/{ranks}", backend.name, scenario.name());
                let got = h
                    .join()
                    .expect("a rank panicked")
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                if let Err(e) = compare(&scenario, &got, &want) {
                    panic!("{name}: {e}");
                }
            }
            eprintln!(
                "{} {}: the unsharded tokens on every rank",
                backend.name,
                scenario.name()
            );
        }
    }
}
