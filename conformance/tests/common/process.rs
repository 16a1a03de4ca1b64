//! Running the `specula` command in the integration tests and checking its errors.

use std::process::{Command, Output};

pub fn specula(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_specula"))
        .args(args)
        .env_remove("SPECULA_REQUIRE")
        .output()
        .unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit status 2 and exactly one line on stderr, starting with `error:` and containing every
/// needle.
pub fn assert_clean_error(o: &Output, needles: &[&str]) {
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
