//! The typed errors of sharded sampling.

use std::time::Duration;

/// What can go wrong on a rank. Every failure that one rank can see, every rank sees: a
/// mismatch is found by a collective whose result is the same on every rank, and a rank that
/// stops answering makes every other rank's next collective time out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// A device op failed.
    #[error(transparent)]
    Device(#[from] specula_backend_api::Error),
    /// The ranks disagree on something they must share (the vocabulary, the partition, the
    /// shape of a step, the kind of a collective).
    #[error("ranks disagree: {what}")]
    Mismatch {
        /// What differs, with the values of the ranks.
        what: String,
    },
    /// A collective did not complete in time: another rank died or stopped calling.
    #[error(
        "{engine}: collective `{op}` did not complete within {after:?} (a rank died or stopped)"
    )]
    Timeout {
        /// The engine.
        engine: &'static str,
        /// The collective.
        op: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// The group failed before (a timeout or an engine error): it cannot be used again.
    #[error("{engine}: the group failed earlier and cannot be used")]
    Poisoned {
        /// The engine.
        engine: &'static str,
    },
    /// The communication library failed.
    #[error("{engine}: {message}")]
    Engine {
        /// The engine.
        engine: &'static str,
        /// What it said.
        message: String,
    },
    /// An argument of a sharded call is wrong (host-side, before anything is exchanged).
    #[error("{what}")]
    InvalidArgument {
        /// What is wrong.
        what: String,
    },
}

/// The result of sharded calls.
pub type Result<T, E = ShardError> = std::result::Result<T, E>;
