//! The `specula` command's arguments: unknown bench ops are errors, backends take device numbers
//! as the registry does, the command's stderr stays one `error:` line without
//! `XDG_RUNTIME_DIR`, and `docs/conformance.md` lists every command.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "common/process.rs"]
mod process;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use process::{assert_clean_error, specula, stderr, stdout};

#[test]
fn bench_rejects_an_unknown_op() {
    let o = specula(&["bench", "--op", "nosuchop"]);
    assert_clean_error(
        &o,
        &[
            "`nosuchop`",
            "argmax",
            "step",
            "logits_sample",
            "gather_next_token",
        ],
    );
    assert!(stdout(&o).is_empty(), "no table: {}", stdout(&o));
    // One unknown value among known ones is still an error, naming the unknown one.
    let o = specula(&["bench", "--op", "argmax,bogus"]);
    assert_clean_error(&o, &["`bogus`"]);
    let o = specula(&["bench", "--op", ""]);
    assert_clean_error(&o, &["empty bench op"]);
}

/// The CPU lines of `specula bench --op OP --quick --warm` with one timed call each (the run must
/// succeed).
fn quick_bench_lines(op: &str) -> Vec<String> {
    let o = specula(&[
        "bench",
        "--op",
        op,
        "--quick",
        "--warm",
        "--warmup",
        "0",
        "--repeats",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    stdout(&o)
        .lines()
        .filter(|l| l.starts_with("cpu "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn bench_accepts_a_part_of_a_line_name() {
    let lines = quick_bench_lines("argmax");
    assert_eq!(lines.len(), 2, "batches 1 and 64: {lines:?}");
    assert!(lines.iter().all(|l| l.contains("argmax")), "{lines:?}");
}

#[test]
fn bench_takes_a_whole_line_name_with_commas() {
    // The comma of `(c=8,p=0.9)` belongs to the line name: one filter, that line's batches only
    // (split at it, `p=0.9)` would select every top-p line).
    let name = "top_p_candidates(c=8,p=0.9)";
    let lines = quick_bench_lines(name);
    assert_eq!(lines.len(), 2, "batches 1 and 64: {lines:?}");
    assert!(lines.iter().all(|l| l.contains(name)), "{lines:?}");
}

#[test]
fn bench_takes_graph_lines_and_names_a_missing_cuda_device() {
    // `--graph` and the captured step's lines parse; CUDA device 99 exists nowhere, so the bench
    // stops with the one-line error (with a GPU or without, with the cuda feature or without).
    let o = specula(&[
        "bench",
        "--backend",
        "cuda:99",
        "--graph",
        "--op",
        "graph",
        "--quick",
    ]);
    assert_clean_error(&o, &["backend cuda:99 is unavailable"]);
}

#[test]
fn backends_take_device_numbers() {
    // Device 0 named with its number runs, and is reported under the plain name.
    let o = specula(&["run", "--quick", "--backend", "cpu:0", "--op", "argmax"]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    assert!(stdout(&o).contains("passed on cpu "), "{}", stdout(&o));
    // A device number the backend lacks is a clear error, on every command that takes backends.
    for args in [
        &["run", "--quick", "--backend", "cpu:1", "--op", "argmax"][..],
        &["bench", "--backend", "cpu:1", "--op", "argmax", "--quick"][..],
        &["fuzz", "--backend", "cpu,cpu:1", "--seconds", "1"][..],
    ] {
        let o = specula(args);
        assert_clean_error(&o, &["backend cpu:1 is unavailable", "ordinal 1"]);
    }
    // Whether or not xpu-sim is compiled in and has a device here, it has no device 99.
    let o = specula(&[
        "run",
        "--quick",
        "--backend",
        "xpu-sim:99",
        "--op",
        "argmax",
    ]);
    assert_clean_error(&o, &["backend xpu-sim:99 is unavailable"]);
    // A malformed number is an unknown backend, named.
    for bad in ["cpu:x", "cpu:-1", "auto", "cpu:"] {
        let o = specula(&["run", "--quick", "--backend", bad]);
        assert_clean_error(&o, &[&format!("unknown backend `{bad}`"), "device number"]);
    }
}

/// `specula` with `XDG_RUNTIME_DIR` as `value` (`None`: unset), the other variables `envs`, and
/// its temporary directory in a fresh folder, which is returned with the output.
fn specula_env(
    value: Option<&str>,
    envs: &[(&str, &str)],
    name: &str,
    args: &[&str],
) -> (Output, PathBuf) {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("specula-cli-tests")
        .join(name);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_specula"));
    command
        .args(args)
        .env_remove("SPECULA_REQUIRE")
        .env("TMPDIR", &tmp)
        .envs(envs.iter().copied());
    match value {
        Some(value) => command.env("XDG_RUNTIME_DIR", value),
        None => command.env_remove("XDG_RUNTIME_DIR"),
    };
    (command.output().unwrap(), tmp)
}

fn assert_no_loader_noise(o: &Output) {
    let err = stderr(o);
    assert!(!err.contains("XDG_RUNTIME_DIR"), "loader noise: {err}");
}

/// The private runtime directory is gone once the command has exited.
fn assert_removed(tmp: &Path) {
    let left: Vec<_> = std::fs::read_dir(tmp).unwrap().collect();
    assert!(
        left.is_empty(),
        "left behind in {}: {left:?}",
        tmp.display()
    );
}

#[test]
fn one_error_line_without_xdg_runtime_dir() {
    for value in [None, Some(""), Some("/nonexistent/specula-runtime")] {
        // A failure after every backend was opened (wgpu included, when compiled in).
        let (o, tmp) = specula_env(
            value,
            &[("SPECULA_REQUIRE", "tpu")],
            "require",
            &["run", "--quick", "--op", "argmax"],
        );
        assert_clean_error(&o, &["SPECULA_REQUIRE", "`tpu`"]);
        assert_removed(&tmp);
        // A missing case file.
        let (o, tmp) = specula_env(
            value,
            &[],
            "replay",
            &["replay", "/nonexistent/case.safetensors"],
        );
        assert_clean_error(&o, &["/nonexistent/case.safetensors"]);
        assert_removed(&tmp);
    }
}

#[test]
fn runs_without_xdg_runtime_dir() {
    let (o, tmp) = specula_env(
        None,
        &[],
        "run-cpu",
        &["run", "--quick", "--backend", "cpu", "--op", "argmax"],
    );
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    assert_no_loader_noise(&o);
    assert_removed(&tmp);
    // Every backend (wgpu's Vulkan loader included, where compiled in): no noise either.
    let (o, tmp) = specula_env(None, &[], "run-all", &["run", "--quick", "--op", "argmax"]);
    assert_ne!(o.status.code(), Some(2), "stderr: {}", stderr(&o));
    assert_no_loader_noise(&o);
    assert_removed(&tmp);
}

#[test]
fn a_usable_xdg_runtime_dir_is_kept() {
    let own = Path::new(env!("CARGO_TARGET_TMPDIR")).join("specula-cli-own-runtime");
    std::fs::create_dir_all(&own).unwrap();
    let (o, tmp) = specula_env(
        Some(own.to_str().unwrap()),
        &[],
        "own",
        &["run", "--quick", "--backend", "cpu", "--op", "argmax"],
    );
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    assert!(own.is_dir());
    assert_removed(&tmp);
}

#[test]
fn the_docs_list_every_command() {
    let o = specula(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = stdout(&o);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.contains(&"bench"), "{help}");
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/conformance.md"),
    )
    .unwrap();
    let (table, options) = docs
        .split_once("`specula` options")
        .expect("the options block");
    for command in commands {
        let named = format!("`specula {command} ");
        assert!(
            table.contains(&named),
            "{command} missing from the command table"
        );
        let usage = format!("\nspecula {command} ");
        assert!(
            options.contains(&usage),
            "{command} missing from the options block"
        );
    }
}

#[test]
fn the_trial_count_is_known_before_the_run() {
    use specula_backend_api::{BackendKind, Op};
    use specula_conformance::backends;
    use specula_conformance::cases::Size;
    use specula_conformance::suite::{Plan, Progress, Suite};
    let suite = Suite::new(backends::probe_selected(&[BackendKind::Cpu]), Size::Quick).unwrap();
    for filter in [
        None,
        Some("f32".to_owned()),
        Some("nothing matches".to_owned()),
    ] {
        let plan = Plan {
            ops: vec![Op::Argmax, Op::Softmax],
            properties: false,
            filter,
        };
        let counted = suite.count_trials(&plan);
        let (mut planned, mut started) = (0, 0);
        let report = suite.run_plan(&plan, &mut |progress| match progress {
            Progress::Planned(n) => planned += n,
            Progress::Started(_) => started += 1,
            Progress::Finished(_) => {}
        });
        assert_eq!(counted, planned, "{:?}", plan.filter);
        assert_eq!(counted, started, "{:?}", plan.filter);
        assert_eq!(counted, report.results.len(), "{:?}", plan.filter);
    }
}
