//! `specula bench`: time per call of each op on each backend, next to the memory floor.
//!
//! Every figure is measured in one run: after a warm-up, each repetition times the op and then,
//! on the CPU backend, one streaming read of the same input buffer on the same threads
//! ([`CpuDevice::read_floor`]; for `gather_next_token`, a parallel copy of the same bytes,
//! [`CpuDevice::copy_floor`]). With `cold` (the default of the command) a 512 MiB buffer is streamed
//! between repetitions so that neither the op nor the floor finds its input in the caches. The
//! report gives the median and minimum per call, the effective bandwidth over the bytes the op must
//! read, and the ratio of the op's median to the floor's median.
//!
//! The default inputs are LLM-like: probabilities are the softmax of Gaussian logits with standard
//! deviation 3.5 (the top-p 0.9 set of such a row holds one to three thousand of its 151936
//! tokens), logits the same Gaussian rows sampled at T = 0.8, generated deterministically. At
//! vocabulary 151936 and batches 1 and 64 the sampling lines are also measured on rows of other
//! shapes ([`ROW_KINDS`]): flat rows (N(0, 3²) at T = 1, thousands of tokens in the top-p 0.9 set)
//! and a sweep of top-p 0.9 set sizes from about 10 to about 100,000 tokens; those lines carry
//! the shape's tag (`logits_sample(k=0,p=0.9,T=1)[flat]`) and the median size of the top-p 0.9
//! set of their rows ([`Measurement::kept`]).
//!
//! On a GPU ([`run_on_device`], with the backend's [`DeviceClock`]) each repetition gives three
//! times: the *host* time of the call (until it returns, nothing waited for), its *kernel* time
//! (device events around the call), and the end-to-end time (until a synchronisation returns);
//! right after it, the device's *read floor*: the kernel time of one read of the same input by a
//! kernel that does nothing else. The ratio is kernel over floor. `cold` reads a large device
//! buffer between repetitions, so that neither finds its input in the GPU's L2. With
//! [`BenchOptions::graph`], the unified step is also captured once and timed as replays of one
//! graph (`step(...,graph)` lines).

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, Device, DeviceExt, Result};
use specula_backend_cpu::CpuDevice;
use specula_reference::fixtures::step::{StepRows, StepSlots};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Untimed calls before measuring.
    pub warmup: usize,
    /// Timed calls.
    pub repeats: usize,
    /// Evict the caches between repetitions.
    pub cold: bool,
    /// Only the 151936 vocabulary at batches 1 and 64.
    pub quick: bool,
    /// Only lines whose op name ([`line_names`]) contains one of these (all when empty).
    pub ops: Vec<String>,
    /// Also time the unified step captured as one graph and replayed (a device with a
    /// [`DeviceClock`] only).
    pub graph: bool,
    /// Test-sized shapes instead of the 151936 vocabulary: 4096 at batches 1 and 4, 4 slots.
    pub tiny: bool,
}

/// What a GPU backend lends the bench: device-side timing by events, the device read floor and
/// captured steps. [`run_on_device`] takes one; the CPU backend's floor is
/// [`CpuDevice::read_floor`] instead.
pub trait DeviceClock {
    /// Marks the start of the device work enqueued from now on.
    fn start(&self) -> Result<()>;
    /// Marks its end (enqueued; nothing waits).
    fn stop(&self) -> Result<()>;
    /// Seconds of device time between the last start and stop marks (waits for the stop mark).
    fn elapsed(&self) -> Result<f64>;
    /// Enqueues one read of `buffer`'s window by a kernel that does nothing else.
    fn read_floor(&self, buffer: &Buffer) -> Result<()>;
    /// Enqueues a read of a buffer larger than the device's caches (the cold mode).
    fn evict(&self) -> Result<()>;
    /// Records `step` once (its calls on the device) and returns what replays it.
    fn capture<'s>(&'s self, step: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Replay + 's>>;
}

/// A step captured by [`DeviceClock::capture`].
pub trait Replay {
    /// Enqueues the whole step again.
    fn replay(&self) -> Result<()>;
}

/// The `(top_k, top_p)` settings the sampling lines are measured in.
const SAMPLE_SETTINGS: [(i32, f32); 3] = [(0, 0.9), (50, 0.9), (0, 1.0)];

/// How the rows of a group of sampling lines are drawn: Gaussian logits N(0, σ²) sampled at
/// temperature `temperature`, and for the probability lines the softmax of the same logits at
/// that temperature.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowKind {
    /// The tag the kind's lines carry after their op name (`[flat]`).
    pub tag: &'static str,
    /// The standard deviation of the logits.
    pub sigma: f64,
    /// The temperature the rows are sampled at.
    pub temperature: f32,
}

/// The shaped row kinds the sampling lines are measured on at vocabulary 151936 and batches 1
/// and 64, besides the LLM-like default rows: flat rows, then a sweep whose top-p 0.9 sets hold
/// about 10, 100, 1000, 10,000 and 100,000 tokens (σ solves `V · P(Z > σ − z_0.9) = n` for
/// normal logits at T = 1; each line reports the median size it met, [`Measurement::kept`]).
pub const ROW_KINDS: [RowKind; 6] = [
    RowKind {
        tag: "flat",
        sigma: 3.0,
        temperature: 1.0,
    },
    RowKind {
        tag: "kept~10",
        sigma: 5.1,
        temperature: 1.0,
    },
    RowKind {
        tag: "kept~100",
        sigma: 4.49,
        temperature: 1.0,
    },
    RowKind {
        tag: "kept~1k",
        sigma: 3.76,
        temperature: 1.0,
    },
    RowKind {
        tag: "kept~10k",
        sigma: 2.79,
        temperature: 1.0,
    },
    RowKind {
        tag: "kept~100k",
        sigma: 0.874,
        temperature: 1.0,
    },
];

/// The kinds whose float ops (`softmax`, `accept_logprobs`) are measured too.
const FLOAT_OP_KINDS: [&str; 1] = ["flat"];

/// `name` tagged with the row kind it was measured on.
fn tagged(name: &str, kind: &RowKind) -> String {
    format!("{name}[{}]", kind.tag)
}

/// A temperature as the line names write it (`0.8`, `1`).
fn temperature_label(t: f32) -> String {
    format!("{t}")
}

/// The tokens per slot the unified step is measured at.
const STEP_TOKENS: [usize; 3] = [1, 4, 6];

fn sample_line(k: i32, p: f32) -> String {
    format!("top_k_top_p_sample(k={k},p={p})")
}

fn logits_sample_line(k: i32, p: f32) -> String {
    logits_sample_line_at(k, p, 0.8)
}

fn logits_sample_line_at(k: i32, p: f32, t: f32) -> String {
    format!("logits_sample(k={k},p={p},T={})", temperature_label(t))
}

fn softmax_sample_line(k: i32, p: f32) -> String {
    softmax_sample_line_at(k, p, 0.8)
}

fn softmax_sample_line_at(k: i32, p: f32, t: f32) -> String {
    format!("softmax+sample(k={k},p={p},T={})", temperature_label(t))
}

fn softmax_line_at(t: f32) -> String {
    format!("softmax(T={})", temperature_label(t))
}

fn logprobs_line_at(t: f32) -> String {
    format!("accept_logprobs(K=20,T={})", temperature_label(t))
}

/// The lines measured on the rows of a shaped kind ([`ROW_KINDS`]), tagged with it.
fn kind_line_names(kind: &RowKind) -> Vec<String> {
    let t = kind.temperature;
    let mut names = Vec::new();
    for (k, p) in SAMPLE_SETTINGS {
        names.push(tagged(&sample_line(k, p), kind));
        names.push(tagged(&logits_sample_line_at(k, p, t), kind));
        names.push(tagged(&softmax_sample_line_at(k, p, t), kind));
    }
    if FLOAT_OP_KINDS.contains(&kind.tag) {
        names.push(tagged(&softmax_line_at(t), kind));
        names.push(tagged(&logprobs_line_at(t), kind));
    }
    names
}

fn step_line(s: usize, from_logits: bool) -> String {
    if from_logits {
        format!("step(target_match,S={s},logits,T=0.8)")
    } else {
        format!("step(target_match,S={s})")
    }
}

/// The unified step captured once and replayed as one graph ([`BenchOptions::graph`]).
fn graph_step_line(s: usize, from_logits: bool) -> String {
    if from_logits {
        format!("step(target_match,S={s},logits,T=0.8,graph)")
    } else {
        format!("step(target_match,S={s},graph)")
    }
}

/// The unified step from logits with every parameter of `docs/semantics.md` §4c on.
fn processed_step_line(s: usize) -> String {
    format!("step(target_match,S={s},logits,T=0.8,processed)")
}

/// The processed step timed in pairs with the step without processing (alternating which runs
/// first): its ratio is the median of the pairs' ratios, which the drift of a shared machine's
/// load moves far less than a ratio of two lines measured one after the other.
fn paired_step_line(s: usize) -> String {
    format!("step(target_match,S={s},logits,T=0.8,processed/plain)")
}

/// The tokens per slot of the processed step line.
const PROCESSED_STEP_TOKENS: usize = 6;

/// The ranks of the sharded sampling line (`docs/semantics.md` §4d).
const SHARD_RANKS: usize = 4;

fn sharded_sample_line(k: i32, p: f32) -> String {
    format!("sharded_sample(ranks={SHARD_RANKS},k={k},p={p})")
}

const ARGMAX_LINE: &str = "argmax";
const CANDIDATES_LINE: &str = "top_p_candidates(c=8,p=0.9)";
const GATHER_LINE: &str = "gather_next_token(bf16)";
const SOFTMAX_LINE: &str = "softmax(T=0.8)";
const LOGPROBS_LINE: &str = "accept_logprobs(K=20,T=0.8)";

/// Every op name a bench line can carry (the `op` column and [`Measurement::op`]), whatever the
/// backend and the shapes: `--op` values are matched against these by substring.
///
/// ```
/// use specula_conformance::bench;
/// assert!(bench::line_names().iter().any(|n| n == "step(target_match,S=4)"));
/// assert!(bench::matches_some_line("logits_sample"));
/// assert!(!bench::matches_some_line("nosuchop"));
/// ```
pub fn line_names() -> Vec<String> {
    let mut names = Vec::new();
    names.extend(SAMPLE_SETTINGS.map(|(k, p)| sample_line(k, p)));
    names.push(ARGMAX_LINE.to_owned());
    names.push(CANDIDATES_LINE.to_owned());
    names.extend(SAMPLE_SETTINGS.map(|(k, p)| logits_sample_line(k, p)));
    names.extend(SAMPLE_SETTINGS.map(|(k, p)| softmax_sample_line(k, p)));
    names.push(SOFTMAX_LINE.to_owned());
    names.push(LOGPROBS_LINE.to_owned());
    names.extend(STEP_TOKENS.map(|s| step_line(s, false)));
    names.extend(STEP_TOKENS.map(|s| step_line(s, true)));
    names.extend(STEP_TOKENS.map(|s| graph_step_line(s, false)));
    names.extend(STEP_TOKENS.map(|s| graph_step_line(s, true)));
    names.push(processed_step_line(PROCESSED_STEP_TOKENS));
    names.push(paired_step_line(PROCESSED_STEP_TOKENS));
    names.push(GATHER_LINE.to_owned());
    names.extend(ROW_KINDS.iter().flat_map(kind_line_names));
    names.extend(SAMPLE_SETTINGS.map(|(k, p)| sharded_sample_line(k, p)));
    names
}

/// The ops the bench lines measure, without their settings (`argmax`, `step`, ...), in
/// [`line_names`] order: what an error message lists.
pub fn op_names() -> Vec<String> {
    let mut ops: Vec<String> = Vec::new();
    for name in line_names() {
        let op = name.split('(').next().unwrap_or(&name).to_owned();
        if !ops.contains(&op) {
            ops.push(op);
        }
    }
    ops
}

/// Whether `op` (an `--op` value) selects at least one bench line: it is a non-empty part of a
/// name of [`line_names`].
pub fn matches_some_line(op: &str) -> bool {
    !op.is_empty() && line_names().iter().any(|name| name.contains(op))
}

/// One measured shape of one op on one backend.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    /// Backend name.
    pub backend: String,
    /// Op (with its setting, e.g. `top_k_top_p_sample(k=50,p=0.9)`).
    pub op: String,
    /// Rows (or slots for the step).
    pub batch: usize,
    /// Vocabulary (or hidden size for gather).
    pub width: usize,
    /// Tokens per slot for the unified step, 1 otherwise.
    pub step_tokens: usize,
    /// Bytes the op must read at least.
    pub bytes: u64,
    /// Median seconds per call.
    pub median_s: f64,
    /// Minimum seconds per call.
    pub min_s: f64,
    /// Effective bandwidth over `bytes` at the median, GB/s.
    pub gbps: f64,
    /// Median seconds of the floor: on the CPU one streaming read (or copy) of the input; on a
    /// GPU the kernel time of one read of it.
    pub floor_median_s: Option<f64>,
    /// `median_s / floor_median_s` on the CPU; on a GPU `kernel_median_s / floor_median_s`.
    pub ratio: Option<f64>,
    /// What the floor is (`read`, `memcpy`, `paired` or `device read`).
    pub floor_kind: Option<&'static str>,
    /// GPU: median seconds until the call returned (the host's part, nothing waited for).
    pub host_median_s: Option<f64>,
    /// GPU: median seconds of device time of the call (events around it).
    pub kernel_median_s: Option<f64>,
    /// For the sampling lines of a shaped row kind ([`ROW_KINDS`]): the median number of tokens
    /// the top-p 0.9 set (without top-k) of the line's rows holds.
    pub kept: Option<usize>,
}

/// The floor the CPU backend measures next to an op.
enum Floor<'a> {
    /// One streaming read of the buffer after each timed call.
    Read(&'a Buffer),
    /// One streaming read of the buffer, timed in repetitions of its own after the op's (the
    /// unified step).
    ReadAfter(&'a Buffer),
    /// A parallel copy of the same bytes after each timed call.
    Copy(&'a Buffer, &'a mut Buffer),
}

impl Floor<'_> {
    /// What the floor is, as reported.
    fn kind(&self) -> &'static str {
        match self {
            Floor::Read(_) | Floor::ReadAfter(_) => "read",
            Floor::Copy(..) => "memcpy",
        }
    }
}

struct Lcg(u64);
impl Lcg {
    fn next_unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn gaussian(&mut self) -> f64 {
        let (u, v) = (self.next_unit(), self.next_unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// LLM-like logits rows: Gaussian logits (σ = 3.5), the same draws as [`probability_rows`].
pub fn logit_rows(rows: usize, vocab: usize, seed: u64) -> Vec<f32> {
    to_f32(&gaussian_rows(rows, vocab, seed, 3.5))
}

/// `values` rounded to f32.
fn to_f32(values: &[f64]) -> Vec<f32> {
    values.iter().map(|&x| x as f32).collect()
}

/// LLM-like probability rows: softmax of Gaussian logits (σ = 3.5).
pub fn probability_rows(rows: usize, vocab: usize, seed: u64) -> Vec<f32> {
    softmax_rows(&gaussian_rows(rows, vocab, seed, 3.5), vocab, 1.0)
}

/// Gaussian logits N(0, σ²), drawn as [`logit_rows`] draws them (σ = 3.5 there).
pub fn gaussian_rows(rows: usize, vocab: usize, seed: u64, sigma: f64) -> Vec<f64> {
    let mut g = Lcg(seed);
    (0..rows * vocab).map(|_| sigma * g.gaussian()).collect()
}

/// The softmax of each `[vocab]` row of `logits` at temperature `t`, computed in f64 and
/// rounded to f32.
pub fn softmax_rows(logits: &[f64], vocab: usize, t: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(logits.len());
    for row in logits.chunks_exact(vocab) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|x| ((x - max) / t).exp()).sum();
        out.extend(row.iter().map(|x| (((x - max) / t).exp() / sum) as f32));
    }
    out
}

/// The median, over the `[vocab]` rows of `weights_of` (each row's integer sampling weights),
/// of the number of tokens the top-p 0.9 set (`docs/semantics.md` §5.6, no top-k) holds.
fn median_kept(rows: usize, weights_of: impl Fn(usize) -> Vec<u64>) -> usize {
    use specula_backend_api::fixed_point::{reaches_top_p, top_p_fixed};
    let p = top_p_fixed(0.9);
    let mut kept: Vec<f64> = (0..rows)
        .map(|r| {
            let mut w = weights_of(r);
            // Weights never increase down the rank order: by weight, the same prefix masses.
            w.sort_unstable_by(|a, b| b.cmp(a));
            let total: u64 = w.iter().sum();
            let mut mass = 0u64;
            let n = w.iter().position(|&x| {
                mass += x;
                reaches_top_p(mass, p, total)
            });
            n.map_or(w.len(), |n| n + 1) as f64
        })
        .collect();
    median(&mut kept) as usize
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Streams a large buffer to push the inputs out of the caches.
struct Evictor(Vec<u64>);
impl Evictor {
    fn new() -> Self {
        Evictor(vec![1; 64 << 20])
    }
    fn evict(&mut self) {
        let mut acc = 0u64;
        for w in self.0.iter_mut() {
            acc = acc.wrapping_add(*w);
            *w = acc;
        }
        std::hint::black_box(acc);
    }
}

/// Medians of one op's repetitions on a GPU, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceTimes {
    /// The call's host time.
    pub host: f64,
    /// The call's kernel time.
    pub kernel: f64,
    /// The read floor's kernel time.
    pub floor: f64,
}

/// The buffer a floor reads.
fn floor_source<'f>(floor: &'f Floor<'_>) -> &'f Buffer {
    match floor {
        Floor::Read(b) | Floor::ReadAfter(b) | Floor::Copy(b, _) => b,
    }
}

/// Measures the ops of one backend and tells `progress` each measurement.
struct Bencher<'a> {
    options: &'a BenchOptions,
    backend: &'a str,
    device: &'a dyn Device,
    cpu: Option<&'a CpuDevice>,
    clock: Option<&'a dyn DeviceClock>,
    evictor: Option<Evictor>,
    out: Vec<Measurement>,
    progress: &'a mut dyn FnMut(&Measurement),
    /// The top-p 0.9 set size the lines being measured report ([`Measurement::kept`]).
    kept: Option<usize>,
}

impl<'a> Bencher<'a> {
    /// A bencher of `device` without a floor (no CPU device, no clock, no host evictor).
    fn new(
        backend: &'a str,
        device: &'a dyn Device,
        options: &'a BenchOptions,
        progress: &'a mut dyn FnMut(&Measurement),
    ) -> Self {
        Bencher {
            options,
            backend,
            device,
            cpu: None,
            clock: None,
            evictor: None,
            out: Vec::new(),
            progress,
            kept: None,
        }
    }

    /// Pushes the inputs out of the caches (cold runs).
    fn evict(&mut self) {
        if let Some(e) = self.evictor.as_mut() {
            e.evict();
        }
    }

    /// Seconds of one floor measurement on the CPU backend.
    fn time_floor(&mut self, cpu: &CpuDevice, floor: &mut Floor<'_>) -> Result<f64> {
        self.evict();
        let start = Instant::now();
        match floor {
            Floor::Read(b) | Floor::ReadAfter(b) => {
                std::hint::black_box(cpu.read_floor(b)?);
            }
            Floor::Copy(src, dst) => cpu.copy_floor(src, dst)?,
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// Times `call` (after the warm-up) and, on the CPU backend, `floor`; records and reports the
    /// measurement of `op` at `(batch, width, step_tokens)`, which must read `bytes`.
    fn measure(
        &mut self,
        op: String,
        (batch, width, step_tokens): (usize, usize, usize),
        bytes: u64,
        mut floor: Option<Floor<'_>>,
        call: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        if let Some(clock) = self.clock {
            let source = floor.as_ref().map(floor_source);
            let times = self.measure_on_device(clock, source, call)?;
            let line = (op, (batch, width, step_tokens), bytes);
            self.record_device(line, times);
            return Ok(());
        }
        let device = self.device;
        for _ in 0..self.options.warmup {
            call()?;
            device.synchronize()?;
        }
        let repeats = self.options.repeats.max(1);
        let (mut times, mut floors) = (Vec::new(), Vec::new());
        for _ in 0..repeats {
            times.push(self.timed(call)?);
            if let (Some(cpu), Some(f)) = (self.cpu, floor.as_mut())
                && !matches!(f, Floor::ReadAfter(_))
            {
                floors.push(self.time_floor(cpu, f)?);
            }
        }
        if let (Some(cpu), Some(f @ Floor::ReadAfter(_))) = (self.cpu, floor.as_mut()) {
            for _ in 0..repeats {
                floors.push(self.time_floor(cpu, f)?);
            }
        }
        let floor = (!floors.is_empty())
            .then(|| median(&mut floors))
            .zip(floor.as_ref().map(Floor::kind))
            .map(|(median_s, kind)| (median_s, None, kind));
        let line = (op, (batch, width, step_tokens), bytes);
        self.record(line, times, floor);
        self.report_last();
        Ok(())
    }

    /// Tells `progress` the last measurement.
    fn report_last(&mut self) {
        if let Some(m) = self.out.last() {
            (self.progress)(m);
        }
    }

    /// Times `call` on the device ([`DeviceClock`]): per repetition its host, kernel and
    /// end-to-end seconds, then (with `floor`) the kernel seconds of one read of `floor`.
    fn measure_on_device(
        &mut self,
        clock: &dyn DeviceClock,
        floor: Option<&Buffer>,
        call: &mut dyn FnMut() -> Result<()>,
    ) -> Result<(Vec<f64>, Vec<DeviceTimes>)> {
        let device = self.device;
        for _ in 0..self.options.warmup {
            call()?;
            device.synchronize()?;
        }
        let (mut e2e, mut times) = (Vec::new(), Vec::new());
        for _ in 0..self.options.repeats.max(1) {
            self.evict_device(clock)?;
            clock.start()?;
            let start = Instant::now();
            call()?;
            let host = start.elapsed().as_secs_f64();
            clock.stop()?;
            device.synchronize()?;
            e2e.push(start.elapsed().as_secs_f64());
            let kernel = clock.elapsed()?;
            let floor = match floor {
                Some(buffer) => {
                    self.evict_device(clock)?;
                    clock.start()?;
                    clock.read_floor(buffer)?;
                    clock.stop()?;
                    clock.elapsed()?
                }
                None => f64::NAN,
            };
            times.push(DeviceTimes {
                host,
                kernel,
                floor,
            });
        }
        Ok((e2e, times))
    }

    /// In the cold mode, reads a buffer larger than the GPU's caches and waits for it.
    fn evict_device(&self, clock: &dyn DeviceClock) -> Result<()> {
        if self.options.cold {
            clock.evict()?;
            self.device.synchronize()?;
        }
        Ok(())
    }

    /// Reports and keeps the [`Measurement`] of a line measured on the device.
    fn record_device(
        &mut self,
        line: (String, (usize, usize, usize), u64),
        (e2e, times): (Vec<f64>, Vec<DeviceTimes>),
    ) {
        let medians = device_medians(&times);
        let floor = (!medians.floor.is_nan()).then_some((
            medians.floor,
            Some(medians.kernel / medians.floor),
            "device read",
        ));
        self.record(line, e2e, floor);
        if let Some(m) = self.out.last_mut() {
            m.host_median_s = Some(medians.host);
            m.kernel_median_s = Some(medians.kernel);
        }
        self.report_last();
    }

    /// Reports and keeps the [`Measurement`] of `line` (its op, shape and bytes) from the
    /// seconds of its timed calls, with its floor: the floor's median, the ratio when it is not
    /// the op's median over the floor's, and what the floor is.
    fn record(
        &mut self,
        (op, (batch, width, step_tokens), bytes): (String, (usize, usize, usize), u64),
        mut times: Vec<f64>,
        floor: Option<(f64, Option<f64>, &'static str)>,
    ) {
        let min_s = times.iter().copied().fold(f64::INFINITY, f64::min);
        let median_s = median(&mut times);
        let measurement = Measurement {
            backend: self.backend.to_owned(),
            op,
            batch,
            width,
            step_tokens,
            bytes,
            median_s,
            min_s,
            gbps: bytes as f64 / median_s / 1e9,
            floor_median_s: floor.map(|f| f.0),
            ratio: floor.map(|(f, ratio, _)| ratio.unwrap_or(median_s / f)),
            floor_kind: floor.map(|f| f.2),
            host_median_s: None,
            kernel_median_s: None,
            kept: self.kept,
        };
        self.out.push(measurement);
    }

    /// One timed call (after evicting the caches when cold): its seconds.
    fn timed(&mut self, call: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        self.evict();
        let start = Instant::now();
        call()?;
        self.device.synchronize()?;
        Ok(start.elapsed().as_secs_f64())
    }

    /// Measures `call` in pairs with `base` (the same work without what `call` adds), the order
    /// alternating from pair to pair: the floor column is `base`'s median, the ratio the median
    /// of the pairs' ratios.
    fn measure_paired(
        &mut self,
        op: String,
        (batch, width, step_tokens): (usize, usize, usize),
        bytes: u64,
        base: &mut dyn FnMut() -> Result<()>,
        call: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        for _ in 0..self.options.warmup {
            base()?;
            call()?;
            self.device.synchronize()?;
        }
        let (mut times, mut base_times, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..self.options.repeats.max(1) {
            let (time, base_time) = if i % 2 == 0 {
                let b = self.timed(base)?;
                (self.timed(call)?, b)
            } else {
                let c = self.timed(call)?;
                (c, self.timed(base)?)
            };
            ratios.push(time / base_time);
            times.push(time);
            base_times.push(base_time);
        }
        let floor = (median(&mut base_times), Some(median(&mut ratios)), "paired");
        let line = (op, (batch, width, step_tokens), bytes);
        self.record(line, times, Some(floor));
        self.report_last();
        Ok(())
    }

    /// Measures a row op over the `[rows, vocab]` f32 `probs` it reads, next to one read of them.
    fn measure_rows(
        &mut self,
        op: String,
        probs: &Buffer,
        (rows, vocab): (usize, usize),
        call: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let bytes = (rows * vocab * 4) as u64;
        let floor = Some(Floor::Read(probs));
        self.measure(op, (rows, vocab, 1), bytes, floor, call)
    }

    fn wants(&self, op: &str) -> bool {
        self.options.ops.is_empty() || self.options.ops.iter().any(|o| op.contains(o.as_str()))
    }

    /// Whether the step of `s` tokens (from logits or not) is measured: its plain line, or its
    /// captured one on a device that can capture.
    fn wants_step(&self, s: usize, from_logits: bool) -> bool {
        self.wants(&step_line(s, from_logits)) || self.wants_graph(s, from_logits)
    }

    /// Whether the captured step of `s` tokens is measured.
    fn wants_graph(&self, s: usize, from_logits: bool) -> bool {
        self.options.graph && self.clock.is_some() && self.wants(&graph_step_line(s, from_logits))
    }
}

/// The medians of each of the device times (NaN floors stay NaN: no floor was measured).
pub fn device_medians(times: &[DeviceTimes]) -> DeviceTimes {
    if times.is_empty() {
        return DeviceTimes {
            host: f64::NAN,
            kernel: f64::NAN,
            floor: f64::NAN,
        };
    }
    let of = |f: fn(&DeviceTimes) -> f64| median(&mut times.iter().map(f).collect::<Vec<_>>());
    DeviceTimes {
        host: of(|t| t.host),
        kernel: of(|t| t.kernel),
        floor: of(|t| t.floor),
    }
}

/// Every slot of a batch of `slots` slots described, `s` tokens each at most.
fn full_batch(slots: usize, s: usize) -> BatchDims {
    BatchDims::new(slots, slots, s)
}

/// Runs every benchmark on `device` (named `backend`). `cpu` is the same device when it is the
/// CPU backend, which adds the floor to each figure. `progress` is told each finished measurement.
pub fn run(
    backend: &str,
    device: &Arc<dyn Device>,
    cpu: Option<&CpuDevice>,
    options: &BenchOptions,
    progress: &mut dyn FnMut(&Measurement),
) -> Result<Vec<Measurement>> {
    let b = Bencher {
        cpu,
        evictor: options.cold.then(Evictor::new),
        ..Bencher::new(backend, device.as_ref(), options, progress)
    };
    run_all(b)
}

/// Runs every benchmark on a GPU `device` (named `backend`) with its `clock`: each line gives
/// the host, kernel and end-to-end times of a call and the device read floor next to it (see the
/// module's documentation), and with [`BenchOptions::graph`] the captured step.
pub fn run_on_device(
    backend: &str,
    device: &Arc<dyn Device>,
    clock: &dyn DeviceClock,
    options: &BenchOptions,
    progress: &mut dyn FnMut(&Measurement),
) -> Result<Vec<Measurement>> {
    let b = Bencher {
        clock: Some(clock),
        ..Bencher::new(backend, device.as_ref(), options, progress)
    };
    run_all(b)
}

/// The vocabularies and batches measured, and the slot counts of the unified step.
fn shapes(options: &BenchOptions) -> (&'static [usize], &'static [usize], &'static [usize]) {
    if options.tiny {
        (&[4096], &[1, 4], &[4])
    } else if options.quick {
        (&[151_936], &[1, 64], &[64])
    } else {
        (&[32_000, 128_256, 151_936], &[1, 8, 64, 256], &[1, 8, 64])
    }
}

/// Runs every benchmark `b` wants.
fn run_all(mut b: Bencher<'_>) -> Result<Vec<Measurement>> {
    let (d, options) = (b.device, b.options);
    let (vocabs, batches, slot_counts) = shapes(options);
    for &vocab in vocabs {
        for &rows in batches {
            row_benches(&mut b, rows, vocab)?;
            float_benches(&mut b, rows, vocab)?;
            if d.capabilities().logits {
                logits_benches(&mut b, rows, vocab)?;
            }
            if vocab == 151_936 && (rows == 1 || rows == 64) {
                for kind in &ROW_KINDS {
                    kind_benches(&mut b, rows, vocab, kind)?;
                }
            }
            if d.capabilities().logits && d.capabilities().sharded {
                sharded_benches(&mut b, rows, vocab)?;
            }
        }
        // The unified step (TARGET_MATCH): layout, per-row parameters, sampling, verification.
        for &slots in slot_counts {
            for s in STEP_TOKENS {
                if b.wants_step(s, false) {
                    step_bench(&mut b, slots, s, vocab, false)?;
                }
                if d.capabilities().logits && b.wants_step(s, true) {
                    step_bench(&mut b, slots, s, vocab, true)?;
                }
            }
            let s = PROCESSED_STEP_TOKENS;
            if d.capabilities().processing && b.wants(&processed_step_line(s)) {
                processed_step_bench(&mut b, (slots, s, vocab), false)?;
            }
            if d.capabilities().processing && b.wants(&paired_step_line(s)) {
                processed_step_bench(&mut b, (slots, s, vocab), true)?;
            }
        }
    }
    // gather_next_token: 384 rows of 8192 bf16 (64 slots × S = 6).
    if b.wants(GATHER_LINE) {
        gather_bench(&mut b)?;
    }
    Ok(b.out)
}

/// The row ops (sampling in three settings, argmax, candidates) over `[rows, vocab]`
/// probabilities.
fn row_benches(b: &mut Bencher<'_>, rows: usize, vocab: usize) -> Result<()> {
    let d = b.device;
    let shape = RowShape { rows, vocab };
    let probs = d.upload(&probability_rows(rows, vocab, (rows * vocab) as u64))?;
    let seed = d.upload(&(0..rows as u64).map(|r| r * 4 + 1).collect::<Vec<_>>())?;
    let mut tokens = d.alloc::<i32>(rows)?;
    for (k, p) in SAMPLE_SETTINGS {
        let op = sample_line(k, p);
        if !b.wants(&op) {
            continue;
        }
        let (top_k, top_p) = (d.upload(&vec![k; rows])?, d.upload(&vec![p; rows])?);
        let inputs = SampleInputs::new(Scores::Probs(&probs), &top_k, &top_p, &seed);
        let params = SampleParams::new(shape);
        b.measure_rows(op, &probs, (rows, vocab), &mut || {
            d.top_k_top_p_sample(&inputs, &mut tokens, &params)
        })?;
    }
    if b.wants(ARGMAX_LINE) {
        b.measure_rows(ARGMAX_LINE.into(), &probs, (rows, vocab), &mut || {
            d.argmax(&probs, &mut tokens, &shape)
        })?;
    }
    if b.wants(CANDIDATES_LINE) {
        let top_p = d.upload(&vec![0.9f32; rows])?;
        let (mut ids, mut scores, mut lens) = (
            d.alloc::<i32>(rows * 8)?,
            d.alloc::<f32>(rows * 8)?,
            d.alloc::<i32>(rows)?,
        );
        let inputs = CandidatesInputs::new(Scores::Probs(&probs), &top_p);
        let params = CandidatesParams::new(shape, 8);
        let op = CANDIDATES_LINE.to_owned();
        b.measure_rows(op, &probs, (rows, vocab), &mut || {
            let mut outputs = CandidatesOutputs {
                ids: &mut ids,
                scores: &mut scores,
                lens: &mut lens,
            };
            d.top_p_candidates(&inputs, &mut outputs, &params)
        })?;
    }
    Ok(())
}

/// The float ops over `[rows, vocab]` logits at T = 0.8: `softmax` (which also writes the row) and
/// `accept_logprobs` with the top 20 (one accepted token per row), next to one read of the logits.
fn float_benches(b: &mut Bencher<'_>, rows: usize, vocab: usize) -> Result<()> {
    if !b.wants(SOFTMAX_LINE) && !b.wants(LOGPROBS_LINE) {
        return Ok(());
    }
    let d = b.device;
    let shape = RowShape { rows, vocab };
    let logits = d.upload(&logit_rows(rows, vocab, (rows * vocab) as u64 + 3))?;
    let temperature = d.upload(&vec![0.8f32; rows])?;
    let names = (SOFTMAX_LINE.to_owned(), LOGPROBS_LINE.to_owned());
    float_lines(b, &logits, &temperature, shape, names)
}

/// `softmax` and `accept_logprobs` (K = 20, one accepted token per row) of `logits` at the rows'
/// `temperature`, as the lines `names`.
fn float_lines(
    b: &mut Bencher<'_>,
    logits: &Buffer,
    temperature: &Buffer,
    shape: RowShape,
    (softmax_line, logprobs_line): (String, String),
) -> Result<()> {
    let d = b.device;
    let RowShape { rows, vocab } = shape;
    if b.wants(&softmax_line) {
        let mut probs = d.alloc::<f32>(rows * vocab)?;
        let params = SoftmaxParams {
            shape,
            host_temperature: None,
        };
        b.measure_rows(softmax_line, logits, (rows, vocab), &mut || {
            d.softmax(logits, temperature, &mut probs, &params)
        })?;
    }
    if b.wants(&logprobs_line) {
        let top_k = 20usize;
        let accept_tokens = d.upload(
            &(0..rows as i32)
                .map(|i| (i * 7919) % vocab as i32)
                .collect::<Vec<_>>(),
        )?;
        let accept_num = d.upload(&vec![1i32; rows])?;
        let encoder = d.alloc::<i32>(rows)?;
        let cu_out = d.upload(&(0..=rows as i32).collect::<Vec<_>>())?;
        let mut out = LogprobsBuffers::alloc(d, rows, rows, top_k)?;
        let inputs = LogprobsInputs {
            logits,
            temperature,
            accept_tokens: &accept_tokens,
            accept_num: &accept_num,
            seq_lens_encoder: &encoder,
            cu_seqlens_q_output: &cu_out,
        };
        let params = LogprobsParams {
            dims: full_batch(rows, 1),
            shape,
            top_k,
            host_temperature: None,
        };
        b.measure_rows(logprobs_line, logits, (rows, vocab), &mut || {
            d.accept_logprobs(&inputs, &mut out.outputs(), &params)
        })?;
    }
    Ok(())
}

/// Sampling from `[rows, vocab]` logits at T = 0.8 (`docs/semantics.md` §4b, no softmax), in the
/// settings of the probability benches, and the float path it replaces (softmax, then sampling the
/// probabilities) for comparison.
fn logits_benches(b: &mut Bencher<'_>, rows: usize, vocab: usize) -> Result<()> {
    let d = b.device;
    let shape = RowShape { rows, vocab };
    let logits = d.upload(&logit_rows(rows, vocab, (rows * vocab) as u64))?;
    let temperature = d.upload(&vec![0.8f32; rows])?;
    let seed = d.upload(&(0..rows as u64).map(|r| r * 4 + 1).collect::<Vec<_>>())?;
    let mut tokens = d.alloc::<i32>(rows)?;
    let mut probs = d.alloc::<f32>(rows * vocab)?;
    for (k, p) in SAMPLE_SETTINGS {
        let (top_k, top_p) = (d.upload(&vec![k; rows])?, d.upload(&vec![p; rows])?);
        let params = SampleParams::new(shape);
        let op = logits_sample_line(k, p);
        if b.wants(&op) {
            let inputs =
                SampleInputs::new(Scores::logits(&logits, &temperature), &top_k, &top_p, &seed);
            b.measure_rows(op, &logits, (rows, vocab), &mut || {
                d.top_k_top_p_sample(&inputs, &mut tokens, &params)
            })?;
        }
        let op = softmax_sample_line(k, p);
        if b.wants(&op) {
            b.measure_rows(op, &logits, (rows, vocab), &mut || {
                let softmax = SoftmaxParams {
                    shape,
                    host_temperature: None,
                };
                d.softmax(&logits, &temperature, &mut probs, &softmax)?;
                let inputs = SampleInputs::new(Scores::Probs(&probs), &top_k, &top_p, &seed);
                d.top_k_top_p_sample(&inputs, &mut tokens, &params)
            })?;
        }
    }
    Ok(())
}

/// The lines of a shaped row kind over `[rows, vocab]` rows of it: sampling the probabilities,
/// sampling the logits (`docs/semantics.md` §4b) and the float path (softmax, then sampling the
/// probabilities) in every setting, and for [`FLOAT_OP_KINDS`] `softmax` and `accept_logprobs`.
/// Each line reports the median top-p 0.9 set size of the rows it samples.
fn kind_benches(b: &mut Bencher<'_>, rows: usize, vocab: usize, kind: &RowKind) -> Result<()> {
    if !kind_line_names(kind).iter().any(|name| b.wants(name)) {
        return Ok(());
    }
    let d = b.device;
    let t = kind.temperature;
    let shape = RowShape { rows, vocab };
    let raw = gaussian_rows(rows, vocab, (rows * vocab) as u64 + 11, kind.sigma);
    let host_logits = to_f32(&raw);
    let host_probs = softmax_rows(&raw, vocab, f64::from(t));
    drop(raw);
    let probs = d.upload(&host_probs)?;
    let logits = d.upload(&host_logits)?;
    let temperature = d.upload(&vec![t; rows])?;
    let seed = d.upload(&(0..rows as u64).map(|r| r * 4 + 1).collect::<Vec<_>>())?;
    let mut tokens = d.alloc::<i32>(rows)?;
    let mut softmaxed = d.alloc::<f32>(rows * vocab)?;
    let row = |values: &[f32], r: usize| values[r * vocab..(r + 1) * vocab].to_vec();
    let probs_kept = median_kept(rows, |r| {
        let weight = specula_backend_api::fixed_point::weight;
        row(&host_probs, r).into_iter().map(weight).collect()
    });
    let logits_kept = median_kept(rows, |r| {
        specula_backend_api::logit_weights::row_weights(&row(&host_logits, r), t)
    });
    let params = SampleParams::new(shape);
    for (k, p) in SAMPLE_SETTINGS {
        let (top_k, top_p) = (d.upload(&vec![k; rows])?, d.upload(&vec![p; rows])?);
        b.kept = Some(probs_kept);
        let op = tagged(&sample_line(k, p), kind);
        if b.wants(&op) {
            let inputs = SampleInputs::new(Scores::Probs(&probs), &top_k, &top_p, &seed);
            b.measure_rows(op, &probs, (rows, vocab), &mut || {
                d.top_k_top_p_sample(&inputs, &mut tokens, &params)
            })?;
        }
        b.kept = Some(logits_kept);
        let op = tagged(&logits_sample_line_at(k, p, t), kind);
        if d.capabilities().logits && b.wants(&op) {
            let scores = Scores::logits(&logits, &temperature);
            let inputs = SampleInputs::new(scores, &top_k, &top_p, &seed);
            b.measure_rows(op, &logits, (rows, vocab), &mut || {
                d.top_k_top_p_sample(&inputs, &mut tokens, &params)
            })?;
        }
        let op = tagged(&softmax_sample_line_at(k, p, t), kind);
        if b.wants(&op) {
            let softmax = SoftmaxParams {
                shape,
                host_temperature: None,
            };
            b.measure_rows(op, &logits, (rows, vocab), &mut || {
                d.softmax(&logits, &temperature, &mut softmaxed, &softmax)?;
                let inputs = SampleInputs::new(Scores::Probs(&softmaxed), &top_k, &top_p, &seed);
                d.top_k_top_p_sample(&inputs, &mut tokens, &params)
            })?;
        }
    }
    b.kept = None;
    if FLOAT_OP_KINDS.contains(&kind.tag) {
        let names = (
            tagged(&softmax_line_at(t), kind),
            tagged(&logprobs_line_at(t), kind),
        );
        float_lines(b, &logits, &temperature, shape, names)?;
    }
    Ok(())
}

/// Sharded sampling (`docs/semantics.md` §4d) of `[rows, vocab]` logits split evenly over
/// [`SHARD_RANKS`] ranks, each a thread of an in-process group with its slice on this device:
/// every rank's per-rank ops, the exchange and the host decisions, for the three sampling
/// settings. A call includes starting the ranks' threads; the bytes are the logits read.
fn sharded_benches(b: &mut Bencher<'_>, rows: usize, vocab: usize) -> Result<()> {
    use specula_backend_api::ops::VocabSlice;
    use specula_shard::{Group, HostRows, Partition, Shard, SliceRows, ThreadGroup};
    let d = b.device;
    let all = logit_rows(rows, vocab, (rows * vocab) as u64);
    let temperature = vec![0.8f32; rows];
    let seed: Vec<u64> = (0..rows as u64).map(|r| r * 4 + 1).collect();
    let slices: Vec<VocabSlice> = (0..SHARD_RANKS)
        .filter_map(|r| VocabSlice::even(vocab, SHARD_RANKS, r))
        .collect();
    if slices.len() != SHARD_RANKS {
        return Ok(());
    }
    let mut uploaded = Vec::new();
    for s in &slices {
        let cut: Vec<f32> = all
            .chunks(vocab)
            .flat_map(|r| r[s.first..s.first + s.len].to_vec())
            .collect();
        uploaded.push((d.upload(&cut)?, d.upload(&temperature)?));
    }
    // The floor: one read of the whole rows, as every rank's slices are read once.
    let whole = d.upload(&all)?;
    for (k, p) in SAMPLE_SETTINGS {
        let op = sharded_sample_line(k, p);
        if !b.wants(&op) {
            continue;
        }
        let (top_k, top_p) = (vec![k; rows], vec![p; rows]);
        let host = HostRows {
            top_k: &top_k,
            top_p: &top_p,
            seed: &seed,
            temperature: Some(&temperature),
            min_p: None,
        };
        b.measure_rows(op, &whole, (rows, vocab), &mut || {
            let members = ThreadGroup::new(SHARD_RANKS);
            std::thread::scope(|scope| {
                let ranks: Vec<_> = members
                    .into_iter()
                    .zip(&slices)
                    .zip(&uploaded)
                    .map(|((member, &slice), (logits, temperature))| {
                        scope.spawn(move || -> specula_shard::Result<Vec<i32>> {
                            let group = Group::new(member);
                            let partition = Partition::agree(&group, slice)?;
                            let shard = Shard {
                                device: d,
                                group: &group,
                                partition: &partition,
                            };
                            let rows = SliceRows::new(Scores::logits(logits, temperature));
                            specula_shard::top_k_top_p_sample(&shard, &rows, &host)
                        })
                    })
                    .collect();
                for rank in ranks {
                    let tokens = rank.join().map_err(|_| shard_failure("a rank panicked"))?;
                    tokens.map_err(|e| shard_failure(&e.to_string()))?;
                }
                Ok(())
            })
        })?;
    }
    Ok(())
}

/// A failed sharded bench call as a device execution error.
fn shard_failure(what: &str) -> specula_backend_api::Error {
    specula_backend_api::Error::Execution {
        backend: specula_backend_api::BackendKind::Cpu,
        what: "sharded_sample".to_owned(),
        source: what.to_owned().into(),
    }
}

/// The buffers of the unified step (TARGET_MATCH) over `slots` full decode slots of `s` tokens
/// ([`specula_reference::fixtures::step`]): the layout, the per-row parameters, the targets and
/// what verification emits, and the rows the next sampling call covers.
struct StepFixture {
    rows: usize,
    slots: StepSlots,
    out: StepRows,
}

impl StepFixture {
    /// `top_p` 0.9, `top_k` 50 and `temperature` per slot; 10 tokens generated per slot; drafts
    /// `(i · stride) mod V`.
    fn new(
        d: &dyn Device,
        shape: (usize, usize, usize),
        temperature: f32,
        stride: i32,
    ) -> Result<Self> {
        let slots = StepSlots::new(d, shape, temperature, stride)?;
        let out = StepRows::new(d, &slots)?;
        Ok(StepFixture {
            rows: slots.rows(),
            slots,
            out,
        })
    }

    /// `build_output_layout`, then `build_sampling_params`.
    fn plan(&mut self, d: &dyn Device) -> Result<()> {
        self.out.plan(d, &self.slots)
    }

    /// `verify_draft_tokens` of the drafts against the targets.
    fn verify(&mut self, d: &dyn Device) -> Result<()> {
        self.out.verify(d, &self.slots)
    }

    /// The TARGET_MATCH targets of the rows of `block` from `scores` (the block's rows: logits at
    /// the rows' temperatures when `logits`), with `fallback` when given. The per-row buffers
    /// read the block's window for the call and every row again after it.
    fn sample_block(
        &mut self,
        d: &dyn Device,
        (scores, logits): (&Buffer, bool),
        fallback: Option<&Buffer>,
        block: RowBlock,
    ) -> Result<()> {
        let per_row = |f: &mut Self, (first, rows): (usize, usize)| -> Result<()> {
            let o = &mut f.out;
            o.top_k.set_window(first, rows)?;
            o.top_p.set_window(first, rows)?;
            o.seed.set_window(first, rows)?;
            o.temperature.set_window(first, rows)?;
            o.targets.set_window(first, rows)?;
            Ok(())
        };
        per_row(self, (block.first, block.rows))?;
        let rows = std::mem::replace(&mut self.rows, block.rows);
        let done = self.sample(d, (scores, logits), fallback);
        self.rows = rows;
        per_row(self, (0, rows))?;
        done
    }

    /// The TARGET_MATCH targets from `scores` (logits at the rows' temperatures when `logits`),
    /// with `fallback` when given.
    fn sample(
        &mut self,
        d: &dyn Device,
        scores: (&Buffer, bool),
        fallback: Option<&Buffer>,
    ) -> Result<()> {
        self.sample_processed(d, scores, (fallback, None))
    }

    /// [`StepFixture::sample`], or with `tables` the fused sampling of the rows `process_logits`
    /// makes of them with those per-slot tables.
    fn sample_processed(
        &mut self,
        d: &dyn Device,
        (scores, logits): (&Buffer, bool),
        (fallback, tables): (Option<&Buffer>, Option<&ProcessingBench>),
    ) -> Result<()> {
        let (slots, o) = (&self.slots, &mut self.out);
        let history = (&slots.step_idx, &slots.drafts, &slots.end_tokens);
        let layout = OutputLayout {
            cu_seqlens_q_output: &o.cu_out,
            batch_id_per_token_output: &o.batch_id,
        };
        let processing = tables.map(|t| t.processing(layout, history, slots.dims));
        let scores = match logits {
            true => Scores::logits(scores, &o.temperature),
            false => Scores::Probs(scores),
        };
        let inputs = SampleInputs::new(scores, &o.top_k, &o.top_p, &o.seed).with_fallback(fallback);
        let params = SampleParams {
            shape: RowShape {
                rows: self.rows,
                vocab: slots.vocab,
            },
            host_top_p: None,
        };
        match &processing {
            Some(p) => d.top_k_top_p_sample_processed(&inputs, p, &mut o.targets, &params),
            None => d.top_k_top_p_sample(&inputs, &mut o.targets, &params),
        }
    }
}

/// The unified step of `slots` decode slots of `s` tokens over `vocab`, next to one read of its
/// scores: probabilities, or logits sampled at T = 0.8 (`docs/semantics.md` §4b) when
/// `from_logits`.
fn step_bench(
    b: &mut Bencher<'_>,
    slots: usize,
    s: usize,
    vocab: usize,
    from_logits: bool,
) -> Result<()> {
    let d = b.device;
    let rows = slots * s;
    let scores = if from_logits {
        d.upload(&logit_rows(rows, vocab, 7))?
    } else {
        d.upload(&probability_rows(rows, vocab, 7))?
    };
    let temperature = if from_logits { 0.8 } else { 1.0 };
    let mut f = StepFixture::new(d, (slots, s, vocab), temperature, 1)?;
    let shape = (slots, vocab, s);
    let bytes = (rows * vocab * 4) as u64;
    let mut step = || {
        f.plan(d)?;
        f.sample(d, (&scores, from_logits), None)?;
        f.verify(d)
    };
    if b.wants(&step_line(s, from_logits)) {
        let floor = Some(Floor::ReadAfter(&scores));
        b.measure(step_line(s, from_logits), shape, bytes, floor, &mut step)?;
    }
    let Some(clock) = b.clock.filter(|_| b.wants_graph(s, from_logits)) else {
        return Ok(());
    };
    // Run once (kernels built, scratch grown), then record the step and time its replays.
    step()?;
    d.synchronize()?;
    let captured = clock.capture(&mut step)?;
    let floor = Some(Floor::ReadAfter(&scores));
    let line = graph_step_line(s, from_logits);
    b.measure(line, shape, bytes, floor, &mut || captured.replay())
}

/// The per-slot state of the processed step: 200-token prompts and 10 generated tokens per slot,
/// penalties, min_p, min_tokens, 8 biases, 3 bad words and an allowed-token mask per slot, and a
/// runner bitmask per row.
struct ProcessingBench {
    token_ids_all: Buffer,
    prompt_lens: Buffer,
    token_counts: Buffer,
    prompt_mask: Buffer,
    tables: ProcessingTables,
    allowed: Buffer,
    bitmask: Buffer,
}

/// Prompt tokens of the processed step.
const BENCH_PROMPT: usize = 200;
/// Row length of `token_ids_all` in the processed step.
const BENCH_MODEL_LEN: usize = 256;

/// The rows the processed step processes and samples at a time: the device's row block
/// ([`Capabilities::row_block_bytes`](specula_backend_api::Capabilities::row_block_bytes), as
/// the sampler's Decoder does), or every row.
fn block_rows(d: &dyn Device, rows: usize, vocab: usize) -> usize {
    d.capabilities()
        .row_block_bytes
        .map_or(rows, |bytes| (bytes / (vocab * 4)).clamp(1, rows))
}

impl ProcessingBench {
    fn new(d: &dyn Device, slots: usize, rows: usize, vocab: usize) -> Result<Self> {
        let words = vocab.div_ceil(32);
        let history: Vec<i32> = (0..slots * BENCH_MODEL_LEN)
            .map(|i| ((i * 7919) % vocab) as i32)
            .collect();
        let mut counts = vec![0i32; slots * vocab];
        let mut prompt_mask = vec![0u32; slots * words];
        for b in 0..slots {
            let row = &history[b * BENCH_MODEL_LEN..(b + 1) * BENCH_MODEL_LEN];
            for &t in &row[..BENCH_PROMPT] {
                prompt_mask[b * words + t as usize / 32] |= 1 << (t % 32);
            }
            for &t in &row[BENCH_PROMPT..BENCH_PROMPT + 10] {
                counts[b * vocab + t as usize] += 1;
            }
        }
        let per_slot = |n: usize| (0..=slots).map(|b| (b * n) as i32).collect::<Vec<_>>();
        let bias_ids: Vec<i32> = (0..slots * 8)
            .map(|i| ((i * 104_729) % vocab) as i32)
            .collect();
        let bad_words: Vec<i32> = (0..slots)
            .flat_map(|b| {
                let t = |k: usize| ((b * 31 + k * 17) % vocab) as i32;
                [1, t(0), 2, t(1), t(2), 3, t(3), t(4), t(5)]
            })
            .collect();
        let mut bitmask = vec![u32::MAX; rows * words];
        for (i, w) in bitmask.iter_mut().enumerate() {
            *w ^= 1 << (i % 32);
        }
        Ok(ProcessingBench {
            token_ids_all: d.upload(&history)?,
            prompt_lens: d.upload(&vec![BENCH_PROMPT as i32; slots])?,
            token_counts: d.upload(&counts)?,
            prompt_mask: d.upload(&prompt_mask)?,
            tables: ProcessingTables {
                penalties: d.upload(&[1.2f32, 1.0 / 1.2, 0.5, 0.3, 0.05].repeat(slots))?,
                min_tokens: d.upload(&vec![12i32; slots])?,
                bias_offsets: d.upload(&per_slot(8))?,
                bias_ids: d.upload(&bias_ids)?,
                bias_values: d.upload(&vec![-1.5f32; slots * 8])?,
                bad_word_offsets: d.upload(&per_slot(9))?,
                bad_words: d.upload(&bad_words)?,
            },
            allowed: d.upload(&vec![0x7fff_ffffu32; slots * words])?,
            bitmask: d.upload(&bitmask)?,
        })
    }

    /// `process_logits` of `logits` over the rows of `block` of the step `f` planned, into
    /// `processed` and `fallback` (`block` rows).
    fn process(
        &self,
        (d, f): (&dyn Device, &StepFixture),
        logits: &Buffer,
        block: RowBlock,
        (processed, fallback): (&mut Buffer, &mut Buffer),
    ) -> Result<()> {
        let (slots, o) = (&f.slots, &f.out);
        processed.set_window(0, block.rows * slots.vocab)?;
        fallback.set_window(0, block.rows)?;
        let history = (&slots.step_idx, &slots.drafts, &slots.end_tokens);
        let processing = self.processing(o.layout(), history, slots.dims);
        let shape = RowShape {
            rows: f.rows,
            vocab: slots.vocab,
        };
        d.process_logits(
            &processing.inputs(Scores::logits(logits, &o.temperature)),
            &mut ProcessOutputs {
                processed,
                fallback,
            },
            &ProcessParams {
                block: Some(block),
                ..processing.params(shape)
            },
        )
    }

    /// The processing of the rows of a step: its layout, its `step_idx`, drafts and end tokens,
    /// its batch shape.
    fn processing<'a>(
        &'a self,
        layout: OutputLayout<'a>,
        (step_idx, drafts, end_tokens): (&'a Buffer, &'a Buffer, &'a Buffer),
        dims: BatchDims,
    ) -> RowProcessing<'a> {
        RowProcessing {
            layout,
            history: TokenHistory {
                token_ids_all: &self.token_ids_all,
                prompt_lens: &self.prompt_lens,
                step_idx,
                draft_tokens: drafts,
                token_counts: &self.token_counts,
                prompt_mask: &self.prompt_mask,
            },
            slots: self.tables.slots(end_tokens, Some(&self.allowed)),
            bitmask: Some(&self.bitmask),
            dims,
            max_model_len: BENCH_MODEL_LEN,
            host: None,
        }
    }
}

/// The unified step from logits at T = 0.8 with every parameter of `docs/semantics.md` §4c on:
/// the step of [`step_bench`] on the processed rows. A device with
/// [`Capabilities::fused_processing`](specula_backend_api::Capabilities::fused_processing) samples
/// the logits with the processing applied by the sampling op (one call, no processed rows); any
/// other runs `process_logits` then the sampling op a block of rows at a time, as the Decoder
/// runs it ([`block_rows`]).
fn processed_step_bench(
    b: &mut Bencher<'_>,
    (slots, s, vocab): (usize, usize, usize),
    paired: bool,
) -> Result<()> {
    let d = b.device;
    let rows = slots * s;
    let logits = d.upload(&logit_rows(rows, vocab, 7))?;
    let p = ProcessingBench::new(d, slots, rows, vocab)?;
    let block = block_rows(d, rows, vocab);
    let mut processed = d.alloc::<f32>(block * vocab)?;
    let mut fallback = d.alloc::<i32>(block)?;
    let mut f = StepFixture::new(d, (slots, s, vocab), 0.8, 13)?;
    let bytes = (rows * vocab * 4) as u64;
    let mut call = || {
        f.plan(d)?;
        if d.capabilities().fused_processing {
            // The sampling op processes the rows itself: no processed rows, no blocks.
            f.sample_processed(d, (&logits, true), (None, Some(&p)))?;
            return f.verify(d);
        }
        let block_rows = block_rows(d, rows, vocab);
        for first in (0..rows).step_by(block_rows) {
            let block = RowBlock {
                first,
                rows: block_rows.min(rows - first),
            };
            p.process((d, &f), &logits, block, (&mut processed, &mut fallback))?;
            f.sample_block(d, (&processed, true), Some(&fallback), block)?;
        }
        f.verify(d)
    };
    if !paired {
        let floor = Some(Floor::ReadAfter(&logits));
        return b.measure(
            processed_step_line(s),
            (slots, vocab, s),
            bytes,
            floor,
            &mut call,
        );
    }
    // The same step without processing, on the same logits, with its own fixture.
    let mut plain = StepFixture::new(d, (slots, s, vocab), 0.8, 13)?;
    let mut base = || {
        plain.plan(d)?;
        plain.sample(d, (&logits, true), None)?;
        plain.verify(d)
    };
    b.measure_paired(
        paired_step_line(s),
        (slots, vocab, s),
        bytes,
        &mut base,
        &mut call,
    )
}

/// `gather_next_token` of 64 slots × S = 6 rows of 8192 bf16, next to a copy of the same bytes.
fn gather_bench(b: &mut Bencher<'_>) -> Result<()> {
    let d = b.device;
    let (slots, s, hidden) = (64usize, 6usize, 8192usize);
    let rows = slots * s;
    let dims = full_batch(slots, s);
    let x: Vec<half::bf16> = (0..rows * hidden)
        .map(|i| half::bf16::from_bits((i * 2654435761) as u16))
        .collect();
    let x = d.upload(&x)?;
    let this_time = d.upload(&vec![s as i32; slots])?;
    let encoder = d.alloc::<i32>(slots)?;
    let cu: Vec<i32> = (0..=slots as i32).map(|b| b * s as i32).collect();
    let (cu_q, cu_out) = (d.upload(&cu)?, d.upload(&cu)?);
    let batch_id = d.upload(&(0..rows as i32).map(|t| t / s as i32).collect::<Vec<_>>())?;
    let mut out = d.alloc::<half::bf16>(rows * hidden)?;
    let mut copy = d.alloc::<half::bf16>(rows * hidden)?;
    let inputs = GatherInputs {
        hidden_states: &x,
        cu_seqlens_q: &cu_q,
        lens: SlotLens {
            seq_lens_this_time: &this_time,
            seq_lens_encoder: &encoder,
        },
        layout: OutputLayout {
            cu_seqlens_q_output: &cu_out,
            batch_id_per_token_output: &batch_id,
        },
    };
    let params = GatherParams {
        dims,
        token_num: rows,
        hidden,
        is_speculative: true,
        host: None,
    };
    let floor = (b.cpu.is_some() || b.clock.is_some()).then_some(Floor::Copy(&x, &mut copy));
    b.measure(
        GATHER_LINE.into(),
        (rows, hidden, s),
        (rows * hidden * 2) as u64,
        floor,
        &mut || d.gather_next_token(&inputs, &mut out, &params),
    )
}

/// The process's peak resident memory (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Plots median time against batch size for the 151936 vocabulary, one line per backend and op
/// (log-log), to an SVG file.
pub fn plot_svg(
    path: &std::path::Path,
    measurements: &[Measurement],
) -> std::result::Result<(), String> {
    use plotters::prelude::*;
    let points: Vec<&Measurement> = measurements
        .iter()
        .filter(|m| m.width == 151_936 && m.batch > 0 && m.kept.is_none() && !m.op.ends_with(']'))
        .collect();
    if points.is_empty() {
        return Err("no measurement at vocabulary 151936 to plot".to_owned());
    }
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for m in &points {
        let label = format!("{} {}", m.backend, m.op);
        let point = (m.batch as f64, m.median_s * 1e3);
        match series.iter_mut().find(|(l, _)| *l == label) {
            Some((_, v)) => v.push(point),
            None => series.push((label, vec![point])),
        }
    }
    let (x_max, y_min, y_max) =
        points
            .iter()
            .fold((1.0f64, f64::INFINITY, 0.0f64), |(x, lo, hi), m| {
                (
                    x.max(m.batch as f64),
                    lo.min(m.median_s * 1e3),
                    hi.max(m.median_s * 1e3),
                )
            });
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "specula bench: time per call vs batch (V = 151936)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (0.8f64..x_max * 1.25).log_scale(),
            (y_min * 0.8..y_max * 1.25).log_scale(),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("batch (rows, or slots for the step)")
        .y_desc("median ms per call")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (label, mut pts)) in series.into_iter().enumerate() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A device clock over the CPU backend: the op's "kernel" takes 3 µs, a floor read 1 µs;
    /// it counts what the bench asks of it.
    #[derive(Default)]
    struct FakeClock {
        floor_pending: Cell<bool>,
        floors: Cell<u32>,
        evictions: Cell<u32>,
        captures: Cell<u32>,
        replays: Rc<Cell<u32>>,
    }

    struct FakeReplay(Rc<Cell<u32>>);

    impl Replay for FakeReplay {
        fn replay(&self) -> Result<()> {
            self.0.set(self.0.get() + 1);
            Ok(())
        }
    }

    impl DeviceClock for FakeClock {
        fn start(&self) -> Result<()> {
            self.floor_pending.set(false);
            Ok(())
        }
        fn stop(&self) -> Result<()> {
            Ok(())
        }
        fn elapsed(&self) -> Result<f64> {
            Ok(if self.floor_pending.get() { 1e-6 } else { 3e-6 })
        }
        fn read_floor(&self, _buffer: &Buffer) -> Result<()> {
            self.floor_pending.set(true);
            self.floors.set(self.floors.get() + 1);
            Ok(())
        }
        fn evict(&self) -> Result<()> {
            self.evictions.set(self.evictions.get() + 1);
            Ok(())
        }
        fn capture<'s>(
            &'s self,
            step: &mut dyn FnMut() -> Result<()>,
        ) -> Result<Box<dyn Replay + 's>> {
            step()?;
            self.captures.set(self.captures.get() + 1);
            Ok(Box::new(FakeReplay(self.replays.clone())))
        }
    }

    fn options(graph: bool) -> BenchOptions {
        BenchOptions {
            warmup: 1,
            repeats: 3,
            cold: true,
            quick: false,
            ops: vec!["argmax".to_owned(), "step(target_match,S=1".to_owned()],
            graph,
            tiny: true,
        }
    }

    fn run_fake(clock: &FakeClock, graph: bool) -> Vec<Measurement> {
        let device: Arc<dyn Device> = Arc::new(CpuDevice::with_threads(1).expect("cpu"));
        run_on_device("fake", &device, clock, &options(graph), &mut |_| {}).expect("bench")
    }

    #[test]
    fn a_device_line_has_host_kernel_and_floor_times() {
        let clock = FakeClock::default();
        let lines = run_fake(&clock, false);
        let argmax: Vec<&Measurement> = lines.iter().filter(|m| m.op == "argmax").collect();
        assert_eq!(argmax.len(), 2, "batches 1 and 4");
        for m in lines.iter() {
            assert_eq!(m.kernel_median_s, Some(3e-6), "{}", m.op);
            assert_eq!(m.floor_median_s, Some(1e-6), "{}", m.op);
            assert_eq!(m.ratio, Some(3.0), "kernel over floor: {}", m.op);
            assert_eq!(m.floor_kind, Some("device read"));
            let host = m.host_median_s.expect("host time");
            assert!(
                host > 0.0 && host <= m.median_s,
                "host {host} within {}",
                m.median_s
            );
        }
        // Every line: 3 repetitions, each one floor read and two evictions (before the call and
        // before the floor).
        let n = lines.len() as u32;
        assert_eq!(clock.floors.get(), 3 * n);
        assert_eq!(clock.evictions.get(), 6 * n);
        assert!(lines.iter().all(|m| !m.op.contains("graph")));
        assert_eq!(clock.captures.get(), 0);
    }

    #[test]
    fn the_graph_option_times_replays_of_the_captured_step() {
        let clock = FakeClock::default();
        let lines = run_fake(&clock, true);
        let graphs: Vec<&str> = lines
            .iter()
            .filter(|m| m.op.contains("graph"))
            .map(|m| m.op.as_str())
            .collect();
        assert_eq!(
            graphs,
            [
                "step(target_match,S=1,graph)",
                "step(target_match,S=1,logits,T=0.8,graph)"
            ]
        );
        assert!(lines.iter().any(|m| m.op == "step(target_match,S=1)"));
        assert_eq!(clock.captures.get(), 2);
        // Warm-up 1 + 3 timed replays per captured line.
        assert_eq!(clock.replays.get(), 2 * 4);
        assert!(graphs.iter().all(|g| line_names().iter().any(|n| n == g)));
    }

    #[test]
    fn device_medians_take_each_time_apart() {
        let t = |host, kernel, floor| DeviceTimes {
            host,
            kernel,
            floor,
        };
        let m = device_medians(&[t(1.0, 9.0, 5.0), t(3.0, 7.0, 4.0), t(2.0, 8.0, 6.0)]);
        assert_eq!(m, t(2.0, 8.0, 5.0));
        assert!(device_medians(&[]).kernel.is_nan());
    }
}
