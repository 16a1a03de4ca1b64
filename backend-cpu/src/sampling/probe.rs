//! Timing of the `#[ignore]`d measurement tests (stage probes: never run as checks).

/// A buffer whose read evicts the caches of this machine kind (400 MiB).
pub(crate) fn evictor() -> Vec<u64> {
    vec![1; 50 << 20]
}

/// The time of `f` on rows `0..rows` read from memory, in µs a row: each row's least time over 7
/// rounds, each round after a read of `evict`, averaged over the rows (a round a busy machine
/// interrupts costs only the rows it interrupts).
pub(crate) fn cold_micros(rows: usize, evict: &[u64], f: &mut dyn FnMut(usize)) -> f64 {
    let mut best = vec![f64::INFINITY; rows];
    for _ in 0..7 {
        std::hint::black_box(evict.iter().fold(0u64, |a, &b| a.wrapping_add(b)));
        for (i, least) in best.iter_mut().enumerate() {
            let start = std::time::Instant::now();
            f(i);
            *least = least.min(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    best.iter().sum::<f64>() / rows as f64
}

/// The least wall time of `f` in µs over `reps` calls, after one untimed call (warm).
pub(crate) fn least_us(reps: usize, f: &mut dyn FnMut()) -> f64 {
    f();
    let timed = |_| {
        let start = std::time::Instant::now();
        f();
        start.elapsed().as_secs_f64() * 1e6
    };
    (0..reps).map(timed).fold(f64::INFINITY, f64::min)
}
