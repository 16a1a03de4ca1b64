//! Sharded sampling across MPI processes: run with `mpirun -n N` (N = 1 … 8). Every rank
//! samples its slice of random rows (even and uneven partitions, slices down to one token,
//! vocabularies up to 151936, logits and probabilities) on the CPU backend, and checks that its
//! tokens, argmax and candidates equal those of the unsharded reference device; then a
//! partition that is not one must fail on every rank with a typed error. Prints one line per
//! check and `N passed, M failed`; exits non-zero on a failure.

use specula_backend_api::ops::VocabSlice;
use specula_backend_cpu::CpuDevice;
use specula_reference::ReferenceDevice;
use specula_shard::check::{Lcg, Rows, compare, sharded, slice_of, unsharded};
use specula_shard::{Group, MpiGroup, Partition, Shard, ShardError};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let group = Group::new(MpiGroup::init()?);
    let (rank, ranks) = (group.rank(), group.ranks());
    let cpu = CpuDevice::with_threads(1)?;
    let reference = ReferenceDevice::new();
    let (mut passed, mut failed) = (0, 0);
    let configs: [(usize, usize, bool); 8] = [
        (ranks, 6, false),
        (7, 5, true),
        (97, 9, false),
        (1025, 8, true),
        (4099, 8, false),
        (32000, 4, true),
        (128256, 2, false),
        (151936, 3, true),
    ];
    for (i, &(vocab, rows, uneven)) in configs.iter().enumerate() {
        for logits in [true, false] {
            let name = format!(
                "V={vocab} rows={rows} {} {}",
                if uneven { "uneven" } else { "even" },
                if logits { "logits" } else { "probs" }
            );
            let Some(slice) = slice_of(vocab, ranks, rank, uneven) else {
                continue;
            };
            let data = Rows::random(
                &mut Lcg::new(1000 + i as u64 * 2 + u64::from(logits)),
                rows,
                vocab,
                logits,
            );
            let partition = Partition::agree(&group, slice)?;
            let shard = Shard {
                device: &cpu,
                group: &group,
                partition: &partition,
            };
            let got = sharded(&shard, &data, 16)?;
            let expected = unsharded(&reference, &data, 16)?;
            match compare(&format!("rank {rank}/{ranks} {name}"), &got, &expected) {
                Ok(()) => passed += 1,
                Err(e) => {
                    eprintln!("FAIL {e}");
                    failed += 1;
                }
            }
        }
    }
    // The last rank sees another vocabulary (one rank alone: slices that end before V): a typed
    // error on every rank, not a hang or a token.
    let bad = VocabSlice {
        first: rank * 10,
        len: 10,
        vocab: if rank == ranks - 1 {
            10 * ranks + 1
        } else {
            10 * ranks
        },
    };
    match Partition::agree(&group, bad) {
        Err(ShardError::Mismatch { .. }) => passed += 1,
        other => {
            eprintln!("FAIL rank {rank}: a mismatched partition gave {other:?}");
            failed += 1;
        }
    }
    let stats = group.stats();
    println!(
        "rank {rank}/{ranks}: {} collective calls, {} bytes",
        stats.calls, stats.bytes
    );
    println!("rank {rank}: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
