//! An in-process group of threads: the collectives of [`Collective`] between threads of one
//! process, for unit tests only (runners use MPI or NCCL).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::collective::{Collective, DEFAULT_TIMEOUT};
use crate::error::{Result, ShardError};

const ENGINE: &str = "threads";

/// What one call of a collective is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    MaxU64,
    MaxF32,
    SumU64,
    SumU128,
    Gather,
}

#[derive(Debug, Default)]
struct State {
    /// The generation of the call being gathered.
    generation: u64,
    /// Contributions of the current call, by rank.
    slots: Vec<Option<(Kind, Vec<u64>)>>,
    /// The result of the last completed call, and its generation.
    result: Option<(u64, std::result::Result<Vec<u64>, String>)>,
    /// A rank gave up (timed out): every later call fails.
    poisoned: bool,
}

#[derive(Debug)]
struct Shared {
    ranks: usize,
    timeout: Duration,
    state: Mutex<State>,
    arrived: Condvar,
}

/// One rank of an in-process thread group. [`ThreadGroup::new`] makes all of them; move each to
/// its own thread. A rank that stops calling makes the others time out
/// ([`ShardError::Timeout`]), and the group is poisoned from then on.
#[derive(Debug)]
pub struct ThreadGroup {
    rank: usize,
    shared: Arc<Shared>,
}

impl ThreadGroup {
    /// The `ranks` members of a new group with the default timeout.
    pub fn new(ranks: usize) -> Vec<ThreadGroup> {
        Self::with_timeout(ranks, DEFAULT_TIMEOUT)
    }

    /// The `ranks` members of a new group whose collectives time out after `timeout`.
    pub fn with_timeout(ranks: usize, timeout: Duration) -> Vec<ThreadGroup> {
        let shared = Arc::new(Shared {
            ranks,
            timeout,
            state: Mutex::new(State {
                slots: vec![None; ranks],
                ..State::default()
            }),
            arrived: Condvar::new(),
        });
        (0..ranks)
            .map(|rank| ThreadGroup {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }

    /// Contributes `words` to a call of `kind` and returns the combined result.
    fn call(&self, kind: Kind, op: &'static str, words: Vec<u64>) -> Result<Vec<u64>> {
        let shared = &self.shared;
        let poisoned = || ShardError::Poisoned { engine: ENGINE };
        let mut state = shared.state.lock().map_err(|_| poisoned())?;
        if state.poisoned {
            return Err(poisoned());
        }
        let generation = state.generation;
        state.slots[self.rank] = Some((kind, words));
        if state.slots.iter().all(Option::is_some) {
            let contributions: Vec<(Kind, Vec<u64>)> =
                state.slots.iter_mut().filter_map(Option::take).collect();
            state.result = Some((generation, combine(&contributions)));
            state.generation += 1;
            shared.arrived.notify_all();
        }
        let deadline = Instant::now() + shared.timeout;
        loop {
            if let Some((g, result)) = &state.result
                && *g == generation
            {
                return result.clone().map_err(|what| ShardError::Mismatch { what });
            }
            let now = Instant::now();
            // Another waiting rank timed out (and poisoned the group): this call fails alike.
            if now >= deadline || state.poisoned {
                state.poisoned = true;
                shared.arrived.notify_all();
                return Err(ShardError::Timeout {
                    engine: ENGINE,
                    op,
                    after: shared.timeout,
                });
            }
            state = shared
                .arrived
                .wait_timeout(state, deadline - now)
                .map_err(|_| poisoned())?
                .0;
        }
    }
}

/// The result of one call from every rank's contribution (an error when the ranks called
/// different collectives or passed different lengths).
fn combine(contributions: &[(Kind, Vec<u64>)]) -> std::result::Result<Vec<u64>, String> {
    let (kind, first) = &contributions[0];
    if contributions
        .iter()
        .any(|(k, w)| k != kind || w.len() != first.len())
    {
        let seen: Vec<(Kind, usize)> = contributions.iter().map(|(k, w)| (*k, w.len())).collect();
        return Err(format!("collective kinds and lengths by rank: {seen:?}"));
    }
    let words = contributions.iter().map(|(_, w)| w.as_slice());
    Ok(match kind {
        Kind::Gather => words.flatten().copied().collect(),
        Kind::MaxU64 => fold(words, |a, b| a.max(b)),
        Kind::SumU64 => fold(words, u64::wrapping_add),
        Kind::MaxF32 => fold(words, |a, b| {
            let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
            u64::from(x.max(y).to_bits())
        }),
        Kind::SumU128 => {
            let mut out = first.clone();
            for (_, w) in &contributions[1..] {
                for (pair, add) in out.chunks_mut(2).zip(w.chunks(2)) {
                    let sum = u128_of(pair).wrapping_add(u128_of(add));
                    pair[0] = sum as u64;
                    pair[1] = (sum >> 64) as u64;
                }
            }
            out
        }
    })
}

fn u128_of(pair: &[u64]) -> u128 {
    u128::from(pair[0]) | (u128::from(pair[1]) << 64)
}

fn fold<'a>(mut words: impl Iterator<Item = &'a [u64]>, f: impl Fn(u64, u64) -> u64) -> Vec<u64> {
    let mut out = words.next().map(<[u64]>::to_vec).unwrap_or_default();
    for w in words {
        for (o, &x) in out.iter_mut().zip(w) {
            *o = f(*o, x);
        }
    }
    out
}

impl Collective for ThreadGroup {
    fn engine(&self) -> &'static str {
        ENGINE
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.shared.ranks
    }

    fn max_u64(&self, values: &mut [u64]) -> Result<()> {
        let out = self.call(Kind::MaxU64, "max_u64", values.to_vec())?;
        values.copy_from_slice(&out);
        Ok(())
    }

    fn max_f32(&self, values: &mut [f32]) -> Result<()> {
        let words = values.iter().map(|x| u64::from(x.to_bits())).collect();
        let out = self.call(Kind::MaxF32, "max_f32", words)?;
        for (v, w) in values.iter_mut().zip(out) {
            *v = f32::from_bits(w as u32);
        }
        Ok(())
    }

    fn sum_u64(&self, values: &mut [u64]) -> Result<()> {
        let out = self.call(Kind::SumU64, "sum_u64", values.to_vec())?;
        values.copy_from_slice(&out);
        Ok(())
    }

    fn sum_u128(&self, values: &mut [u128]) -> Result<()> {
        let words = values
            .iter()
            .flat_map(|&v| [v as u64, (v >> 64) as u64])
            .collect();
        let out = self.call(Kind::SumU128, "sum_u128", words)?;
        for (v, pair) in values.iter_mut().zip(out.chunks(2)) {
            *v = u128_of(pair);
        }
        Ok(())
    }

    fn all_gather(&self, send: &[u64], gathered: &mut [u64]) -> Result<()> {
        let out = self.call(Kind::Gather, "all_gather", send.to_vec())?;
        if out.len() != gathered.len() {
            return Err(ShardError::Mismatch {
                what: format!(
                    "all_gather: {} words gathered, {} expected",
                    out.len(),
                    gathered.len()
                ),
            });
        }
        gathered.copy_from_slice(&out);
        Ok(())
    }
}
