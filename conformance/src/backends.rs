//! The backends under test: every backend the sampler's registry knows, each probed once.
//!
//! A backend that cannot be opened (not compiled into this build, library not found, no device) is
//! kept in the list with its reason, so its trials are reported as skipped — never passed. The
//! environment variable [`REQUIRE_VAR`] (`SPECULA_REQUIRE=cpu,wgpu`) names backends whose absence
//! is a failure instead, for CI lanes that must have a device.
//!
//! ```
//! use specula_conformance::backends;
//! let all = backends::probe_all();
//! assert_eq!(all[0].name, "cpu");
//! assert!(all[0].device().is_some(), "the CPU backend is always available");
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use specula_backend_api::{BackendKind, Device, Error};
use specula_sampler::registry;

use crate::{ConformanceError, Result};

/// The order backends appear in trial lists and report tables: the reference first.
pub const ORDER: [BackendKind; 4] = [
    BackendKind::Cpu,
    BackendKind::Wgpu,
    BackendKind::XpuSim,
    BackendKind::Cuda,
];

/// The environment variable listing backends that must be available (comma-separated names).
pub const REQUIRE_VAR: &str = "SPECULA_REQUIRE";

/// One backend under test: an opened device, or the reason there is none.
#[derive(Clone)]
pub struct Backend {
    /// The name in trial names and reports (`cpu`, `wgpu`, `xpu-sim`, `cuda`, or a test-only name).
    pub name: String,
    /// The registry's kind, or `None` for a backend the registry does not know (test doubles).
    pub kind: Option<BackendKind>,
    /// The opened device, or why the backend cannot be used.
    pub status: std::result::Result<Arc<dyn Device>, String>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("status", &self.describe())
            .finish()
    }
}

impl Backend {
    /// An available backend around an opened device (also how tests put a wrapped device under
    /// the suite).
    pub fn available(name: impl Into<String>, device: Arc<dyn Device>) -> Self {
        Backend {
            name: name.into(),
            kind: None,
            status: Ok(device),
        }
    }

    /// A backend that cannot be used, with the reason.
    pub fn unavailable(name: impl Into<String>, reason: impl Into<String>) -> Self {
        Backend {
            name: name.into(),
            kind: None,
            status: Err(reason.into()),
        }
    }

    /// The device, if the backend is available.
    pub fn device(&self) -> Option<&Arc<dyn Device>> {
        self.status.as_ref().ok()
    }

    /// Why the backend is unavailable, if it is.
    pub fn skip_reason(&self) -> Option<&str> {
        self.status.as_ref().err().map(String::as_str)
    }

    /// One line: the device's name and driver, or `unavailable: <reason>`.
    pub fn describe(&self) -> String {
        match &self.status {
            Ok(device) => {
                let info = device.info();
                format!("{} ({})", info.name, info.driver)
            }
            Err(reason) => format!("unavailable: {reason}"),
        }
    }
}

/// The names of the available backends among `backends`, comma-separated (`cpu, wgpu`).
pub fn available_names(backends: &[Backend]) -> String {
    let names: Vec<&str> = backends
        .iter()
        .filter(|b| b.device().is_some())
        .map(|b| b.name.as_str())
        .collect();
    names.join(", ")
}

/// Opens device 0 of `kind` through the sampler's registry, once.
pub fn probe(kind: BackendKind) -> Backend {
    let status = match registry::open_kind(kind, 0) {
        Ok(device) => Ok(device),
        Err(Error::Unavailable { reason, .. }) => Err(reason),
        Err(other) => Err(other.to_string()),
    };
    Backend {
        name: kind.name().to_owned(),
        kind: Some(kind),
        status,
    }
}

/// Probes the given backends, in [`ORDER`], each once.
pub fn probe_selected(kinds: &[BackendKind]) -> Vec<Backend> {
    ORDER
        .into_iter()
        .filter(|kind| kinds.contains(kind))
        .map(probe)
        .collect()
}

/// Probes every backend the registry knows, in [`ORDER`].
pub fn probe_all() -> Vec<Backend> {
    probe_selected(&ORDER)
}

/// Parses one backend name (`cpu`, `wgpu`, `xpu-sim`, `cuda`; ASCII case-insensitive).
pub fn parse_backend(name: &str) -> Result<BackendKind> {
    let lowered = name.trim().to_ascii_lowercase();
    lowered.parse::<BackendKind>().map_err(|_| {
        ConformanceError::Format(format!(
            "unknown backend `{}` (expected one of: {})",
            name.trim(),
            backend_names()
        ))
    })
}

/// Parses `all` or a comma-separated list of backend names; `None` means `all`.
pub fn parse_backend_list(list: &str) -> Result<Option<Vec<BackendKind>>> {
    if list.trim().eq_ignore_ascii_case("all") {
        return Ok(None);
    }
    let mut kinds = Vec::new();
    for name in list.split(',').filter(|n| !n.trim().is_empty()) {
        let kind = parse_backend(name)?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    if kinds.is_empty() {
        return Err(ConformanceError::Format(format!(
            "empty backend list `{list}` (expected `all` or some of: {})",
            backend_names()
        )));
    }
    Ok(Some(kinds))
}

/// The backends [`REQUIRE_VAR`] names (empty when unset). An unknown name is an error, so a typo
/// cannot silently turn a required lane into an optional one.
pub fn required_from_env() -> Result<BTreeSet<String>> {
    match std::env::var(REQUIRE_VAR) {
        Ok(list) => parse_required(&list),
        Err(std::env::VarError::NotPresent) => Ok(BTreeSet::new()),
        Err(std::env::VarError::NotUnicode(_)) => Err(ConformanceError::Format(format!(
            "{REQUIRE_VAR} is not valid UTF-8"
        ))),
    }
}

/// Parses the value of [`REQUIRE_VAR`]: comma-separated backend names, or `all`.
pub fn parse_required(list: &str) -> Result<BTreeSet<String>> {
    if list.trim().is_empty() {
        return Ok(BTreeSet::new());
    }
    let kinds = parse_backend_list(list)
        .map_err(|e| ConformanceError::Format(format!("{REQUIRE_VAR}: {e}")))?
        .unwrap_or_else(|| ORDER.to_vec());
    Ok(kinds.into_iter().map(|k| k.name().to_owned()).collect())
}

fn backend_names() -> String {
    ORDER.map(BackendKind::name).join(", ")
}
