//! `specula`: runs the conformance suite on every backend available on this machine, replays a
//! saved case everywhere, and saves cases to files.
//!
//! ```text
//! specula run    [--backend all|cpu,wgpu,xpu-sim,cuda[:N],...] [--op OP,...|properties] [--quick]
//!                [--filter TEXT] [--json FILE]
//! specula replay FILE.safetensors [--backend ...] [--out OUT.safetensors]
//! specula dump   --op OP --case NAME --out FILE.safetensors
//! specula list   [--op OP,...] [--quick]
//! specula fuzz   [--seconds N] [--seed S] [--cases N] [--backend ...] [--out-dir DIR]
//! specula bench  [--backend ...] [--op OPS] [--quick] [--warm] [--warmup N] [--repeats N]
//!                [--graph] [--json FILE] [--plot FILE]
//! ```
//!
//! Exit status: 0 when everything that ran passed, 1 when a trial failed (or nothing ran), 2 for
//! bad input (unknown op or backend, missing or malformed file, a named backend unavailable), 3
//! when `replay` is given a case that every device rejects before running it (`rejected: <error>`,
//! naming the argument) and the file does not say it expects that rejection.
//!
//! Without a usable `XDG_RUNTIME_DIR` (a bare root shell, a container), the command makes a private
//! one (mode 0700, under the temporary directory) before anything else runs and removes it at
//! exit, so that the Vulkan loader does not print its complaint on stderr.

// The one exception is setting `XDG_RUNTIME_DIR` at the start of `main` (see `RuntimeDir`).
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use specula_backend_api::{BackendKind, Op};
use specula_conformance::backends::{self, Backend, BackendChoice};
use specula_conformance::cases::{self, Size};
use specula_conformance::report::{column_width, size_name};
use specula_conformance::suite::{self, CaseEntry, Outcome, PROPERTIES, Plan, Progress, Suite};
use specula_conformance::tensor::HostTensor;
use specula_conformance::{ConformanceError, replay};

/// The conformance suite of Specula: every op of every backend, held to the reference device.
#[derive(Debug, Parser)]
#[command(name = "specula", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every op and every end-to-end property on every available backend and print an
    /// op × backend table (full-size cases unless --quick).
    Run(RunArgs),
    /// Run one saved case on each backend, compare with the reference device, and write the outputs.
    Replay(ReplayArgs),
    /// Save a generated case to a safetensors case file.
    Dump(DumpArgs),
    /// List the backends (with why each is unavailable) and the cases of each op.
    List(ListArgs),
    /// Mutate small cases with hostile device contents and run them on every available backend
    /// against the reference device, then random memory operations, for a bounded time; prints
    /// the throughput, saves any failing case as a replay file.
    Fuzz(FuzzArgs),
    /// Time each op on each backend next to the memory floor (one streaming read of the same
    /// input on the same threads, CPU backend; on a CUDA device the kernel time of the call and
    /// of one read of the same input by a kernel) and print the ratios.
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// `all`, or a comma-separated list of backends, optionally with device numbers (`wgpu:1`;
    /// default: the CPU).
    #[arg(long, default_value = "cpu", value_name = "BACKENDS", value_parser = parse_backends)]
    backend: Selection,
    /// Only lines whose op name contains one of these (comma-separated; e.g. `argmax,step`; a
    /// comma inside parentheses or brackets belongs to the name, so a whole line name such as
    /// `top_k_top_p_sample(k=0,p=0.9)` selects its lines). A value that is part of no line's
    /// name is an error.
    #[arg(long, value_name = "OPS", value_parser = parse_bench_ops)]
    op: Vec<BenchOps>,
    /// Only the 151936 vocabulary at batches 1 and 64.
    #[arg(long)]
    quick: bool,
    /// Keep the caches warm between repetitions (the default evicts them).
    #[arg(long)]
    warm: bool,
    /// Untimed calls before measuring.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed calls per shape.
    #[arg(long, default_value_t = 15)]
    repeats: usize,
    /// Also time the unified step captured once as a CUDA graph and replayed (CUDA devices).
    #[arg(long)]
    graph: bool,
    /// Also write the measurements as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also plot time against batch size (vocabulary 151936) to this SVG file.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// `all`, or a comma-separated list of cpu, wgpu, xpu-sim, cuda, each optionally with a device
    /// number (`xpu-sim:1`; 0 by default). A backend named here that is unavailable (or has no
    /// such device) is an error; with `all` it is reported as skipped.
    #[arg(long, default_value = "all", value_name = "BACKENDS", value_parser = parse_backends)]
    backend: Selection,
    /// Comma-separated op names (and/or `properties`); all by default.
    #[arg(long, value_name = "OPS", value_parser = parse_ops)]
    op: Option<OpSelection>,
    /// Small cases only (CI, software devices); the default is the full-size suite.
    #[arg(long)]
    quick: bool,
    /// Only trials whose name contains this text.
    #[arg(long, value_name = "TEXT")]
    filter: Option<String>,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct FuzzArgs {
    /// Time budget in seconds (half for op cases, half for memory operations).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    seconds: f64,
    /// The seed every mutation derives from.
    #[arg(long, default_value_t = 1, value_name = "SEED")]
    seed: u64,
    /// Stop the op phase after this many cases.
    #[arg(long, value_name = "N")]
    cases: Option<usize>,
    /// `all`, or a comma-separated list of backends, optionally with device numbers (`wgpu:1`).
    #[arg(long, default_value = "all", value_name = "BACKENDS", value_parser = parse_backends)]
    backend: Selection,
    /// Where failing cases are saved (default `target/fuzz-failures`).
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// The case file (safetensors; see docs/conformance.md).
    file: PathBuf,
    /// `all`, or a comma-separated list of backends, optionally with device numbers (`wgpu:1`).
    #[arg(long, default_value = "all", value_name = "BACKENDS", value_parser = parse_backends)]
    backend: Selection,
    /// Write the case, the expected outputs and every backend's outputs to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct DumpArgs {
    /// The op of the case.
    #[arg(long, value_parser = parse_op)]
    op: Op,
    /// The case name (as in `specula list`, without the op).
    #[arg(long, value_name = "NAME")]
    case: String,
    /// The file to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Comma-separated op names; all by default.
    #[arg(long, value_name = "OPS", value_parser = parse_ops)]
    op: Option<OpSelection>,
    /// List the quick cases instead of the full-size ones.
    #[arg(long)]
    quick: bool,
}

/// The backend devices named by `--backend`; `None` is `all`.
#[derive(Clone, Debug)]
struct Selection(Option<Vec<BackendChoice>>);

#[derive(Clone, Debug)]
struct OpSelection {
    ops: Vec<Op>,
    properties: bool,
}

fn parse_backends(value: &str) -> Result<Selection, String> {
    backends::parse_backend_list(value)
        .map(Selection)
        .map_err(|e| e.to_string())
}

fn op_names() -> String {
    Op::ALL.map(Op::name).join(", ")
}

fn parse_op(value: &str) -> Result<Op, String> {
    value.trim().parse::<Op>().map_err(|_| {
        format!(
            "unknown op `{}` (expected one of: {})",
            value.trim(),
            op_names()
        )
    })
}

/// One `--op` value of `bench`: it must be part of the name of some bench line.
/// The parts of bench line names `--op` selects.
#[derive(Clone, Debug)]
struct BenchOps(Vec<String>);

/// `--op`'s value: its parts split at the commas outside parentheses and brackets (a line name
/// such as `step(target_match,S=6)` is one part), each checked by [`parse_bench_op`].
fn parse_bench_ops(value: &str) -> Result<BenchOps, String> {
    split_outside_brackets(value)
        .into_iter()
        .map(parse_bench_op)
        .collect::<Result<_, _>>()
        .map(BenchOps)
}

/// `value` split at the commas at bracket depth 0 (`(` `[` open, `)` `]` close).
fn split_outside_brackets(value: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in value.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&value[start..]);
    parts
}

fn parse_bench_op(value: &str) -> Result<String, String> {
    let op = value.trim();
    if op.is_empty() {
        return Err(format!(
            "empty bench op (expected some of: {})",
            specula_conformance::bench::op_names().join(", ")
        ));
    }
    if specula_conformance::bench::matches_some_line(op) {
        return Ok(op.to_owned());
    }
    Err(format!(
        "unknown bench op `{op}` (expected a part of a line name; the ops are: {})",
        specula_conformance::bench::op_names().join(", ")
    ))
}

fn parse_ops(value: &str) -> Result<OpSelection, String> {
    let mut selection = OpSelection {
        ops: Vec::new(),
        properties: false,
    };
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name == PROPERTIES {
            selection.properties = true;
            continue;
        }
        let op = name.parse::<Op>().map_err(|_| {
            format!(
                "unknown op `{name}` (expected one of: {}, {PROPERTIES})",
                op_names()
            )
        })?;
        if !selection.ops.contains(&op) {
            selection.ops.push(op);
        }
    }
    if selection.ops.is_empty() && !selection.properties {
        return Err(format!("empty op list (expected some of: {})", op_names()));
    }
    Ok(selection)
}

/// A failure of the command itself (bad input), printed as one line, exit status 2.
struct CliError(String);

impl From<ConformanceError> for CliError {
    fn from(e: ConformanceError) -> Self {
        CliError(e.to_string())
    }
}

/// Probes the selected backends; a backend named explicitly must be available.
fn open_backends(selection: &Selection) -> Result<Vec<Backend>, CliError> {
    match &selection.0 {
        None => Ok(backends::probe_all()),
        Some(choices) => {
            let probed = backends::probe_selected(choices);
            if let Some(b) = probed.iter().find(|b| b.device().is_none()) {
                return Err(CliError(format!(
                    "backend {} is unavailable: {}",
                    b.name,
                    b.skip_reason().unwrap_or("no device")
                )));
            }
            Ok(probed)
        }
    }
}

fn fuzz(args: FuzzArgs) -> Result<ExitCode, CliError> {
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err(CliError(format!(
            "--seconds must be a positive number, got {}",
            args.seconds
        )));
    }
    let backends = open_backends(&args.backend)?;
    let suite = Suite::new(backends, Size::Quick)?;
    println!(
        "specula fuzz: seed {}, {} s, on {} against the reference",
        args.seed,
        args.seconds,
        backends::available_names(&suite.backends)
    );
    let config = specula_conformance::fuzz::FuzzConfig {
        seed: args.seed,
        budget: std::time::Duration::from_secs_f64(args.seconds),
        max_cases: args.cases,
        out_dir: args
            .out_dir
            .unwrap_or_else(specula_conformance::fuzz::default_out_dir),
    };
    let report = specula_conformance::fuzz::run(&suite, &config);
    print!("{}", report.render());
    if report.failures.is_empty() {
        println!("PASS: nothing found");
        return Ok(ExitCode::SUCCESS);
    }
    for failure in report.failures.iter().take(20) {
        println!("  {failure}");
    }
    println!("FAIL: {} failure(s)", report.failures.len());
    Ok(ExitCode::from(1))
}

fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    let size = if args.quick { Size::Quick } else { Size::Full };
    let backends = open_backends(&args.backend)?;
    let required = backends::required_from_env()?;
    let plan = match args.op {
        None => Plan::everything(),
        Some(selection) => Plan {
            ops: selection.ops,
            properties: selection.properties,
            filter: None,
        },
    };
    let plan = Plan {
        filter: args.filter,
        ..plan
    };
    eprintln!(
        "specula run: {} cases on {}",
        size_name(size),
        backends::available_names(&backends)
    );
    let suite = Suite::new(backends, size)?.with_required(required);
    let bar = ProgressBar::new(0);
    // The current trial's start, for its elapsed time on the bar.
    let trial_start = std::sync::Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
    let trial_clock = trial_start.clone();
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} [{trial_elapsed}] {wide_msg}",
    )
    .map(|style| {
        style.with_key(
            "trial_elapsed",
            move |_: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let elapsed = trial_clock
                    .lock()
                    .map_or(std::time::Duration::ZERO, |start| start.elapsed());
                let _ = write!(w, "{:>5.1} s", elapsed.as_secs_f64());
            },
        )
    })
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    // On a terminal the total is counted first (one generation of the cases, one op at a time),
    // so the bar's length is right from the start; elsewhere the bar is hidden and not counted.
    // The steady tick keeps the clocks moving through a long trial.
    let counted = !bar.is_hidden();
    if counted {
        let counting = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(counting);
        bar.set_message("counting the trials (generating the cases once)");
        bar.enable_steady_tick(std::time::Duration::from_millis(250));
        bar.set_length(suite.count_trials(&plan) as u64);
    }
    bar.set_style(style);
    let report = suite.run_plan(&plan, &mut |progress| match progress {
        Progress::Planned(n) if !counted => bar.inc_length(n as u64),
        Progress::Planned(_) => {}
        Progress::Started(trial) => {
            if let Ok(mut start) = trial_start.lock() {
                *start = std::time::Instant::now();
            }
            bar.set_message(trial.name());
        }
        Progress::Finished(result) => {
            if let Outcome::Failed(message) = &result.outcome {
                bar.println(format!("FAILED {}: {message}", result.name));
            }
            bar.inc(1);
        }
    });
    bar.finish_and_clear();
    print!("{}", report.render());
    if let Some(path) = &args.json {
        report.write_json(path)?;
        println!("report written to {}", path.display());
    }
    Ok(match report.passed() {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(1),
    })
}

fn replay_case(args: ReplayArgs) -> Result<ExitCode, CliError> {
    let case = replay::load(&args.file)?;
    let backends = open_backends(&args.backend)?;
    let suite = Suite::new(backends, Size::Quick)?;
    let entry = CaseEntry::new(case);
    let case = &entry.case;
    println!(
        "case {} (op {}, {} input tensors), expected outputs: {}",
        case.name,
        case.op(),
        case.inputs.len(),
        match case.expected {
            Some(_) => "golden, from the file",
            None if case.expected_error.is_some() => "a rejection on every device",
            None => "the reference device's",
        }
    );
    if let Some(message) = entry.malformed(suite.reference.as_ref()) {
        return Err(CliError(format!("{}: {message}", args.file.display())));
    }
    if let Some(message) = entry.unexpected_rejection(suite.reference.as_ref()) {
        println!("{message}");
        return Ok(ExitCode::from(3));
    }
    let reference = entry.reference_outputs(suite.reference.as_ref());
    if let Err(message) = &reference {
        println!("reference: {message}");
    }
    let width = column_width(suite.backends.iter().map(|b| b.name.as_str()));
    let mut outputs = std::collections::BTreeMap::<String, HostTensor>::new();
    let (mut passed, mut failed) = (0, 0);
    for backend in &suite.backends {
        let Some(device) = backend.device() else {
            println!(
                "  {:width$}  skipped: {}",
                backend.name,
                backend.skip_reason().unwrap_or("unavailable")
            );
            continue;
        };
        let (outcome, produced) = suite.check_case(device.as_ref(), &entry);
        match &outcome {
            Outcome::Passed => {
                passed += 1;
                println!("  {:width$}  passed", backend.name);
            }
            Outcome::Failed(message) | Outcome::Skipped(message) => {
                failed += 1;
                println!("  {:width$}  FAILED: {message}", backend.name);
            }
        }
        for (name, tensor) in produced.map(|o| o.tensors).unwrap_or_default() {
            outputs.insert(
                format!("{}{}.{name}", replay::OUTPUT_PREFIX, backend.name),
                tensor,
            );
        }
    }
    if let Some(out) = &args.out {
        let mut saved = case.clone();
        if saved.expected.is_none()
            && let Ok(expected) = &reference
        {
            saved.expected = Some((*expected).clone());
        }
        replay::save_with(out, &saved, &outputs)?;
        println!("outputs written to {}", out.display());
    }
    if failed > 0 {
        println!("FAIL: {failed} backend(s) differ from the reference");
        Ok(ExitCode::from(1))
    } else if passed == 0 {
        println!("FAIL: no backend ran the case");
        Ok(ExitCode::from(1))
    } else {
        println!("PASS: {passed} backend(s) match the reference");
        Ok(ExitCode::SUCCESS)
    }
}

fn dump(args: DumpArgs) -> Result<ExitCode, CliError> {
    let find = |size| {
        cases::cases(args.op, size)
            .into_iter()
            .find(|c| c.name == args.case)
    };
    let case = find(Size::Quick)
        .or_else(|| find(Size::Full))
        .ok_or_else(|| {
            CliError(format!(
                "op {} has no case named `{}` (see `specula list --op {}`)",
                args.op, args.case, args.op
            ))
        })?;
    replay::save(&args.out, &case)?;
    println!(
        "wrote {}::{} ({} input tensors{}) to {}",
        args.op,
        case.name,
        case.inputs.len(),
        if case.expected.is_some() {
            ", golden outputs"
        } else {
            ""
        },
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn list(args: ListArgs) -> Result<ExitCode, CliError> {
    let size = if args.quick { Size::Quick } else { Size::Full };
    println!("backends:");
    for backend in backends::probe_all() {
        println!("  {:8} {}", backend.name, backend.describe());
    }
    let selection = args.op.unwrap_or(OpSelection {
        ops: Op::ALL.to_vec(),
        properties: true,
    });
    for op in selection.ops {
        let cases = cases::cases(op, size);
        println!("\n{op} ({} {} cases):", cases.len(), size_name(size));
        for case in cases {
            println!("  {op}::{}", case.name);
        }
    }
    if selection.properties {
        let properties = specula_conformance::properties::properties();
        println!("\n{PROPERTIES} ({}):", properties.len());
        for property in properties {
            println!("  {PROPERTIES}::{}", property.name);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn bench(args: BenchArgs) -> Result<ExitCode, CliError> {
    use specula_conformance::bench::{self, BenchOptions, Measurement};
    let options = BenchOptions {
        warmup: args.warmup,
        repeats: args.repeats,
        cold: !args.warm,
        quick: args.quick,
        ops: args.op.iter().flat_map(|o| o.0.iter().cloned()).collect(),
        graph: args.graph,
        tiny: false,
    };
    let choices: Vec<BackendChoice> = args
        .backend
        .0
        .clone()
        .unwrap_or_else(|| BackendKind::ALL.map(BackendChoice::first).to_vec());
    let mut all: Vec<Measurement> = Vec::new();
    println!(
        "specula bench: {} caches, {} warm-up + {} timed calls per shape; floor = one streaming read of the same input on the same threads (memcpy for gather; for processed/plain, the step without processing timed in alternation, the ratio the median of the pairs' ratios); kept = median size of the rows' top-p 0.9 set (shaped rows)",
        if options.cold { "cold" } else { "warm" },
        options.warmup,
        options.repeats
    );
    println!(
        "on a CUDA device: host = until the call returns, kernel = CUDA events around it, floor = the kernel time of one read of the same input, ratio = kernel / floor; median = end to end (the call and a synchronisation)"
    );
    println!(
        "{:<8} {:<44} {:>6} {:>7} {:>2} {:>11} {:>11} {:>8} {:>11} {:>7} {:>7} {:>10} {:>10}",
        "backend",
        "op",
        "batch",
        "width",
        "S",
        "median",
        "min",
        "GB/s",
        "floor",
        "ratio",
        "kept",
        "host",
        "kernel"
    );
    let micros = |s: Option<f64>| s.map_or("-".to_owned(), |s| format!("{:.1} us", s * 1e6));
    let mut print = |m: &Measurement| {
        let ratio = m.ratio.map_or("-".to_owned(), |r| format!("{r:.2}x"));
        let kept = m.kept.map_or("-".to_owned(), |k| k.to_string());
        println!(
            "{:<8} {:<44} {:>6} {:>7} {:>2} {:>8.1} us {:>8.1} us {:>8.2} {:>11} {:>7} {:>7} {:>10} {:>10}",
            m.backend,
            m.op,
            m.batch,
            m.width,
            m.step_tokens,
            m.median_s * 1e6,
            m.min_s * 1e6,
            m.gbps,
            micros(m.floor_median_s),
            ratio,
            kept,
            micros(m.host_median_s),
            micros(m.kernel_median_s)
        );
    };
    for choice in choices {
        let name = choice.name();
        if choice == BackendChoice::first(BackendKind::Cpu) {
            let cpu = std::sync::Arc::new(
                specula_backend_cpu::CpuDevice::new().map_err(|e| CliError(e.to_string()))?,
            );
            let device: std::sync::Arc<dyn specula_backend_api::Device> = cpu.clone();
            all.extend(
                bench::run("cpu", &device, Some(&cpu), &options, &mut print)
                    .map_err(|e| CliError(e.to_string()))?,
            );
            continue;
        }
        #[cfg(feature = "cuda")]
        if choice.kind == BackendKind::Cuda {
            match specula_backend_cuda::CudaDevice::new(choice.ordinal) {
                Ok(cuda) => all.extend(cuda_bench(&name, cuda, &options, &mut print)?),
                Err(e) if args.backend.0.is_none() => println!("{name}: skipped ({e})"),
                Err(e) => return Err(CliError(format!("backend {name} is unavailable: {e}"))),
            }
            continue;
        }
        match specula_sampler::registry::open_kind(choice.kind, choice.ordinal) {
            Ok(device) => all.extend(
                bench::run(&name, &device, None, &options, &mut print)
                    .map_err(|e| CliError(e.to_string()))?,
            ),
            Err(e) if args.backend.0.is_none() => println!("{name}: skipped ({e})"),
            Err(e) => return Err(CliError(format!("backend {name} is unavailable: {e}"))),
        }
    }
    if let Some(peak) = bench::peak_rss_bytes() {
        println!(
            "peak resident memory: {:.1} MiB",
            peak as f64 / (1 << 20) as f64
        );
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&all).map_err(|e| CliError(e.to_string()))?;
        std::fs::write(path, json).map_err(|e| CliError(format!("{}: {e}", path.display())))?;
    }
    if let Some(path) = &args.plot {
        bench::plot_svg(path, &all).map_err(|e| CliError(format!("{}: {e}", path.display())))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `specula bench` on an opened CUDA device, with its device clock (kernel times, the device
/// read floor, captured steps).
#[cfg(feature = "cuda")]
fn cuda_bench(
    name: &str,
    cuda: specula_backend_cuda::CudaDevice,
    options: &specula_conformance::bench::BenchOptions,
    print: &mut dyn FnMut(&specula_conformance::bench::Measurement),
) -> Result<Vec<specula_conformance::bench::Measurement>, CliError> {
    use specula_conformance::cuda_clock::CudaClock;
    let cuda = std::sync::Arc::new(cuda);
    let clock = CudaClock::new(cuda.clone()).map_err(|e| CliError(e.to_string()))?;
    let device: std::sync::Arc<dyn specula_backend_api::Device> = cuda;
    specula_conformance::bench::run_on_device(name, &device, &clock, options, print)
        .map_err(|e| CliError(e.to_string()))
}

/// The environment variable the Vulkan loader (and Wayland) want to name a private directory.
const RUNTIME_DIR_VAR: &str = "XDG_RUNTIME_DIR";

/// A private `XDG_RUNTIME_DIR` this process made for itself because the variable was unset or did
/// not name a directory; removed when dropped (at the end of `main`). `None` when the environment
/// already had a usable one, or when none could be made (the loader then only complains).
struct RuntimeDir(Option<PathBuf>);

impl RuntimeDir {
    /// Makes and exports a private runtime directory if `XDG_RUNTIME_DIR` is unset, empty or not a
    /// directory. Must run before any other thread starts.
    #[cfg(unix)]
    #[allow(unsafe_code)]
    fn ensure() -> Self {
        use std::os::unix::fs::DirBuilderExt;
        let usable = std::env::var_os(RUNTIME_DIR_VAR)
            .is_some_and(|dir| !dir.is_empty() && std::path::Path::new(&dir).is_dir());
        if usable {
            return RuntimeDir(None);
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for attempt in 0..16u32 {
            let dir = std::env::temp_dir().join(format!(
                "specula-runtime-{}-{nanos:x}-{attempt}",
                std::process::id()
            ));
            // `create` (not `create_all`) fails if the path exists, so a directory or link someone
            // else placed there is never adopted.
            if std::fs::DirBuilder::new().mode(0o700).create(&dir).is_ok() {
                // SAFETY: this is the first statement of `main`: no other thread exists yet (no
                // backend is opened, no progress bar or pool started), so nothing reads or writes
                // the environment concurrently.
                unsafe { std::env::set_var(RUNTIME_DIR_VAR, &dir) };
                return RuntimeDir(Some(dir));
            }
        }
        RuntimeDir(None)
    }

    /// Nothing to do where there is no `XDG_RUNTIME_DIR` convention.
    #[cfg(not(unix))]
    fn ensure() -> Self {
        RuntimeDir(None)
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn main() -> ExitCode {
    // First, while this is the only thread: a runtime directory for the Vulkan loader.
    let _runtime_dir = RuntimeDir::ensure();
    // Panics inside trials are caught and reported as failures; anything else is reported below
    // as one line. Either way: no panic message and no backtrace on the terminal.
    std::panic::set_hook(Box::new(|_| {}));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            return match error.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = error.print();
                    ExitCode::SUCCESS
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = error.print();
                    ExitCode::from(2)
                }
                _ => {
                    let rendered = error.to_string();
                    let first = rendered.lines().next().unwrap_or("error: bad arguments");
                    eprintln!("{first} (see `specula --help`)");
                    ExitCode::from(2)
                }
            };
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let result = suite::catch(|| match cli.command {
        Command::Run(args) => run(args),
        Command::Replay(args) => replay_case(args),
        Command::Dump(args) => dump(args),
        Command::List(args) => list(args),
        Command::Bench(args) => bench(args),
        Command::Fuzz(args) => fuzz(args),
    });
    match result {
        Ok(Ok(code)) => code,
        Ok(Err(CliError(message))) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(panic) => {
            eprintln!("error: internal error: {panic}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_outside_brackets;

    #[test]
    fn bench_ops_split_at_commas_outside_brackets() {
        assert_eq!(split_outside_brackets("argmax,step"), ["argmax", "step"]);
        assert_eq!(
            split_outside_brackets("top_k_top_p_sample(k=0,p=0.9)[flat],step(target_match,S=6)"),
            [
                "top_k_top_p_sample(k=0,p=0.9)[flat]",
                "step(target_match,S=6)"
            ]
        );
        assert_eq!(split_outside_brackets(""), [""]);
        assert_eq!(split_outside_brackets("a),b"), ["a)", "b"]);
    }
}
