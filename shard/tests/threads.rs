//! Sharded sampling over in-process thread groups: every rank's tokens, argmax and candidates
//! equal the unsharded reference device's, for 1 to 4 ranks, even and uneven partitions and
//! slices down to one token; and the failures are typed errors on every rank.

use std::time::Duration;

use specula_backend_api::ops::VocabSlice;
use specula_reference::ReferenceDevice;
use specula_shard::check::{Lcg, Rows, compare, sharded, unsharded};
use specula_shard::{Group, Partition, Shard, ShardError, ThreadGroup};

/// Runs `f(rank, group)` on each member of a new `ranks`-thread group; returns each rank's result.
fn on_ranks<T: Send + 'static>(
    ranks: usize,
    timeout: Duration,
    f: impl Fn(usize, Group) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let handles: Vec<_> = ThreadGroup::with_timeout(ranks, timeout)
        .into_iter()
        .enumerate()
        .map(|(rank, member)| {
            let f = f.clone();
            std::thread::spawn(move || f(rank, Group::new(member)))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("a rank panicked"))
        .collect()
}

/// The slices of `vocab` over `ranks`: even, or with rank 0 holding one token (uneven).
fn slice_of(vocab: usize, ranks: usize, rank: usize, uneven: bool) -> VocabSlice {
    if !uneven || ranks == 1 {
        return VocabSlice::even(vocab, ranks, rank).expect("a slice");
    }
    match rank {
        0 => VocabSlice {
            first: 0,
            len: 1,
            vocab,
        },
        r => {
            let rest = VocabSlice::even(vocab - 1, ranks - 1, r - 1).expect("a slice");
            VocabSlice {
                first: rest.first + 1,
                len: rest.len,
                vocab,
            }
        }
    }
}

fn check(ranks: usize, vocab: usize, rows: usize, logits: bool, uneven: bool, seed: u64) {
    let results = on_ranks(ranks, Duration::from_secs(60), move |rank, group| {
        let rows = Rows::random(&mut Lcg::new(seed), rows, vocab, logits);
        let device = ReferenceDevice::new();
        let expected = unsharded(&device, &rows, 8).expect("unsharded");
        let partition =
            Partition::agree(&group, slice_of(vocab, ranks, rank, uneven)).expect("partition");
        let shard = Shard {
            device: &device,
            group: &group,
            partition: &partition,
        };
        let got = sharded(&shard, &rows, 8).expect("sharded");
        compare(&format!("rank {rank} of {ranks}"), &got, &expected)
    });
    for r in results {
        r.unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn every_rank_samples_the_unsharded_token() {
    for (ranks, vocab, uneven, seed) in [
        (1, 97, false, 1),
        (2, 97, false, 2),
        (3, 100, true, 3),
        (4, 5, true, 4),
        (4, 4099, false, 5),
        (3, 2500, true, 6),
    ] {
        for logits in [true, false] {
            check(
                ranks,
                vocab,
                12,
                logits,
                uneven,
                seed * 2 + u64::from(logits),
            );
        }
    }
}

#[test]
fn a_partition_that_is_not_one_is_an_error_on_every_rank() {
    let results = on_ranks(3, Duration::from_secs(20), |rank, group| {
        // Rank 2 thinks the vocabulary is larger.
        let vocab = if rank == 2 { 31 } else { 30 };
        Partition::agree(
            &group,
            VocabSlice {
                first: 10 * rank,
                len: 10,
                vocab,
            },
        )
    });
    for r in results {
        assert!(matches!(r, Err(ShardError::Mismatch { .. })), "{r:?}");
    }
    let gap = on_ranks(2, Duration::from_secs(20), |rank, group| {
        Partition::agree(
            &group,
            VocabSlice {
                first: 11 * rank,
                len: 10,
                vocab: 21,
            },
        )
    });
    for r in gap {
        assert!(matches!(r, Err(ShardError::Mismatch { .. })), "{r:?}");
    }
}

#[test]
fn a_rank_that_stops_is_a_timeout_on_the_others() {
    let results = on_ranks(3, Duration::from_millis(300), |rank, group| {
        if rank == 1 {
            return Ok(Vec::new()); // this rank never calls
        }
        let mut v = vec![rank as u64];
        group.max_u64(&mut v).map(|()| v)
    });
    assert!(results[1].is_ok());
    for r in [&results[0], &results[2]] {
        assert!(matches!(r, Err(ShardError::Timeout { .. })), "{r:?}");
    }
}
