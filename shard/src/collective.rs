//! The collectives sharded rows need, exact and independent of the order of the ranks'
//! contributions (`docs/semantics.md` §4d): MAX over `u64` and `f32`, SUM over `u64` and `u128`,
//! and the all-gather of fixed-size records (`u64` words), with counters of what each rank
//! exchanges.

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Result, ShardError};

/// The default time a collective may take before it is a [`ShardError::Timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One collective engine: a group of `ranks()` processes (or threads) that all call the same
/// collectives in the same order, each with contributions of the same length.
///
/// Implemented on existing communication libraries only — MPI ([`MpiGroup`](crate::MpiGroup),
/// feature `mpi`), NCCL ([`NcclGroup`](crate::NcclGroup), feature `nccl`) — and, for unit tests,
/// [`ThreadGroup`](crate::ThreadGroup). Each call either completes on every rank or fails on
/// every rank within the engine's timeout.
pub trait Collective: Debug {
    /// The engine's name (`mpi`, `nccl`, `threads`).
    fn engine(&self) -> &'static str;
    /// This rank, in `0 .. ranks()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn ranks(&self) -> usize;
    /// Element-wise MAX over the ranks, in place.
    fn max_u64(&self, values: &mut [u64]) -> Result<()>;
    /// Element-wise MAX over the ranks, in place (values are never NaN).
    fn max_f32(&self, values: &mut [f32]) -> Result<()>;
    /// Element-wise wrapping SUM over the ranks, in place.
    fn sum_u64(&self, values: &mut [u64]) -> Result<()>;
    /// Element-wise wrapping SUM over the ranks, in place.
    fn sum_u128(&self, values: &mut [u128]) -> Result<()>;
    /// `gathered = send of rank 0, send of rank 1, …` (`gathered.len() == ranks() · send.len()`).
    fn all_gather(&self, send: &[u64], gathered: &mut [u64]) -> Result<()>;
}

/// What a rank exchanged: collective calls and bytes. A reduction counts its payload (the bytes
/// each rank contributes and gets back), an all-gather `N` times its contribution (what each
/// rank gets back). Deterministic: the same calls give the same counts on every engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExchangeStats {
    /// Collective calls.
    pub calls: u64,
    /// Bytes exchanged.
    pub bytes: u64,
}

impl ExchangeStats {
    /// What was exchanged after `before` was taken.
    pub fn since(&self, before: &ExchangeStats) -> ExchangeStats {
        ExchangeStats {
            calls: self.calls - before.calls,
            bytes: self.bytes - before.bytes,
        }
    }
}

/// A [`Collective`] with its counters: what sharded calls take. Every collective goes through
/// here, so the counts are the same whatever the engine.
#[derive(Debug)]
pub struct Group {
    engine: Box<dyn Collective>,
    stats: Mutex<ExchangeStats>,
}

impl Group {
    /// A group over `engine`.
    pub fn new(engine: impl Collective + 'static) -> Self {
        Group {
            engine: Box::new(engine),
            stats: Mutex::new(ExchangeStats::default()),
        }
    }

    /// The engine's name.
    pub fn engine(&self) -> &'static str {
        self.engine.engine()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.engine.rank()
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.engine.ranks()
    }

    /// What this rank has exchanged so far.
    pub fn stats(&self) -> ExchangeStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    fn count(&self, bytes: usize) {
        if let Ok(mut s) = self.stats.lock() {
            s.calls += 1;
            s.bytes += bytes as u64;
        }
    }

    /// Element-wise MAX over the ranks.
    pub fn max_u64(&self, values: &mut [u64]) -> Result<()> {
        self.count(8 * values.len());
        self.engine.max_u64(values)
    }

    /// Element-wise MAX over the ranks.
    pub fn max_f32(&self, values: &mut [f32]) -> Result<()> {
        self.count(4 * values.len());
        self.engine.max_f32(values)
    }

    /// Element-wise SUM over the ranks.
    pub fn sum_u64(&self, values: &mut [u64]) -> Result<()> {
        self.count(8 * values.len());
        self.engine.sum_u64(values)
    }

    /// Element-wise SUM over the ranks.
    pub fn sum_u128(&self, values: &mut [u128]) -> Result<()> {
        self.count(16 * values.len());
        self.engine.sum_u128(values)
    }

    /// Every rank's `send`, in rank order.
    pub fn all_gather(&self, send: &[u64]) -> Result<Vec<u64>> {
        let mut gathered = vec![0; send.len() * self.ranks()];
        self.count(8 * gathered.len());
        self.engine.all_gather(send, &mut gathered)?;
        Ok(gathered)
    }

    /// Checks that every rank passes the same `values` (a shape, a step number, a fingerprint of
    /// replicated parameters): an all-gather, then the same comparison on every rank, so that a
    /// mismatch is [`ShardError::Mismatch`] everywhere.
    pub fn agree(&self, what: &str, values: &[u64]) -> Result<()> {
        let gathered = self.all_gather(values)?;
        let n = values.len().max(1);
        let ranks: Vec<&[u64]> = gathered.chunks(n).collect();
        if ranks.windows(2).any(|w| w[0] != w[1]) {
            return Err(ShardError::Mismatch {
                what: format!("{what}: {ranks:?} (by rank)"),
            });
        }
        Ok(())
    }
}

/// SUM over `u128` for an engine without a 128-bit integer type: every rank's values gathered
/// (two `u64` words each) and added in rank order here, exact (wrapping).
#[cfg(any(feature = "mpi", feature = "nccl"))]
pub(crate) fn sum_u128_by_gathering(engine: &dyn Collective, values: &mut [u128]) -> Result<()> {
    let words: Vec<u64> = values
        .iter()
        .flat_map(|&v| [v as u64, (v >> 64) as u64])
        .collect();
    let mut gathered = vec![0; words.len() * engine.ranks()];
    engine.all_gather(&words, &mut gathered)?;
    values.fill(0);
    for rank in gathered.chunks(words.len().max(1)) {
        for (v, pair) in values.iter_mut().zip(rank.chunks(2)) {
            *v = v.wrapping_add(u128::from(pair[0]) | (u128::from(pair[1]) << 64));
        }
    }
    Ok(())
}

/// A stable 64-bit fingerprint of words (FNV-1a over their bytes), for [`Group::agree`].
pub fn fingerprint(words: impl IntoIterator<Item = u64>) -> u64 {
    words.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, w| {
        w.to_le_bytes().iter().fold(h, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    })
}
