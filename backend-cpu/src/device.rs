//! `CpuDevice`: the `Device` implementation.

use specula_backend_api::backend::{AnyCall, Backend, DeviceDesc, Write};
use specula_backend_api::{
    BackendKind, Buffer, Capabilities, Device, DeviceInfo, Error, Op, Result,
};

use crate::affinity;
use crate::ops;
use crate::ops::process_logits::counted::CountedTables;
use specula_backend_api::host;

/// The bytes of `f32` rows the CPU asks callers to process and sample at a time
/// ([`Capabilities::row_block_bytes`]): a block of processed rows stays in the last-level cache
/// between `process_logits` and the sampling op, instead of going to memory and back.
pub(crate) const ROW_BLOCK_BYTES: usize = 8 << 20;

/// The row block of a new device: `SPECULA_CPU_ROW_BLOCK_BYTES` when set (0: no blocks, every
/// row at once), else [`ROW_BLOCK_BYTES`]. A value that is not a number is logged and ignored.
fn row_block_bytes() -> Option<usize> {
    let Ok(text) = std::env::var("SPECULA_CPU_ROW_BLOCK_BYTES") else {
        return Some(ROW_BLOCK_BYTES);
    };
    match text.trim().parse::<usize>() {
        Ok(0) => None,
        Ok(bytes) => Some(bytes),
        Err(_) => {
            tracing::warn!(
                value = %text,
                "SPECULA_CPU_ROW_BLOCK_BYTES is not a byte count; using {ROW_BLOCK_BYTES}"
            );
            Some(ROW_BLOCK_BYTES)
        }
    }
}

/// The production CPU device. Ops run on its own `rayon` pool.
#[derive(Debug)]
pub struct CpuDevice {
    desc: DeviceDesc,
    pool: rayon::ThreadPool,
    /// The counted bits of the count tables the processing ops have read, kept between calls.
    counted: CountedTables,
    /// The CPUs the pool's workers are pinned to, held while the device lives (`None`: unpinned).
    _pinned: Option<affinity::Claim>,
}

impl CpuDevice {
    /// Opens the CPU device with one thread per available core, each worker pinned to its own
    /// CPU (`SPECULA_CPU_PIN_THREADS=0` leaves them unpinned; see [`CpuDevice::with_threads`]).
    pub fn new() -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_threads(threads)
    }

    /// Opens the CPU device with `threads` worker threads (at least 1). When the process may use
    /// at least `threads` CPUs that no other live device has pinned to (and there are two workers
    /// or more), worker *i* pins itself to the *i*-th of them: woken after a pause, unpinned
    /// workers can land on one CPU together and take turns there. Otherwise the workers are left
    /// unpinned. `SPECULA_CPU_PIN_THREADS=0` turns pinning off; results never depend on it.
    pub fn with_threads(threads: usize) -> Result<Self> {
        let threads = threads.max(1);
        let mut builder = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("specula-cpu-{i}"));
        let pinned = affinity::placement(threads);
        if let Some(claim) = &pinned {
            let cpus = claim.cpus().to_vec();
            builder = builder.start_handler(move |i| {
                if let Some(&cpu) = cpus.get(i) {
                    affinity::pin_current_thread(cpu);
                }
            });
        }
        let pool = builder.build().map_err(|e| Error::Unavailable {
            backend: BackendKind::Cpu,
            reason: format!("cannot start the thread pool: {e}"),
        })?;
        let info = DeviceInfo {
            kind: BackendKind::Cpu,
            ordinal: 0,
            name: format!("cpu ({threads} threads)"),
            driver: "rayon".to_owned(),
        };
        let capabilities = Capabilities {
            fused_processing: true,
            row_block_bytes: row_block_bytes(),
            ..Capabilities::every_op()
        };
        Ok(CpuDevice {
            desc: DeviceDesc::new(info, capabilities),
            pool,
            counted: CountedTables::default(),
            _pinned: pinned,
        })
    }

    /// The same device, asking callers to process and sample `bytes` of `f32` rows at a time
    /// ([`Capabilities::row_block_bytes`]; `None`: every row at once). The default is 8 MiB, or
    /// `SPECULA_CPU_ROW_BLOCK_BYTES` (0: no blocks); the results never depend on it (each row is
    /// processed and sampled on its own), only the traffic to memory does.
    pub fn with_row_block_bytes(mut self, bytes: Option<usize>) -> Self {
        self.desc.capabilities.row_block_bytes = bytes;
        self
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// One streaming read of a buffer's window on this device's threads: a wrapping sum of its
    /// 8-byte words (and trailing bytes). Benchmarks compare every op with this memory floor,
    /// measured on the same buffer, threads and cache state.
    pub fn read_floor(&self, buffer: &Buffer) -> Result<u64> {
        use rayon::prelude::*;
        self.check_owner("buffer", buffer)?;
        let bytes = host::bytes(buffer)?;
        Ok(self.install(|| {
            bytes
                .par_chunks(1 << 16)
                .map(|chunk| {
                    let (words, tail) = chunk.split_at(chunk.len() / 8 * 8);
                    let words: &[u64] = bytemuck::cast_slice(words);
                    let sum = words.iter().fold(0u64, |a, &w| a.wrapping_add(w));
                    tail.iter().fold(sum, |a, &b| a.wrapping_add(u64::from(b)))
                })
                .reduce(|| 0, u64::wrapping_add)
        }))
    }

    /// A parallel copy between two windows of the same size on this device's threads: the memcpy
    /// reference of benchmarks.
    pub fn copy_floor(&self, src: &Buffer, dst: &mut Buffer) -> Result<()> {
        use rayon::prelude::*;
        self.check_owner("src", src)?;
        self.check_owner("dst", dst)?;
        if dst.dtype() != src.dtype() || dst.len() != src.len() {
            return Err(Error::ShapeMismatch {
                op: Op::Memory,
                arg: "dst",
                expected: src.size_bytes(),
                actual: dst.size_bytes(),
            });
        }
        let from = host::bytes(src)?;
        let to = host::bytes_mut(dst)?;
        self.install(|| {
            to.par_chunks_mut(1 << 16)
                .zip(from.par_chunks(1 << 16))
                .for_each(|(t, f)| t.copy_from_slice(f))
        });
        Ok(())
    }

    /// The counted bits of the count tables this device has seen.
    pub(crate) fn counted_tables(&self) -> &CountedTables {
        &self.counted
    }

    /// Runs `f` on this device's thread pool.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Runs `f` on the calling thread, its `parallel::join`s helped by this device's workers (a
    /// batch-1 call that makes no other parallel section; see `parallel`).
    pub(crate) fn on_caller<R>(&self, f: impl FnOnce() -> R) -> R {
        crate::parallel::on_caller(&self.pool, f)
    }

    /// Whether the calling thread is one of this device's workers (an op called from inside
    /// another op's work).
    pub(crate) fn is_worker(&self) -> bool {
        self.pool.current_thread_index().is_some()
    }

    /// `DeviceMismatch` unless `buffer` belongs to this device (for the benchmark helpers, which
    /// are not ops and so do not pass through the front).
    fn check_owner(&self, arg: &'static str, buffer: &Buffer) -> Result<()> {
        if buffer.device() != self.id() {
            return Err(Error::DeviceMismatch {
                op: Op::Memory,
                arg,
                expected: self.id().0,
                actual: buffer.device().0,
            });
        }
        Ok(())
    }
}

impl Backend for CpuDevice {
    specula_backend_api::host_memory_backend!();

    fn run_write(&self, mut write: Write<'_, '_>) -> Result<()> {
        let (dst, bytes) = write.parts();
        let before = host::stamp(dst);
        host::bytes_mut(dst)?.copy_from_slice(bytes);
        // A write to a count table marks the slots it covers for a new scan.
        self.counted.written(before, dst);
        Ok(())
    }

    fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
        specula_backend_api::dispatch_ops!(self, call;
            TopKTopPSampleProcessed => ops::process_logits::run_processed_sample)
    }
}
