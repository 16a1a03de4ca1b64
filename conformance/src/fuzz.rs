//! A seeded fuzzer over the public `Device` API, run for a bounded time (`specula fuzz`).
//!
//! - **Ops**: a pool of small generated cases (every op, shapes of the quick set, inputs under
//!   [`POOL_CASE_BYTES`]) is mutated with hostile device contents — lengths, ids, offsets and
//!   flags replaced by edge values (negative, `i32::MIN/MAX`, just past the end, small values that
//!   bring `base + k` back in range), floats by NaN, ±inf, ±0, subnormals, huge values and random
//!   bits, seeds by the edge seeds — and run device-only (no host copies) on every backend with
//!   guard windows around every output, compared with the reference device. Every mutation is a
//!   valid call: the fallbacks of `docs/semantics.md` decide the outputs, identically everywhere.
//! - **Memory**: random allocations, uploads, windowed writes and downloads of every dtype, with
//!   the bytes around each window checked, plus invalid calls that must fail with the right error.
//!
//! Everything is a pure function of the seed and the iteration number, so a failure is reproduced
//! by its seed and iteration; the failing case is also saved as a replay file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use specula_backend_api::abi::MAX_INFER_SEED;
use specula_backend_api::{Buffer, DType, Device, Error, Op};

use crate::backends::Backend;
use crate::cases::Case;
use crate::cases::generate::{EDGE_SEEDS, Rng};
use crate::cases::{self, Size};
use crate::suite::{CaseEntry, Outcome, Suite, catch};
use crate::tensor::HostTensor;
use crate::{ConformanceError, replay};

/// Cases whose inputs exceed this many bytes are left out of the pool (the fuzzer wants many
/// small calls, not a few big ones).
pub const POOL_CASE_BYTES: usize = 256 * 1024;

/// What to run and for how long.
#[derive(Clone, Debug)]
pub struct FuzzConfig {
    /// The seed every mutation derives from.
    pub seed: u64,
    /// Stop after this long (each phase gets its share).
    pub budget: Duration,
    /// Or after this many op cases, whichever comes first.
    pub max_cases: Option<usize>,
    /// Where a failing case is saved as a replay file.
    pub out_dir: PathBuf,
}

/// What a fuzz run did.
#[derive(Clone, Debug, Default)]
pub struct FuzzReport {
    /// Mutated op cases run (each on the reference and on every available backend).
    pub cases: usize,
    /// Op calls per backend (the reference included).
    pub calls: BTreeMap<String, usize>,
    /// Memory operations per backend.
    pub memory_ops: BTreeMap<String, usize>,
    /// Wall time of the op phase and of the memory phase, in seconds.
    pub seconds: (f64, f64),
    /// Every failure, with the backend, the case and where its replay file went.
    pub failures: Vec<String>,
}

impl FuzzReport {
    /// The run's summary: cases, calls and memory operations per second, per backend.
    pub fn render(&self) -> String {
        let mut out = format!(
            "ops: {} mutated cases in {:.1} s ({:.0} cases/s)\n",
            self.cases,
            self.seconds.0,
            self.cases as f64 / self.seconds.0.max(1e-9)
        );
        for (backend, calls) in &self.calls {
            let rate = *calls as f64 / self.seconds.0.max(1e-9);
            out.push_str(&format!(
                "  {backend:10} {calls:7} op calls ({rate:.0}/s)\n"
            ));
        }
        out.push_str(&format!("memory: {:.1} s\n", self.seconds.1));
        for (backend, ops) in &self.memory_ops {
            let rate = *ops as f64 / self.seconds.1.max(1e-9);
            out.push_str(&format!(
                "  {backend:10} {ops:7} memory ops ({rate:.0}/s)\n"
            ));
        }
        out
    }
}

/// The pool of small cases every mutation starts from, in a stable order.
pub fn pool() -> Vec<Case> {
    Op::ALL
        .into_iter()
        .flat_map(|op| cases::cases(op, Size::Quick))
        .filter(|c| c.expected_error.is_none() && input_bytes(c) <= POOL_CASE_BYTES)
        .collect()
}

fn input_bytes(case: &Case) -> usize {
    case.inputs.values().map(|t| t.bytes.len()).sum()
}

/// Case `iteration` of the run with `seed`: a pool case with hostile device contents.
pub fn mutated(pool: &[Case], seed: u64, iteration: u64) -> Case {
    let mut rng = Rng::new("fuzz", seed ^ iteration.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let base = &pool[rng.below(pool.len())];
    let mut case = base.clone().device_only();
    case.name = format!("fuzz::{seed}::{iteration}::{}", base.name);
    case.expected = None;
    let names: Vec<String> = case.inputs.keys().cloned().collect();
    for name in names {
        if rng.chance(1, 2)
            && let Some(tensor) = case.inputs.get_mut(&name)
        {
            mutate(&mut rng, tensor);
        }
    }
    case
}

/// Replaces a few elements of `tensor` with hostile values of its dtype.
fn mutate(rng: &mut Rng, tensor: &mut HostTensor) {
    let len = tensor.len();
    if len == 0 {
        return;
    }
    let size = tensor.dtype.size_bytes();
    let count = 1 + rng.below(len.div_ceil(4));
    for _ in 0..count {
        let i = rng.below(len);
        let value = hostile_bytes(rng, tensor.dtype, len);
        tensor.bytes[i * size..(i + 1) * size].copy_from_slice(&value[..size]);
    }
}

/// A hostile element of `dtype` as little-endian bytes (padded to 8).
fn hostile_bytes(rng: &mut Rng, dtype: DType, len: usize) -> [u8; 8] {
    let mut out = [0u8; 8];
    match dtype {
        DType::I32 | DType::U32 => out[..4].copy_from_slice(&hostile_i32(rng, len).to_le_bytes()),
        DType::U64 => out.copy_from_slice(&hostile_u64(rng).to_le_bytes()),
        DType::U8 => out[0] = rng.pick(&[0, 1, 2, 7, 128, 255]),
        DType::F32 => out[..4].copy_from_slice(&hostile_f32(rng).to_le_bytes()),
        DType::F16 => {
            let h = half::f16::from_f32(hostile_f32(rng));
            out[..2].copy_from_slice(&h.to_bits().to_le_bytes());
        }
        DType::BF16 => {
            let h = half::bf16::from_f32(hostile_f32(rng));
            out[..2].copy_from_slice(&h.to_bits().to_le_bytes());
        }
    }
    out
}

/// Lengths, ids and offsets: the edges of i32, just past `len`, and small values (some negative)
/// that bring `base + k` back into range.
fn hostile_i32(rng: &mut Rng, len: usize) -> i32 {
    let n = i32::try_from(len).unwrap_or(i32::MAX);
    match rng.below(6) {
        0 => rng.pick(&[i32::MIN, i32::MIN + 1, -1, 0, i32::MAX - 1, i32::MAX]),
        1 => n.saturating_add(rng.below(3) as i32),
        2 => rng.next_u64() as i32,
        _ => rng.below(2 * len + 9) as i32 - n.min(4) - 4,
    }
}

fn hostile_u64(rng: &mut Rng) -> u64 {
    match rng.below(3) {
        0 => rng.pick(&EDGE_SEEDS),
        1 => MAX_INFER_SEED
            .wrapping_add(rng.below(9) as u64)
            .wrapping_sub(4),
        _ => rng.next_u64(),
    }
}

fn hostile_f32(rng: &mut Rng) -> f32 {
    match rng.below(4) {
        0 => rng.pick(&[
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MIN_POSITIVE / 8.0,
            -f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            1.0,
            -1.0,
            2.0,
            1e-30,
        ]),
        1 => f32::from_bits(rng.next_u64() as u32),
        _ => (rng.unit() * 1.5 - 0.25) as f32,
    }
}

/// Runs mutated op cases on every available backend against the reference until the op phase's
/// share of the budget is spent; records failures (and saves each failing case).
pub fn fuzz_ops(suite: &Suite, config: &FuzzConfig, report: &mut FuzzReport) {
    let pool = pool();
    let start = Instant::now();
    let deadline = start + config.budget / 2;
    let available: Vec<&Backend> = suite
        .backends
        .iter()
        .filter(|b| b.device().is_some())
        .collect();
    let mut iteration = 0u64;
    while Instant::now() < deadline && config.max_cases.is_none_or(|m| report.cases < m) {
        let entry = CaseEntry::new(mutated(&pool, config.seed, iteration));
        iteration += 1;
        report.cases += 1;
        *report.calls.entry("reference".to_owned()).or_default() += 1;
        if let Some(message) = entry.reference_outputs(suite.reference.as_ref()).err() {
            record(report, config, "reference", &entry, &message);
            continue;
        }
        for backend in &available {
            let Some(device) = backend.device() else {
                continue;
            };
            if crate::suite::unsupported(device.as_ref(), &entry.case).is_some() {
                continue;
            }
            *report.calls.entry(backend.name.clone()).or_default() += 1;
            if let (Outcome::Failed(message), _) = suite.check_case(device.as_ref(), &entry) {
                record(report, config, &backend.name, &entry, &message);
            }
        }
    }
    report.seconds.0 = start.elapsed().as_secs_f64();
}

fn record(report: &mut FuzzReport, config: &FuzzConfig, who: &str, entry: &CaseEntry, why: &str) {
    let file = config.out_dir.join(format!(
        "{}.safetensors",
        entry.case.name.replace("::", "-")
    ));
    let saved = std::fs::create_dir_all(&config.out_dir)
        .map_err(|source| ConformanceError::Io {
            path: config.out_dir.display().to_string(),
            source,
        })
        .and_then(|()| replay::save(&file, &entry.case));
    let place = match saved {
        Ok(()) => format!("saved to {}", file.display()),
        Err(e) => format!("not saved: {e}"),
    };
    report.failures.push(format!(
        "{who}: {} ({}): {why} [{place}]",
        entry.case.name,
        entry.case.op()
    ));
}

/// Runs the memory phase on every available backend for its share of the budget.
pub fn fuzz_memory(suite: &Suite, config: &FuzzConfig, report: &mut FuzzReport) {
    let start = Instant::now();
    let devices: Vec<(String, &dyn Device)> = std::iter::once((
        "reference".to_owned(),
        suite.reference.as_ref() as &dyn Device,
    ))
    .chain(
        suite
            .backends
            .iter()
            .filter_map(|b| b.device().map(|d| (b.name.clone(), d.as_ref()))),
    )
    .collect();
    let share = config.budget / 2 / devices.len().max(1) as u32;
    for (name, device) in devices {
        let mut rng = Rng::new(&format!("fuzz/memory/{name}"), config.seed);
        let until = Instant::now() + share;
        let mut ops = 0usize;
        while Instant::now() < until {
            match catch(|| memory_round(device, &mut rng)) {
                Ok(Ok(n)) => ops += n,
                Ok(Err(why)) => report.failures.push(format!("{name}: memory: {why}")),
                Err(panic) => report
                    .failures
                    .push(format!("{name}: memory: panicked: {panic}")),
            }
        }
        report.memory_ops.insert(name, ops);
    }
    report.seconds.1 = start.elapsed().as_secs_f64();
}

/// One round of memory operations; returns how many it made, or what went wrong.
fn memory_round(device: &dyn Device, rng: &mut Rng) -> std::result::Result<usize, String> {
    let dtype = rng.pick(&DType::ALL);
    let size = dtype.size_bytes();
    let len = rng.pick(&[0, 1, 2, 3, 7, 64, 1000, 4099]);
    let bytes: Vec<u8> = (0..len * size).map(|_| rng.next_u64() as u8).collect();
    let mut buffer = device
        .upload_bytes(dtype, &bytes)
        .map_err(|e| e.to_string())?;
    let offset = rng.below(len + 1);
    let window = rng.below(len - offset + 1);
    buffer
        .set_window(offset, window)
        .map_err(|e| e.to_string())?;
    let patch: Vec<u8> = (0..window * size).map(|_| rng.next_u64() as u8).collect();
    device
        .write_bytes(&mut buffer, &patch)
        .map_err(|e| e.to_string())?;
    check_window(device, &mut buffer, &bytes, &patch, offset * size)?;
    invalid_calls(device, rng, &mut buffer, dtype)?;
    let zeroed = device.alloc_zeroed(dtype, len).map_err(|e| e.to_string())?;
    if device.download_bytes(&zeroed).map_err(|e| e.to_string())? != vec![0; len * size] {
        return Err(format!("alloc_zeroed({dtype}, {len}) is not zero"));
    }
    Ok(6)
}

/// The window holds `patch` and the bytes around it are still `original`.
fn check_window(
    device: &dyn Device,
    buffer: &mut Buffer,
    original: &[u8],
    patch: &[u8],
    start: usize,
) -> std::result::Result<(), String> {
    if device.download_bytes(buffer).map_err(|e| e.to_string())? != patch {
        return Err("a window does not read back what was written".to_owned());
    }
    buffer.reset_window();
    let all = device.download_bytes(buffer).map_err(|e| e.to_string())?;
    let mut expected = original.to_vec();
    expected[start..start + patch.len()].copy_from_slice(patch);
    match all == expected {
        true => Ok(()),
        false => Err("a windowed write changed bytes outside its window".to_owned()),
    }
}

/// Invalid memory calls fail with the documented error, and never panic or abort.
fn invalid_calls(
    device: &dyn Device,
    rng: &mut Rng,
    buffer: &mut Buffer,
    dtype: DType,
) -> std::result::Result<(), String> {
    let size = dtype.size_bytes();
    let wrong = buffer.len() + 1 + rng.below(3);
    let written = device.write_bytes(buffer, &vec![0; wrong * size]);
    expect(written, "write of another length", |e| {
        matches!(e, Error::ShapeMismatch { .. })
    })?;
    if size > 1 {
        let uploaded = device.upload_bytes(dtype, &vec![0; size + 1]);
        expect(uploaded.map(drop), "upload of a partial element", |e| {
            matches!(e, Error::InvalidArgument { .. })
        })?;
    }
    let huge = device.alloc_zeroed(dtype, (usize::MAX / size).saturating_add(rng.below(2)));
    expect(huge.map(drop), "allocation whose size overflows", |e| {
        matches!(e, Error::OutOfMemory { .. })
    })
}

fn expect(
    result: specula_backend_api::Result<()>,
    what: &str,
    ok: impl Fn(&Error) -> bool,
) -> std::result::Result<(), String> {
    match result {
        Err(e) if ok(&e) => Ok(()),
        Err(e) => Err(format!("{what}: wrong error {e:?}")),
        Ok(()) => Err(format!("{what}: accepted")),
    }
}

/// Runs both phases; the default place for failing cases is `target/fuzz-failures`.
pub fn run(suite: &Suite, config: &FuzzConfig) -> FuzzReport {
    let mut report = FuzzReport::default();
    fuzz_ops(suite, config, &mut report);
    fuzz_memory(suite, config, &mut report);
    report
}

/// The default directory for failing cases.
pub fn default_out_dir() -> PathBuf {
    Path::new("target").join("fuzz-failures")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::backends;

    #[test]
    fn mutations_are_deterministic_device_only_and_hostile() {
        let pool = pool();
        assert!(pool.iter().any(|c| c.op() == Op::VerifyDraftTokens));
        let (a, b) = (mutated(&pool, 7, 3), mutated(&pool, 7, 3));
        assert_eq!(a, b);
        assert!(a.device_only && a.expected.is_none());
        assert!(a.name.starts_with("fuzz::7::3::"), "{}", a.name);
        let changed = (0..50)
            .map(|i| mutated(&pool, 7, i))
            .filter(|c| {
                let base = c.name.splitn(4, "::").nth(3).unwrap_or_default();
                let original = pool.iter().find(|p| p.name == base && p.op() == c.op());
                original.is_some_and(|o| o.inputs != c.inputs)
            })
            .count();
        assert!(
            changed > 25,
            "only {changed} of 50 mutated cases differ from their base"
        );
    }

    #[test]
    fn a_short_run_on_the_cpu_finds_nothing() {
        let suite = Suite::new(
            backends::probe_selected(&[specula_backend_api::BackendKind::Cpu]),
            Size::Quick,
        )
        .unwrap();
        let config = FuzzConfig {
            seed: 1,
            budget: Duration::from_secs(4),
            max_cases: Some(60),
            out_dir: std::env::temp_dir().join("specula-fuzz-test"),
        };
        let report = run(&suite, &config);
        assert!(report.failures.is_empty(), "{:#?}", report.failures);
        assert!(
            report.cases > 0 && report.memory_ops["cpu"] > 0,
            "{}",
            report.render()
        );
    }
}
