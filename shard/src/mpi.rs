//! MPI between CPU processes: the collectives of [`Collective`] on Open MPI, through the `mpi`
//! crate (feature `mpi`). Run the ranks with `mpirun -n N`.
//!
//! Each collective is started non-blocking (`MPI_Iallreduce`, `MPI_Iallgather`) and tested until
//! it completes or the group's timeout passes, so a rank that stops calling is a
//! [`ShardError::Timeout`] on the others rather than a hang; the group is poisoned from then on
//! (the buffers of the abandoned call are leaked, since MPI may still write them). A rank that
//! dies is reported by Open MPI itself, which ends the job.

use std::ffi::c_void;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::Communicator;

use crate::collective::{Collective, DEFAULT_TIMEOUT, sum_u128_by_gathering};
use crate::error::{Result, ShardError};

const ENGINE: &str = "mpi";

/// This process's rank of the MPI world (`MPI_COMM_WORLD`).
pub struct MpiGroup {
    // Dropped last: finalizes MPI.
    universe: mpi::environment::Universe,
    world: mpi::topology::SimpleCommunicator,
    timeout: Duration,
    poisoned: std::cell::Cell<bool>,
}

impl std::fmt::Debug for MpiGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiGroup")
            .field("rank", &self.world.rank())
            .field("ranks", &self.world.size())
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn engine_error(message: impl Into<String>) -> ShardError {
    ShardError::Engine {
        engine: ENGINE,
        message: message.into(),
    }
}

impl MpiGroup {
    /// Initializes MPI and joins the world with the default timeout.
    pub fn init() -> Result<Self> {
        Self::init_with_timeout(DEFAULT_TIMEOUT)
    }

    /// Initializes MPI and joins the world; collectives time out after `timeout`.
    pub fn init_with_timeout(timeout: Duration) -> Result<Self> {
        let universe =
            mpi::initialize().ok_or_else(|| engine_error("MPI is already initialized"))?;
        let world = universe.world();
        Ok(MpiGroup {
            universe,
            world,
            timeout,
            poisoned: std::cell::Cell::new(false),
        })
    }

    /// Waits for `request` until it completes or the timeout passes; `keep` holds the buffers
    /// the call reads and writes, leaked when it is abandoned.
    fn wait<T>(&self, op: &'static str, mut request: ffi::MPI_Request, keep: T) -> Result<T> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let mut flag: c_int = 0;
            // SAFETY: `request` is the handle of a started collective whose buffers are in
            // `keep`, alive until the call completes (or leaked below); the status is ignored.
            let code = unsafe { ffi::MPI_Test(&mut request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if code != 0 {
                self.poisoned.set(true);
                std::mem::forget(keep);
                return Err(engine_error(format!("MPI_Test failed ({code}) in {op}")));
            }
            if flag != 0 {
                return Ok(keep);
            }
            if Instant::now() >= deadline {
                self.poisoned.set(true);
                std::mem::forget(keep);
                return Err(ShardError::Timeout {
                    engine: ENGINE,
                    op,
                    after: self.timeout,
                });
            }
            std::thread::yield_now();
        }
    }

    fn check(&self) -> Result<()> {
        match self.poisoned.get() {
            true => Err(ShardError::Poisoned { engine: ENGINE }),
            false => Ok(()),
        }
    }

    /// `MPI_Iallreduce` of `values` with `op`, in place, waited for.
    fn all_reduce<T: Equivalence + Copy>(
        &self,
        name: &'static str,
        values: &mut [T],
        op: SystemOperation,
    ) -> Result<()> {
        self.check()?;
        let count = c_int::try_from(values.len()).map_err(|_| engine_error("too many values"))?;
        let send: Vec<T> = values.to_vec();
        let mut recv: Vec<T> = values.to_vec();
        let mut request = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: `send` and `recv` hold `count` elements of `T`, whose MPI datatype is
        // `T::equivalent_datatype()`; both stay alive (moved into `wait`) until the call
        // completes or are leaked when it is abandoned.
        let code = unsafe {
            ffi::MPI_Iallreduce(
                send.as_ptr().cast::<c_void>(),
                recv.as_mut_ptr().cast::<c_void>(),
                count,
                T::equivalent_datatype().as_raw(),
                op.as_raw(),
                self.world.as_raw(),
                request.as_mut_ptr(),
            )
        };
        if code != 0 {
            return Err(engine_error(format!(
                "MPI_Iallreduce failed ({code}) in {name}"
            )));
        }
        // SAFETY: MPI_Iallreduce succeeded, so it wrote the request handle.
        let request = unsafe { request.assume_init() };
        let (_send, recv) = self.wait(name, request, (send, recv))?;
        values.copy_from_slice(&recv);
        Ok(())
    }
}

impl Collective for MpiGroup {
    fn engine(&self) -> &'static str {
        ENGINE
    }

    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn ranks(&self) -> usize {
        self.world.size() as usize
    }

    fn max_u64(&self, values: &mut [u64]) -> Result<()> {
        self.all_reduce("max_u64", values, SystemOperation::max())
    }

    fn max_f32(&self, values: &mut [f32]) -> Result<()> {
        self.all_reduce("max_f32", values, SystemOperation::max())
    }

    fn sum_u64(&self, values: &mut [u64]) -> Result<()> {
        self.all_reduce("sum_u64", values, SystemOperation::sum())
    }

    fn sum_u128(&self, values: &mut [u128]) -> Result<()> {
        // No 128-bit integer type in the library: gather and add here (exact).
        sum_u128_by_gathering(self, values)
    }

    fn all_gather(&self, send: &[u64], gathered: &mut [u64]) -> Result<()> {
        self.check()?;
        if gathered.len() != send.len() * self.ranks() {
            return Err(ShardError::InvalidArgument {
                what: format!("all_gather of {} words into {}", send.len(), gathered.len()),
            });
        }
        let count = c_int::try_from(send.len()).map_err(|_| engine_error("too many values"))?;
        let send: Vec<u64> = send.to_vec();
        let mut recv: Vec<u64> = vec![0; gathered.len()];
        let datatype = u64::equivalent_datatype().as_raw();
        let mut request = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
        // SAFETY: `send` holds `count` u64 and `recv` `ranks · count`; both stay alive until the
        // call completes (moved into `wait`) or are leaked when it is abandoned.
        let code = unsafe {
            ffi::MPI_Iallgather(
                send.as_ptr().cast::<c_void>(),
                count,
                datatype,
                recv.as_mut_ptr().cast::<c_void>(),
                count,
                datatype,
                self.world.as_raw(),
                request.as_mut_ptr(),
            )
        };
        if code != 0 {
            return Err(engine_error(format!("MPI_Iallgather failed ({code})")));
        }
        // SAFETY: MPI_Iallgather succeeded, so it wrote the request handle.
        let request = unsafe { request.assume_init() };
        let (_send, recv) = self.wait("all_gather", request, (send, recv))?;
        gathered.copy_from_slice(&recv);
        Ok(())
    }
}

impl Drop for MpiGroup {
    fn drop(&mut self) {
        // A poisoned group has a collective in flight that will never complete: finalizing
        // would wait for it, so abort the job instead of hanging.
        if self.poisoned.get() {
            self.world.abort(3);
        }
        let _ = &self.universe;
    }
}
