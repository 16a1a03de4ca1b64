//! Batched transfers: several buffers downloaded with one wait ([`PendingDownload`]), several
//! windows written with one call ([`WriteAt`]), the count of each device's blocking waits and
//! writes ([`MemoryStats`]), and of the driver calls a backend makes ([`DriverStats`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Buffer, Element, Error, Op, Result};

/// How many memory operations a device has been asked for since it was opened
/// ([`Device::memory_stats`](crate::Device::memory_stats)).
///
/// A *blocking wait* is a call that returns only once the device has caught up: each
/// [`download_bytes`](crate::Device::download_bytes) (and typed `download`), each
/// [`synchronize`](crate::Device::synchronize) and each [`PendingDownload::wait`], however many
/// buffers it brings back. A *write* is each [`write_bytes`](crate::Device::write_bytes) (typed
/// `write`) and each [`write_many`](crate::Device::write_many), however many windows it writes;
/// an *upload* each [`upload_bytes`](crate::Device::upload_bytes). Calls refused by validation
/// are not counted.
///
/// These three are counted by the validating front, the same way on every backend. What the
/// calls cost the backend's driver is [`MemoryStats::driver`], counted by the backend itself
/// where it has a driver to count ([`DriverStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Calls that waited for the device.
    pub blocking_waits: u64,
    /// Write calls (one per `write_bytes` or `write_many`).
    pub writes: u64,
    /// Upload calls (new buffers from host bytes).
    pub uploads: u64,
    /// The driver calls the backend made, or `None` where it does not count them: the CPU
    /// backend and the reference device have no driver (an op is host code), and the wgpu and
    /// xpu-sim backends do not count theirs. The CUDA backend counts every driver call that
    /// allocates, waits, copies or launches ([`DriverStats`]).
    pub driver: Option<DriverStats>,
}

impl MemoryStats {
    /// What happened between `earlier` and `self` (both of one device).
    pub fn since(&self, earlier: &MemoryStats) -> MemoryStats {
        MemoryStats {
            blocking_waits: self.blocking_waits.saturating_sub(earlier.blocking_waits),
            writes: self.writes.saturating_sub(earlier.writes),
            uploads: self.uploads.saturating_sub(earlier.uploads),
            driver: self
                .driver
                .zip(earlier.driver)
                .map(|(now, then)| now.since(&then)),
        }
    }
}

/// The driver calls of a device backend, counted where each call is made
/// ([`MemoryStats::driver`]; [`MemoryStats::since`] gives those of one op or one step).
///
/// A decoding loop that is at kernel speed makes, per op after its warm-up, no allocation and no
/// synchronisation: only its launches, and the copies of what it uploads or downloads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Memory allocations: device memory (buffers, the growth of a scratch arena) and
    /// page-locked host memory.
    pub allocations: u64,
    /// Host waits on the device: stream and event synchronisations.
    pub synchronizations: u64,
    /// Copies between host and device memory (each enqueued copy).
    pub copies: u64,
    /// Kernel launches (a captured step's replay counts one).
    pub launches: u64,
}

impl DriverStats {
    /// What happened between `earlier` and `self` (both of one device).
    pub fn since(&self, earlier: &DriverStats) -> DriverStats {
        DriverStats {
            allocations: self.allocations.saturating_sub(earlier.allocations),
            synchronizations: self
                .synchronizations
                .saturating_sub(earlier.synchronizations),
            copies: self.copies.saturating_sub(earlier.copies),
            launches: self.launches.saturating_sub(earlier.launches),
        }
    }
}

/// The live counters behind [`DriverStats`]: a backend that counts its driver calls opens its
/// device with [`DeviceDesc::counting_driver_calls`](crate::backend::DeviceDesc::counting_driver_calls)
/// and records each call, at the one place it makes it, through
/// [`DeviceDesc::driver_counters`](crate::backend::DeviceDesc::driver_counters).
///
/// ```
/// use specula_backend_api::transfer::DriverCounters;
/// let counters = DriverCounters::default();
/// let before = counters.snapshot();
/// counters.launched();
/// counters.launched();
/// counters.synchronized();
/// let step = counters.snapshot().since(&before);
/// assert_eq!((step.launches, step.synchronizations, step.allocations), (2, 1, 0));
/// ```
#[derive(Debug, Default)]
pub struct DriverCounters {
    allocations: AtomicU64,
    synchronizations: AtomicU64,
    copies: AtomicU64,
    launches: AtomicU64,
}

impl DriverCounters {
    /// One allocation.
    pub fn allocated(&self) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }

    /// One synchronisation.
    pub fn synchronized(&self) {
        self.synchronizations.fetch_add(1, Ordering::Relaxed);
    }

    /// One host↔device copy.
    pub fn copied(&self) {
        self.copies.fetch_add(1, Ordering::Relaxed);
    }

    /// One launch.
    pub fn launched(&self) {
        self.launches.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> DriverStats {
        DriverStats {
            allocations: self.allocations.load(Ordering::Relaxed),
            synchronizations: self.synchronizations.load(Ordering::Relaxed),
            copies: self.copies.load(Ordering::Relaxed),
            launches: self.launches.load(Ordering::Relaxed),
        }
    }
}

/// The live counters behind [`MemoryStats`], shared by a device and its pending downloads.
#[derive(Debug, Default)]
pub(crate) struct MemoryCounters {
    blocking_waits: AtomicU64,
    writes: AtomicU64,
    uploads: AtomicU64,
}

impl MemoryCounters {
    pub(crate) fn waited(&self) {
        self.blocking_waits.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn uploaded(&self) {
        self.uploads.fetch_add(1, Ordering::Relaxed);
    }

    /// The front's counts, with the backend's driver counts when it keeps them.
    pub(crate) fn snapshot(&self, driver: Option<&DriverCounters>) -> MemoryStats {
        MemoryStats {
            blocking_waits: self.blocking_waits.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            uploads: self.uploads.load(Ordering::Relaxed),
            driver: driver.map(DriverCounters::snapshot),
        }
    }
}

/// A backend's download in flight: what [`PendingDownload::wait`] finally calls. It owns
/// everything the transfer writes into (staging memory, host vectors), so it lives on its own,
/// without borrowing the device or the buffers; dropping it unwaited must leave no transfer
/// writing into freed memory.
pub trait DownloadWait: Send {
    /// Blocks until every buffer has arrived and returns their bytes, in the order they were
    /// asked for.
    fn wait(self: Box<Self>) -> Result<Vec<Vec<u8>>>;
}

/// Several buffers on their way to the host, started by
/// [`Device::start_download`](crate::Device::start_download): the copies are enqueued behind
/// every op enqueued before, and [`wait`](PendingDownload::wait) blocks once for all of them.
/// Between the two the host is free (a runner runs its next forward pass).
///
/// A backend returns [`PendingDownload::ready`] when it copied at once (the CPU backend: the
/// default of [`Backend::run_start_download`](crate::Backend::run_start_download)) or
/// [`PendingDownload::waiting`] with its own asynchronous transfer.
pub struct PendingDownload {
    inner: Inner,
    /// The byte size of each buffer's window, as the front validated them (`None`: a backend's
    /// own transfer, not through the front, is neither checked nor counted).
    sizes: Option<Vec<usize>>,
    counters: Option<Arc<MemoryCounters>>,
}

enum Inner {
    Ready(Vec<Vec<u8>>),
    Waiting(Box<dyn DownloadWait>),
}

impl std::fmt::Debug for PendingDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.inner {
            Inner::Ready(_) => "ready",
            Inner::Waiting(_) => "in flight",
        };
        f.debug_struct("PendingDownload")
            .field("state", &state)
            .field("sizes", &self.sizes)
            .finish()
    }
}

impl PendingDownload {
    /// A download already copied (one byte vector per buffer, in order).
    pub fn ready(bytes: Vec<Vec<u8>>) -> Self {
        PendingDownload {
            inner: Inner::Ready(bytes),
            sizes: None,
            counters: None,
        }
    }

    /// A download in flight, delivered by `wait`.
    pub fn waiting(wait: Box<dyn DownloadWait>) -> Self {
        PendingDownload {
            inner: Inner::Waiting(wait),
            sizes: None,
            counters: None,
        }
    }

    /// Records what the front validated: the window size of each buffer and the device's counters.
    pub(crate) fn validated(mut self, sizes: Vec<usize>, counters: Arc<MemoryCounters>) -> Self {
        self.sizes = Some(sizes);
        self.counters = Some(counters);
        self
    }

    /// Number of buffers in the transfer (as validated by the front; 0 for a backend's own).
    pub fn len(&self) -> usize {
        self.sizes.as_ref().map_or(0, Vec::len)
    }

    /// Whether the transfer holds no buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Blocks once until every buffer has arrived and returns their bytes, one vector per buffer
    /// in the order given to `start_download`. One blocking wait of the device
    /// ([`MemoryStats::blocking_waits`]; a backend waiting on its own transfer, not started by
    /// the front, is not counted). A transfer that failed on the device is
    /// [`Error::Execution`]; bytes of the wrong size from a backend are [`Error::ShapeMismatch`].
    pub fn wait(self) -> Result<Vec<Vec<u8>>> {
        if let Some(counters) = &self.counters {
            counters.waited();
        }
        let bytes = match self.inner {
            Inner::Ready(bytes) => bytes,
            Inner::Waiting(wait) => wait.wait()?,
        };
        if let Some(sizes) = &self.sizes {
            check_sizes(sizes, &bytes)?;
        }
        Ok(bytes)
    }
}

/// The bytes are one vector per buffer, each of its window's size.
fn check_sizes(sizes: &[usize], bytes: &[Vec<u8>]) -> Result<()> {
    let mismatch = |expected, actual| Error::ShapeMismatch {
        op: Op::Memory,
        arg: "downloaded bytes",
        expected,
        actual,
    };
    if bytes.len() != sizes.len() {
        return Err(mismatch(sizes.len(), bytes.len()));
    }
    match sizes.iter().zip(bytes).find(|(s, b)| **s != b.len()) {
        Some((&size, b)) => Err(mismatch(size, b.len())),
        None => Ok(()),
    }
}

/// Downloaded bytes as elements of `T` (copied: the bytes need not be aligned).
pub fn elements<T: Element>(bytes: &[u8]) -> Vec<T> {
    bytemuck::pod_collect_to_vec(bytes)
}

/// One window of a batched write ([`Device::write_many`](crate::Device::write_many)): `bytes` at
/// element `offset` of `dst`'s window.
#[derive(Debug)]
pub struct WriteAt<'c, 'b> {
    pub(crate) dst: &'c mut Buffer,
    pub(crate) offset: usize,
    pub(crate) bytes: &'b [u8],
}

impl<'c, 'b> WriteAt<'c, 'b> {
    /// `bytes` (a whole number of `dst`'s elements) at element `offset` of `dst`'s window.
    pub fn bytes(dst: &'c mut Buffer, offset: usize, bytes: &'b [u8]) -> Self {
        WriteAt { dst, offset, bytes }
    }

    /// A typed slice at element `offset` of `dst`'s window (its dtype is checked by `write_many`).
    pub fn new<T: Element>(dst: &'c mut Buffer, offset: usize, data: &'b [T]) -> Self {
        WriteAt::bytes(dst, offset, bytemuck::cast_slice(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_per_buffer() {
        assert!(check_sizes(&[4, 1], &[vec![0; 4], vec![7]]).is_ok());
        for wrong in [vec![vec![0; 4]], vec![vec![0; 4], vec![]]] {
            assert!(matches!(
                check_sizes(&[4, 1], &wrong),
                Err(Error::ShapeMismatch { .. })
            ));
        }
    }

    #[test]
    fn since_subtracts_per_field() {
        let driver = |launches| DriverStats {
            allocations: 2,
            synchronizations: 5,
            copies: 9,
            launches,
        };
        let a = MemoryStats {
            blocking_waits: 3,
            writes: 17,
            uploads: 1,
            driver: Some(driver(40)),
        };
        let b = MemoryStats {
            blocking_waits: 4,
            writes: 18,
            uploads: 1,
            driver: Some(driver(43)),
        };
        assert_eq!(
            b.since(&a),
            MemoryStats {
                blocking_waits: 1,
                writes: 1,
                uploads: 0,
                driver: Some(DriverStats {
                    launches: 3,
                    ..DriverStats::default()
                }),
            }
        );
        let uncounted = MemoryStats { driver: None, ..b };
        assert_eq!(uncounted.since(&a).driver, None);
    }

    #[test]
    fn driver_counters_count_each_kind_apart() {
        let counters = DriverCounters::default();
        counters.allocated();
        counters.copied();
        counters.copied();
        counters.synchronized();
        counters.launched();
        assert_eq!(
            counters.snapshot(),
            DriverStats {
                allocations: 1,
                synchronizations: 1,
                copies: 2,
                launches: 1,
            }
        );
    }
}
