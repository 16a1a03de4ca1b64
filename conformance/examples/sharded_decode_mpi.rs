//! A tensor-parallel `Decoder` across MPI processes: run with `mpirun -n N` (N = 1 … 4). Each
//! rank runs the whole-decoder scenarios of `specula_conformance::sharded_decode` (every
//! strategy; n-gram speculative, or REJECTION with a draft model's rows; every §4c sampling
//! parameter on, a token bitmask, log-probabilities) twice: as one rank of a sharded decoder
//! holding its slice of every row (an even partition, then an uneven one where rank 0 holds one
//! token), and as an unsharded decoder over the whole rows. Every rank must emit the unsharded
//! tokens. First, the quick conformance cases of every sampling op run sharded
//! (`specula_conformance::sharded`: `top_k_top_p_sample`, `argmax`, `top_p_candidates`,
//! verification, `accept_logprobs`), each rank's outputs against the reference's outputs of the
//! whole case — an even partition, or with 3 ranks an uneven one where rank 0 holds one token.
//! Prints one line per check and `N passed, M failed`; exits non-zero on a failure.

use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use specula_backend_api::Device;
use specula_backend_cpu::CpuDevice;
use specula_conformance::cases::Size;
use specula_conformance::sharded::{check_cases, sharded_cases, vocab};
use specula_conformance::sharded_decode::{Scenario, compare, run};
use specula_shard::check::slice_of;
use specula_shard::{Collective, Group, MpiGroup, Partition, Result, Shard};

/// The MPI world, shared by the decoders this process builds one after another (MPI is
/// initialized once per process; each `Group` takes its engine by value).
#[derive(Clone)]
struct World(Rc<MpiGroup>);

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Collective for World {
    fn engine(&self) -> &'static str {
        self.0.engine()
    }
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn ranks(&self) -> usize {
        self.0.ranks()
    }
    fn max_u64(&self, values: &mut [u64]) -> Result<()> {
        self.0.max_u64(values)
    }
    fn max_f32(&self, values: &mut [f32]) -> Result<()> {
        self.0.max_f32(values)
    }
    fn sum_u64(&self, values: &mut [u64]) -> Result<()> {
        self.0.sum_u64(values)
    }
    fn sum_u128(&self, values: &mut [u128]) -> Result<()> {
        self.0.sum_u128(values)
    }
    fn all_gather(&self, send: &[u64], gathered: &mut [u64]) -> Result<()> {
        self.0.all_gather(send, gathered)
    }
}

/// The quick conformance cases of the sampling ops, each run sharded over the world: `(passed,
/// failed)`, one line printed per failure and one for the whole.
fn sharded_conformance_cases(
    world: &World,
) -> std::result::Result<(usize, usize), Box<dyn std::error::Error>> {
    let (rank, ranks) = (world.rank(), world.ranks());
    let uneven = ranks == 3;
    let device = CpuDevice::with_threads(1)?;
    let cases = sharded_cases(Size::Quick, ranks)?;
    let (mut passed, mut failed) = (0, 0);
    for c in &cases {
        let v = vocab(&c.case).ok_or("a sharded case without a vocabulary")?;
        let slice = slice_of(v, ranks, rank, uneven).ok_or("no slice for this rank")?;
        let group = Group::new(world.clone());
        let partition = Partition::agree(&group, slice)?;
        let shard = Shard {
            device: &device,
            group: &group,
            partition: &partition,
        };
        let failures = check_cases(&shard, std::slice::from_ref(c));
        if failures.is_empty() {
            passed += 1;
        }
        for (name, why) in &failures {
            failed += 1;
            println!("FAIL rank {rank}/{ranks}: {name}: {why}");
        }
    }
    println!(
        "ok   rank {rank}/{ranks}: {passed} of {} quick conformance cases of the sampling ops sharded ({}) equal the reference",
        cases.len(),
        if uneven { "uneven" } else { "even" }
    );
    Ok((passed, failed))
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let world = World(Rc::new(MpiGroup::init()?));
    let (rank, ranks) = (world.rank(), world.ranks());
    let (mut passed, mut failed) = sharded_conformance_cases(&world)?;
    for scenario in Scenario::all() {
        let device = || -> std::result::Result<Arc<dyn Device>, Box<dyn std::error::Error>> {
            Ok(Arc::new(CpuDevice::with_threads(1)?))
        };
        let want = run(&scenario, device()?, None)?;
        for uneven in [false, true] {
            let slice = slice_of(scenario.vocab, ranks, rank, uneven)
                .ok_or("the vocabulary is too small for this many ranks")?;
            let got = run(
                &scenario,
                device()?,
                Some((Group::new(world.clone()), slice)),
            );
            let verdict = got
                .map_err(|e| e.to_string())
                .and_then(|got| compare(&scenario, &got, &want).map(|()| got));
            let what = format!(
                "rank {rank}/{ranks}: {} slice {}..{}",
                scenario.name(),
                slice.first,
                slice.first + slice.len
            );
            match verdict {
                Ok(got) => {
                    passed += 1;
                    println!(
                        "ok   {what}: {} steps, {} collective calls, {} bytes",
                        got.steps, got.exchanged.calls, got.exchanged.bytes
                    );
                }
                Err(e) => {
                    failed += 1;
                    println!("FAIL {what}: {e}");
                }
            }
        }
    }
    println!("rank {rank}: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
