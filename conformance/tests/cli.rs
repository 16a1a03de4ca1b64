//! The `specula` command's arguments: unknown bench ops are errors, backends take device numbers
//! as the registry does, and the command's stderr stays one `error:` line without
//! `XDG_RUNTIME_DIR`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Output};

fn specula(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(args)
        .env_remove("SPECULA_REQUIRE")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit status 2 and exactly one line on stderr, starting with `error:` and containing every
/// needle.
fn assert_clean_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(2),
        "stderr: {err}\nstdout: {}",
        stdout(o)
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

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

#[test]
fn bench_accepts_a_part_of_a_line_name() {
    let o = specula(&[
        "bench",
        "--op",
        "argmax",
        "--quick",
        "--warm",
        "--warmup",
        "0",
        "--repeats",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("cpu ")).collect();
    assert_eq!(lines.len(), 2, "batches 1 and 64: {out}");
    assert!(lines.iter().all(|l| l.contains("argmax")), "{out}");
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
