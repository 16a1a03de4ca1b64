//! `shard_key` (`docs/semantics.md` §5.13, `kernels/shard_key.cu`): not yet written for this backend.
//!
//! The device reports `Capabilities::sharded = false`, so the front answers
//! `Error::Unsupported` before a call reaches `run`; `run` answers the same if it is ever called.

use specula_backend_api::ops::shard_key::OpCall;
use specula_backend_api::{BackendKind, Error, Op, Result};

use crate::device::CudaDevice;

/// Reports the op unsupported on this backend.
pub(crate) fn run(_device: &CudaDevice, _call: OpCall<'_, '_>) -> Result<()> {
    Err(Error::Unsupported {
        backend: BackendKind::Cuda,
        op: Op::ShardKey,
        what: "sharded rows (its kernel is not written yet)".to_owned(),
    })
}
