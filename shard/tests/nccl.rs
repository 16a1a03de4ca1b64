//! The NCCL engine on a one-rank communicator (feature `nccl`; needs a GPU and the NCCL
//! library): its collectives, and sharded sampling whose exchange runs over it, against the
//! unsharded reference. Without a GPU the test says why it is skipped, unless `SPECULA_REQUIRE`
//! names `nccl` (`ci/test-cuda.sh` on a GPU machine), which makes a missing GPU a failure.
#![cfg(feature = "nccl")]

use specula_backend_api::ops::VocabSlice;
use specula_reference::ReferenceDevice;
use specula_shard::check::{Lcg, Rows, compare, sharded, unsharded};
use specula_shard::{Group, NcclGroup, Partition, Shard};

#[test]
fn a_one_rank_nccl_group_samples_the_unsharded_tokens() {
    let required =
        std::env::var("SPECULA_REQUIRE").is_ok_and(|r| r.split(',').any(|x| x == "nccl"));
    let engine = match NcclGroup::single(0) {
        Ok(engine) => engine,
        Err(e) if !required => {
            eprintln!("skipped: no NCCL group on this machine ({e})");
            return;
        }
        Err(e) => panic!("SPECULA_REQUIRE names nccl, but: {e}"),
    };
    let group = Group::new(engine);
    let mut v = vec![3u64, 9];
    group.max_u64(&mut v).expect("max");
    assert_eq!(v, [3, 9]);
    let mut s = vec![u128::MAX - 1];
    group.sum_u128(&mut s).expect("sum");
    assert_eq!(s, [u128::MAX - 1]);
    assert_eq!(group.all_gather(&[1, 2, 3]).expect("gather"), [1, 2, 3]);
    let device = ReferenceDevice::new();
    for (vocab, logits) in [(97, true), (4099, false), (151936, true)] {
        let rows = Rows::random(&mut Lcg::new(vocab as u64), 3, vocab, logits);
        let partition = Partition::agree(&group, VocabSlice::whole(vocab)).expect("partition");
        let shard = Shard {
            device: &device,
            group: &group,
            partition: &partition,
        };
        let got = sharded(&shard, &rows, 8).expect("sharded");
        let expected = unsharded(&device, &rows, 8).expect("unsharded");
        compare(&format!("nccl V={vocab}"), &got, &expected).unwrap_or_else(|e| panic!("{e}"));
    }
}
