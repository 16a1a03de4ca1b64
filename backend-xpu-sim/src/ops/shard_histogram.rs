//! `shard_histogram` (`docs/semantics.md` §5.15, `kernels/shard_histogram.cl`): not yet written for this backend.
//!
//! The device reports `Capabilities::sharded = false`, so the front answers
//! `Error::Unsupported` before a call reaches `run`; `run` answers the same if it is ever called.

use specula_backend_api::ops::shard_histogram::OpCall;
use specula_backend_api::{BackendKind, Error, Op, Result};

use super::ArgsStruct;
use crate::runtime::Runtime;

/// Reports the op unsupported on this backend.
pub(crate) fn run(_runtime: &Runtime, _call: OpCall<'_, '_>) -> Result<()> {
    Err(Error::Unsupported {
        backend: BackendKind::XpuSim,
        op: Op::ShardHistogram,
        what: "sharded rows (its kernel is not written yet)".to_owned(),
    })
}

/// The argument structs of `kernels/shard_histogram.cl`: none until its kernels are written.
pub(crate) const ARGS: &[ArgsStruct] = &[];

/// The programs `run` may launch: none (the op is not run on this backend yet).
pub(crate) fn programs(_plan: &specula_backend_api::WarmUp) -> Vec<super::Program> {
    Vec::new()
}
