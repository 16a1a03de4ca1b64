//! Where the device's pool workers run: worker *i* pinned to the *i*-th CPU the process may use.
//!
//! A rayon worker with nothing to do goes to sleep. When a call wakes the pool, Linux's scheduler
//! places a woken thread next to the thread that woke it (wake-affine placement), so after any pause
//! — the runner's own work between two sampling calls, the bench's cache eviction — both workers
//! of a two-thread pool can wake on the caller's CPU and take turns there while the other CPU
//! idles: a batch then takes one core's time (measured on the 2-vCPU CI kind: 64 rows of 60 µs in
//! 3.9–4.1 ms after a 30 ms pause against 1.93 ms back to back, and 1.98–2.1 ms with the workers
//! pinned; `docs/performance.md`, "The pool's workers pinned to their own CPUs").
//!
//! So each worker pins itself to its own CPU as it starts, when the process may use at least as
//! many CPUs as the pool has workers. `SPECULA_CPU_PIN_THREADS=0` turns this off (a runner that
//! places its own threads); pinning is only a placement, so results never depend on it. Elsewhere
//! than on Linux nothing is pinned.
//!
//! Devices in one process never share a CPU through pinning: a device claims the CPUs its
//! workers pin to for as long as it lives ([`Claim`]), and a later device pins its workers to
//! CPUs no live device holds — or, when too few are left, leaves them unpinned (two pools pinned
//! to the same CPUs could not move off each other's).

/// The environment variable that turns pinning off when set to `0`.
pub(crate) const PIN_VAR: &str = "SPECULA_CPU_PIN_THREADS";

/// Whether pinning is on: unless [`PIN_VAR`] is `0` (or `false`, `off`, `no`).
fn pinning_enabled() -> bool {
    match std::env::var(PIN_VAR) {
        Ok(value) => !matches!(
            value.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "off" | "no"
        ),
        Err(_) => true,
    }
}

/// The CPUs worker `0..threads` pin themselves to: the first `threads` of `allowed` that are not
/// `taken` (by another live device), when there are at least two workers and that many such
/// CPUs; `None` otherwise (nothing pinned).
pub(crate) fn placement_for(
    threads: usize,
    allowed: &[usize],
    taken: &[usize],
    enabled: bool,
) -> Option<Vec<usize>> {
    if !enabled || threads < 2 {
        return None;
    }
    let free: Vec<usize> = allowed
        .iter()
        .copied()
        .filter(|cpu| !taken.contains(cpu))
        .take(threads)
        .collect();
    (free.len() == threads).then_some(free)
}

/// The CPUs the live devices of a process have pinned their workers to.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    taken: std::sync::Mutex<Vec<usize>>,
}

/// The CPUs one device's workers are pinned to, held for the device's life: dropping it frees
/// them for a later device.
#[derive(Debug)]
pub(crate) struct Claim {
    claims: &'static Claims,
    cpus: Vec<usize>,
}

impl Claims {
    /// The CPUs no live device has pinned to, as [`placement_for`] picks them from `allowed`,
    /// claimed until the returned [`Claim`] is dropped; `None` when nothing is pinned.
    pub(crate) fn claim(
        &'static self,
        threads: usize,
        allowed: &[usize],
        enabled: bool,
    ) -> Option<Claim> {
        let mut taken = self.taken();
        let cpus = placement_for(threads, allowed, &taken, enabled);
        tracing::debug!(
            threads,
            ?allowed,
            ?taken,
            ?cpus,
            enabled,
            "cpu pool placement"
        );
        let cpus = cpus?;
        taken.extend_from_slice(&cpus);
        Some(Claim { claims: self, cpus })
    }

    /// The claimed CPUs (a panic elsewhere while they were held leaves them as they were).
    fn taken(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.taken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Claim {
    /// The CPU of each worker, by worker index.
    pub(crate) fn cpus(&self) -> &[usize] {
        &self.cpus
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claims.taken().retain(|cpu| !self.cpus.contains(cpu));
    }
}

/// The CPUs the process's live devices have pinned their workers to.
static CLAIMS: Claims = Claims {
    taken: std::sync::Mutex::new(Vec::new()),
};

/// The CPUs a new device's `threads` workers pin themselves to (see the module doc), claimed for
/// the device's life, or `None` (nothing pinned).
pub(crate) fn placement(threads: usize) -> Option<Claim> {
    let enabled = pinning_enabled();
    let allowed = if enabled { allowed_cpus() } else { Vec::new() };
    CLAIMS.claim(threads, &allowed, enabled)
}

/// The CPUs the calling thread may run on, in rising order (empty when unknown).
#[cfg(target_os = "linux")]
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is a plain bit array, for which all zeroes is a valid (empty) value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live `cpu_set_t` of the size passed; pid 0 is the calling thread.
    let status =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if status != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below `CPU_SETSIZE`, the number of bits of `set`.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// The CPUs the calling thread may run on (unknown here: empty).
#[cfg(not(target_os = "linux"))]
pub(crate) fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

/// Pins the calling thread to `cpu`; a failure (a CPU taken away since) is logged and leaves the
/// thread where it was.
#[cfg(target_os = "linux")]
pub(crate) fn pin_current_thread(cpu: usize) {
    // SAFETY: as in `allowed_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: `cpu` is below `CPU_SETSIZE`, the number of bits of `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a live `cpu_set_t` of the size passed; pid 0 is the calling thread.
    let status =
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if status != 0 {
        tracing::debug!(cpu, error = %std::io::Error::last_os_error(), "cannot pin a cpu pool worker");
    }
}

/// Pins the calling thread to `cpu` (nothing to do here).
#[cfg(not(target_os = "linux"))]
pub(crate) fn pin_current_thread(_cpu: usize) {}

/// The CPU the calling thread runs on now (`None` when unknown).
#[cfg(all(test, target_os = "linux"))]
fn current_cpu() -> Option<usize> {
    // SAFETY: `sched_getcpu` takes no arguments and only reads the calling thread's state.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_take_the_first_allowed_cpus_when_there_are_enough() {
        assert_eq!(placement_for(2, &[3, 5, 7], &[], true), Some(vec![3, 5]));
        assert_eq!(placement_for(3, &[0, 1, 2], &[], true), Some(vec![0, 1, 2]));
        // CPUs another device holds are skipped.
        assert_eq!(
            placement_for(2, &[3, 5, 7, 9], &[5], true),
            Some(vec![3, 7])
        );
        // Too few CPUs (free ones), one worker, or pinning turned off: nothing pinned.
        assert_eq!(placement_for(3, &[0, 1], &[], true), None);
        assert_eq!(placement_for(2, &[0, 1, 2], &[1, 2], true), None);
        assert_eq!(placement_for(1, &[0, 1], &[], true), None);
        assert_eq!(placement_for(2, &[0, 1], &[], false), None);
        assert_eq!(placement_for(2, &[], &[], true), None);
    }

    /// Two live devices never pin to the same CPU: the second takes the CPUs the first left, or
    /// pins nothing when too few are left; a device's CPUs are free again once it is dropped.
    #[test]
    fn live_devices_do_not_share_pinned_cpus() {
        // A registry of its own: the process's is shared with every other test's devices.
        let claims: &'static Claims = Box::leak(Box::default());
        let allowed = [0, 1, 2, 3, 4];
        let first = claims.claim(2, &allowed, true).expect("two free cpus");
        assert_eq!(first.cpus(), [0, 1]);
        let second = claims.claim(2, &allowed, true).expect("two more free cpus");
        assert_eq!(second.cpus(), [2, 3]);
        assert!(claims.claim(2, &allowed, true).is_none(), "one cpu is left");
        drop(first);
        let third = claims
            .claim(2, &allowed, true)
            .expect("the first device's cpus");
        assert_eq!(third.cpus(), [0, 1]);
        drop((second, third));
        assert!(claims.taken().is_empty());
        // Nothing pinned claims nothing.
        assert!(claims.claim(2, &allowed, false).is_none());
        assert!(claims.taken().is_empty());
    }

    /// A pool built as the device builds its pool runs each worker on its own CPU (skipped, with
    /// the reason, where the process may use fewer than two CPUs).
    #[cfg(target_os = "linux")]
    #[test]
    fn pinned_workers_run_on_their_own_cpus() {
        let allowed = allowed_cpus();
        let Some(cpus) = placement_for(2, &allowed, &[], true) else {
            eprintln!(
                "skipped: this process may use {} cpu(s), fewer than two",
                allowed.len()
            );
            return;
        };
        let pinned = cpus.clone();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .start_handler(move |i| pin_current_thread(pinned[i]))
            .build()
            .expect("a two-thread pool");
        let on: Vec<Option<usize>> = pool.broadcast(|_| current_cpu());
        assert_eq!(on, cpus.iter().map(|&c| Some(c)).collect::<Vec<_>>());
    }
}
