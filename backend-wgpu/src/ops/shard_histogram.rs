//! `shard_histogram` (`docs/semantics.md` §5.15, `shaders/shard_histogram.wgsl`): not yet written for this backend.
//!
//! The device reports `Capabilities::sharded = false`, so the front answers
//! `Error::Unsupported` before a call reaches `run`; `run` answers the same if it is ever called.

use specula_backend_api::ops::shard_histogram::OpCall;
use specula_backend_api::{BackendKind, Error, Op, Result};

use crate::WgpuDevice;
use crate::kernels::ArgsStruct;

/// Reports the op unsupported on this backend.
pub(crate) fn run(_device: &WgpuDevice, _call: OpCall<'_, '_>) -> Result<()> {
    Err(Error::Unsupported {
        backend: BackendKind::Wgpu,
        op: Op::ShardHistogram,
        what: "sharded rows (its kernel is not written yet)".to_owned(),
    })
}

/// The argument structs of `shaders/shard_histogram.wgsl`: none until its kernels are written.
pub(crate) const ARGS: &[ArgsStruct] = &[];
