//! NCCL between GPUs: the collectives of [`Collective`] on a NCCL communicator through cudarc
//! (feature `nccl`; the NCCL library is loaded at run time, like the CUDA driver).
//!
//! The collectives take host slices, like every engine: each call copies the contribution to
//! the device, runs the NCCL collective on the group's stream and copies the result back. A
//! call that does not complete within the timeout (a rank that stopped) is
//! [`ShardError::Timeout`]; the communicator is aborted when the group drops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::safe::{Comm, Id, ReduceOp};

use crate::collective::{Collective, DEFAULT_TIMEOUT, sum_u128_by_gathering};
use crate::error::{Result, ShardError};

const ENGINE: &str = "nccl";

fn engine_error(what: impl std::fmt::Debug) -> ShardError {
    ShardError::Engine {
        engine: ENGINE,
        message: format!("{what:?}"),
    }
}

/// One rank of a NCCL communicator.
pub struct NcclGroup {
    comm: Comm,
    stream: Arc<CudaStream>,
    timeout: Duration,
}

impl std::fmt::Debug for NcclGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclGroup")
            .field("rank", &self.comm.rank())
            .field("ranks", &self.comm.world_size())
            .finish()
    }
}

impl NcclGroup {
    /// A new unique id for a communicator: rank 0 makes it and hands it to the other ranks (over
    /// MPI or any other channel) as its 128 bytes ([`NcclGroup::id_bytes`]).
    pub fn new_id() -> Result<Id> {
        libraries_present()?;
        Id::new().map_err(engine_error)
    }

    /// The bytes of an id, to send to the other ranks.
    pub fn id_bytes(id: &Id) -> Vec<u8> {
        id.internal().iter().map(|&c| c as u8).collect()
    }

    /// The id whose bytes are `bytes` (128 of them).
    pub fn id_from_bytes(bytes: &[u8]) -> Result<Id> {
        let mut internal = [0 as std::ffi::c_char; 128];
        if bytes.len() != internal.len() {
            return Err(ShardError::InvalidArgument {
                what: format!("a NCCL id has 128 bytes, not {}", bytes.len()),
            });
        }
        for (c, &b) in internal.iter_mut().zip(bytes) {
            *c = b as std::ffi::c_char;
        }
        Ok(Id::uninit(internal))
    }

    /// Rank `rank` of `ranks` of the communicator `id`, on GPU `ordinal`. Fails with
    /// [`ShardError::Engine`] when there is no CUDA driver or NCCL library.
    pub fn new(ordinal: usize, rank: usize, ranks: usize, id: Id) -> Result<Self> {
        libraries_present()?;
        let context = CudaContext::new(ordinal).map_err(engine_error)?;
        let stream = context.new_stream().map_err(engine_error)?;
        let comm = Comm::from_rank(stream.clone(), rank, ranks, id).map_err(engine_error)?;
        Ok(NcclGroup {
            comm,
            stream,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// A group of one rank on GPU `ordinal` (for checks on a single GPU).
    pub fn single(ordinal: usize) -> Result<Self> {
        Self::new(ordinal, 0, 1, Self::new_id()?)
    }

    /// Waits for the group's stream, at most the timeout.
    fn wait(&self, op: &'static str) -> Result<()> {
        let event = self.stream.record_event(None).map_err(engine_error)?;
        let deadline = Instant::now() + self.timeout;
        while !event.is_complete() {
            if Instant::now() >= deadline {
                return Err(ShardError::Timeout {
                    engine: ENGINE,
                    op,
                    after: self.timeout,
                });
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    fn all_reduce<T>(&self, op: &'static str, values: &mut [T], reduce: ReduceOp) -> Result<()>
    where
        T: cudarc::driver::DeviceRepr
            + cudarc::driver::ValidAsZeroBits
            + cudarc::nccl::safe::NcclType
            + Copy
            + Default,
    {
        if values.is_empty() {
            return Ok(());
        }
        let send = self.stream.clone_htod(values).map_err(engine_error)?;
        let mut recv = self
            .stream
            .alloc_zeros::<T>(values.len())
            .map_err(engine_error)?;
        self.comm
            .all_reduce(&send, &mut recv, &reduce)
            .map_err(engine_error)?;
        self.wait(op)?;
        self.stream
            .memcpy_dtoh(&recv, values)
            .map_err(engine_error)?;
        self.stream.synchronize().map_err(engine_error)
    }
}

impl Collective for NcclGroup {
    fn engine(&self) -> &'static str {
        ENGINE
    }

    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn ranks(&self) -> usize {
        self.comm.world_size()
    }

    fn max_u64(&self, values: &mut [u64]) -> Result<()> {
        self.all_reduce("max_u64", values, ReduceOp::Max)
    }

    fn max_f32(&self, values: &mut [f32]) -> Result<()> {
        self.all_reduce("max_f32", values, ReduceOp::Max)
    }

    fn sum_u64(&self, values: &mut [u64]) -> Result<()> {
        self.all_reduce("sum_u64", values, ReduceOp::Sum)
    }

    fn sum_u128(&self, values: &mut [u128]) -> Result<()> {
        // No 128-bit integer type in the library: gather and add here (exact).
        sum_u128_by_gathering(self, values)
    }

    fn all_gather(&self, send: &[u64], gathered: &mut [u64]) -> Result<()> {
        if send.is_empty() {
            return Ok(());
        }
        let send = self.stream.clone_htod(send).map_err(engine_error)?;
        let mut recv = self
            .stream
            .alloc_zeros::<u64>(gathered.len())
            .map_err(engine_error)?;
        self.comm
            .all_gather(&send, &mut recv)
            .map_err(engine_error)?;
        self.wait("all_gather")?;
        self.stream
            .memcpy_dtoh(&recv, gathered)
            .map_err(engine_error)?;
        self.stream.synchronize().map_err(engine_error)
    }
}

/// Whether the CUDA driver and NCCL libraries can be loaded: cudarc's loader panics at the first
/// call into a library that is absent, so every entry point of this engine asks first.
fn libraries_present() -> Result<()> {
    // SAFETY: only probes whether the driver library can be loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(engine_error("the CUDA driver library is not present"));
    }
    // SAFETY: only probes whether the NCCL library can be loaded.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err(engine_error("the NCCL library (libnccl) is not present"));
    }
    Ok(())
}
