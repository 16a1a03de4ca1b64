//! `nvrtc-check`: compiles every CUDA kernel of the backend with NVRTC, with exactly the options
//! the runtime uses, for each requested architecture; no GPU is needed. The benchmarks' read-floor
//! kernel (`kernels/read_floor.cu`, not an op) is checked the same way.
//!
//! ```text
//! cargo run -p specula-backend-cuda --bin nvrtc-check -- --arch sm_80,sm_90 [--ptxas PATH]
//! ```
//!
//! Each source holds the file's argument structs, generated from their Rust declarations with
//! `static_assert`s of their size, alignment and field sizes (fields in Rust's order, no padding:
//! the offsets agree too), so a struct whose CUDA layout differs from the Rust one fails to
//! compile here.
//!
//! Any compile error or any warning in NVRTC's log fails the run (exit 1), and so does an entry
//! point of the file's [`KernelFile::entry_stems`] missing from the PTX of an instance (the
//! device's warm-up loads every one, `kernels::warm_up_plan`). With `--ptxas`, the PTX
//! of each instance is also assembled with `ptxas -v` and the registers, spills, shared memory and
//! stack of every entry point are printed (a ptxas failure fails the run). When libnvrtc cannot be
//! loaded the tool says so and exits with 2.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use specula_backend_cuda::kernels::{self, KernelFile, compile_options};
use specula_backend_cuda::nvrtc;

struct Args {
    archs: Vec<String>,
    ptxas: Option<PathBuf>,
    only: Option<String>,
    jobs: usize,
}

fn usage() -> &'static str {
    "usage: nvrtc-check [--arch sm_80,sm_90] [--ptxas PATH] [--only FILE_STEM] [--jobs N]"
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        archs: vec!["sm_80".to_owned(), "sm_90".to_owned()],
        ptxas: None,
        only: None,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--arch" => {
                args.archs = value("--arch")?
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect();
            }
            "--ptxas" => args.ptxas = Some(PathBuf::from(value("--ptxas")?)),
            "--only" => args.only = Some(value("--only")?),
            "--jobs" => {
                args.jobs = value("--jobs")?
                    .parse::<usize>()
                    .map_err(|e| format!("--jobs: {e}"))?
                    .max(1);
            }
            "-h" | "--help" => return Err(usage().to_owned()),
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    for arch in &args.archs {
        let ok = arch
            .strip_prefix("sm_")
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if !ok {
            return Err(format!(
                "--arch takes real architectures like sm_90, got {arch}"
            ));
        }
    }
    Ok(args)
}

/// Registers, spills and memory of one entry point, from `ptxas -v`.
#[derive(Default)]
struct Usage {
    function: String,
    registers: String,
    spill_stores: String,
    spill_loads: String,
    stack: String,
    smem: String,
}

fn parse_ptxas(log: &str) -> Vec<Usage> {
    let mut out: Vec<Usage> = Vec::new();
    for line in log.lines() {
        let line = line.trim();
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_owned();
            out.push(Usage {
                function: name,
                ..Usage::default()
            });
            continue;
        }
        let Some(current) = out.last_mut() else {
            continue;
        };
        if line.contains("bytes stack frame") {
            let nums: Vec<&str> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .collect();
            if nums.len() >= 3 {
                current.stack = nums[0].to_owned();
                current.spill_stores = nums[1].to_owned();
                current.spill_loads = nums[2].to_owned();
            }
        } else if let Some(rest) = line.split("Used ").nth(1) {
            current.registers = rest.split(' ').next().unwrap_or("").to_owned();
            if let Some(smem) = line.split(", ").find(|part| part.ends_with("bytes smem")) {
                current.smem = smem.trim_end_matches(" bytes smem").to_owned();
            }
        }
    }
    out
}

fn run_ptxas(ptxas: &PathBuf, arch: &str, ptx: &str, tag: &str) -> Result<Vec<Usage>, String> {
    let dir = std::env::temp_dir().join(format!("specula-nvrtc-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let ptx_path = dir.join(format!("{tag}.ptx"));
    let cubin_path = dir.join(format!("{tag}.cubin"));
    std::fs::write(&ptx_path, ptx)
        .map_err(|e| format!("cannot write {}: {e}", ptx_path.display()))?;
    let output = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg("-o")
        .arg(&cubin_path)
        .arg(&ptx_path)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_file(&ptx_path);
    let _ = std::fs::remove_file(&cubin_path);
    if !output.status.success() {
        return Err(log);
    }
    Ok(parse_ptxas(&log))
}

/// Compiles one instance (and assembles it with ptxas when asked); returns success and a report.
/// The entry points of `file`'s instance that the PTX does not define (`.entry <name>(`).
fn missing_entries(
    file: KernelFile,
    instance: &specula_backend_cuda::kernels::Instance,
    ptx: &str,
) -> Vec<String> {
    file.entry_stems()
        .iter()
        .map(|stem| instance.entry(stem))
        .filter(|entry| !ptx.contains(&format!(".entry {entry}(")))
        .collect()
}

fn check(
    arch: &str,
    file: KernelFile,
    instance: &specula_backend_cuda::kernels::Instance,
    ptxas: Option<&PathBuf>,
) -> (bool, String) {
    let stem = file.op().name();
    let tag = if instance.target == instance.draft || file != KernelFile::VerifyDraftTokens {
        instance.suffix.name().to_owned()
    } else {
        format!("{}+{}", instance.target.name(), instance.draft.name())
    };
    let label = format!("{arch} {} [{tag}]", file.file_name());
    let options = compile_options(instance, arch);
    let t0 = Instant::now();
    let out = match nvrtc::compile(&file.source(), &file.file_name(), &options) {
        Err(e) => {
            let log = match &e {
                specula_backend_cuda::CudaError::Compile { log, .. } => log.clone(),
                other => other.to_string(),
            };
            return (false, format!("FAIL {label}\n{log}\n"));
        }
        Ok(out) => out,
    };
    if nvrtc::log_has_warning(&out.log) {
        return (false, format!("FAIL {label} (warnings)\n{}\n", out.log));
    }
    let missing = missing_entries(file, instance, &nvrtc::ptx_text(&out.ptx));
    if !missing.is_empty() {
        return (
            false,
            format!("FAIL {label}: entry points missing from the PTX: {missing:?}\n"),
        );
    }
    let size = match &out.image {
        nvrtc::Image::Cubin(c) => c.len(),
        nvrtc::Image::Ptx(p) => p.len(),
    };
    let mut report = format!(
        "ok   {label}: {size} bytes of SASS in {} ms\n",
        t0.elapsed().as_millis()
    );
    let Some(ptxas) = ptxas else {
        return (true, report);
    };
    let ptx = nvrtc::ptx_text(&out.ptx);
    let file_tag = format!("{stem}_{}_{arch}", tag.replace('+', "_"));
    match run_ptxas(ptxas, arch, &ptx, &file_tag) {
        Err(log) => (false, format!("{report}FAIL ptxas {label}\n{log}\n")),
        Ok(usages) => {
            for u in usages {
                report += &format!(
                    "     {:<48} regs {:>3}  spill st/ld {:>4}/{:<4} stack {:>4}  smem {:>6}\n",
                    u.function, u.registers, u.spill_stores, u.spill_loads, u.stack, u.smem
                );
            }
            (true, report)
        }
    }
}

/// Compiles the read-floor kernel of the benchmarks for `arch` (and assembles it with ptxas when
/// asked), as [`check`] does an op's instance.
fn check_floor(arch: &str, ptxas: Option<&PathBuf>) -> (bool, String) {
    let label = format!("{arch} read_floor.cu");
    let out = match nvrtc::compile(
        &kernels::read_floor_source(),
        "read_floor.cu",
        &kernels::floor_options(arch),
    ) {
        Err(e) => return (false, format!("FAIL {label}\n{e}\n")),
        Ok(out) => out,
    };
    let ptx = nvrtc::ptx_text(&out.ptx);
    if nvrtc::log_has_warning(&out.log) {
        return (false, format!("FAIL {label} (warnings)\n{}\n", out.log));
    }
    if !ptx.contains(".entry read_floor(") {
        return (false, format!("FAIL {label}: no entry point read_floor\n"));
    }
    let report = format!("ok   {label}\n");
    match ptxas.map(|p| run_ptxas(p, arch, &ptx, &format!("read_floor_{arch}"))) {
        None => (true, report),
        Some(Err(log)) => (false, format!("{report}FAIL ptxas {label}\n{log}\n")),
        Some(Ok(usages)) => {
            let lines: String = usages
                .iter()
                .map(|u| {
                    format!(
                        "     {:<48} regs {:>3}  spill st/ld {:>4}/{:<4}\n",
                        u.function, u.registers, u.spill_stores, u.spill_loads
                    )
                })
                .collect();
            (true, report + &lines)
        }
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let version = match nvrtc::probe() {
        Ok(v) => v,
        Err(reason) => {
            eprintln!("nvrtc-check: NVRTC cannot be loaded: {reason}");
            return ExitCode::from(2);
        }
    };
    println!(
        "NVRTC {}.{}, {} parallel jobs",
        version.0, version.1, args.jobs
    );
    let started = Instant::now();
    // Every (architecture, file, instance), checked in parallel, reported in this order.
    let mut work = Vec::new();
    for arch in &args.archs {
        for file in KernelFile::ALL {
            if args.only.as_deref().is_some_and(|o| o != file.op().name()) {
                continue;
            }
            for instance in file.instances() {
                work.push((arch.clone(), file, instance));
            }
        }
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, bool, String)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..args.jobs.min(work.len()).max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((arch, file, instance)) = work.get(i) else {
                        break;
                    };
                    let (ok, report) = check(arch, *file, instance, args.ptxas.as_ref());
                    if let Ok(mut r) = results.lock() {
                        r.push((i, ok, report));
                    }
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_default();
    results.sort_by_key(|r| r.0);
    if args.only.as_deref().is_none_or(|o| o == "read_floor") {
        for arch in &args.archs {
            let (ok, report) = check_floor(arch, args.ptxas.as_ref());
            results.push((results.len(), ok, report));
        }
    }
    let failures = results.iter().filter(|r| !r.1).count();
    let compiled = results.len() - failures;
    for (_, _, report) in &results {
        print!("{report}");
    }
    println!(
        "{compiled} instances compiled, {failures} failures, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
