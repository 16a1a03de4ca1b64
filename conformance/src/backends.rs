//! The backends under test: every backend the sampler's registry knows, each probed once.
//!
//! A backend that cannot be opened (not compiled into this build, library not found, no device) is
//! kept in the list with its reason, so its trials are reported as skipped — never passed. The
//! environment variable [`REQUIRE_VAR`] (`SPECULA_REQUIRE=cpu,wgpu`) names backends whose absence
//! is a failure instead, for CI lanes that must have a device.
//!
//! A backend is named as in the sampler's registry: `cpu`, `wgpu`, `xpu-sim`, `cuda`, optionally
//! with a device number (`xpu-sim:1`; none means device 0). Device 0 keeps the plain name in trial
//! names and reports; another device is named with its number.
//!
//! ```
//! use specula_conformance::backends;
//! let all = backends::probe_all();
//! assert_eq!(all[0].name, "cpu");
//! assert!(all[0].device().is_some(), "the CPU backend is always available");
//!
//! let chosen = backends::parse_backend_list("cpu:0,xpu-sim:1")?.expect("not `all`");
//! assert_eq!(chosen[0].name(), "cpu");
//! assert_eq!(chosen[1].name(), "xpu-sim:1");
//! // There is one CPU device: another number is unavailable, with the reason.
//! let probed = backends::probe_selected(&[backends::BackendChoice::parse("cpu:1")?]);
//! assert!(probed[0].skip_reason().is_some_and(|r| r.contains("ordinal 1")));
//! # Ok::<(), specula_conformance::ConformanceError>(())
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use specula_backend_api::{BackendKind, Device, Error};
use specula_sampler::registry::{self, BackendSpec};

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

/// One backend device to test: a backend and its device number, as the registry opens it
/// ([`registry::open_kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendChoice {
    /// The backend.
    pub kind: BackendKind,
    /// The device number (`xpu-sim:1`); 0 when the name has none.
    pub ordinal: usize,
}

impl BackendChoice {
    /// Device 0 of `kind`.
    pub fn first(kind: BackendKind) -> Self {
        BackendChoice { kind, ordinal: 0 }
    }

    /// Parses `NAME` or `NAME:N` as the registry does ([`BackendSpec`]; ASCII case-insensitive),
    /// without `auto`.
    pub fn parse(name: &str) -> Result<Self> {
        let unknown = || {
            ConformanceError::Format(format!(
                "unknown backend `{}` (expected one of: {}; optionally with a device number, \
                 e.g. xpu-sim:1)",
                name.trim(),
                backend_names()
            ))
        };
        match name.parse::<BackendSpec>() {
            Ok(BackendSpec {
                kind: Some(kind),
                ordinal,
            }) => Ok(BackendChoice {
                kind,
                ordinal: ordinal.unwrap_or(0),
            }),
            _ => Err(unknown()),
        }
    }

    /// The name in trial names and reports: the backend's name for device 0 (`cpu`), with the
    /// device number otherwise (`xpu-sim:1`).
    pub fn name(&self) -> String {
        match self.ordinal {
            0 => self.kind.name().to_owned(),
            n => format!("{}:{n}", self.kind.name()),
        }
    }

    /// Where the backend comes in [`ORDER`], then the device number.
    fn sort_key(&self) -> (usize, usize) {
        let rank = ORDER
            .iter()
            .position(|k| *k == self.kind)
            .unwrap_or(ORDER.len());
        (rank, self.ordinal)
    }
}

impl From<BackendKind> for BackendChoice {
    fn from(kind: BackendKind) -> Self {
        BackendChoice::first(kind)
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Opens device 0 of `kind` through the sampler's registry, once.
pub fn probe(kind: BackendKind) -> Backend {
    probe_choice(BackendChoice::first(kind))
}

/// Opens the chosen device through the sampler's registry, once. A device number the backend
/// does not have makes the backend unavailable, with the registry's reason.
pub fn probe_choice(choice: BackendChoice) -> Backend {
    let status = match registry::open_kind(choice.kind, choice.ordinal) {
        Ok(device) => Ok(device),
        Err(Error::Unavailable { reason, .. }) => Err(reason),
        Err(other) => Err(other.to_string()),
    };
    Backend {
        name: choice.name(),
        kind: Some(choice.kind),
        status,
    }
}

/// Probes the given backend devices (a [`BackendKind`] is its device 0), in [`ORDER`] and then
/// by device number, each once.
pub fn probe_selected<C: Into<BackendChoice> + Copy>(choices: &[C]) -> Vec<Backend> {
    let mut choices: Vec<BackendChoice> = choices.iter().map(|&c| c.into()).collect();
    choices.sort_by_key(BackendChoice::sort_key);
    choices.dedup();
    choices.into_iter().map(probe_choice).collect()
}

/// Probes every backend the registry knows (device 0 of each), in [`ORDER`].
pub fn probe_all() -> Vec<Backend> {
    probe_selected(&ORDER)
}

/// Parses one backend name (`cpu`, `wgpu`, `xpu-sim`, `cuda`; ASCII case-insensitive), without
/// a device number.
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

/// Parses `all` or a comma-separated list of backend names, each optionally with a device
/// number (`cpu,xpu-sim:1`); `None` means `all`.
pub fn parse_backend_list(list: &str) -> Result<Option<Vec<BackendChoice>>> {
    if list.trim().eq_ignore_ascii_case("all") {
        return Ok(None);
    }
    let mut choices = Vec::new();
    for name in list.split(',').filter(|n| !n.trim().is_empty()) {
        let choice = BackendChoice::parse(name)?;
        if !choices.contains(&choice) {
            choices.push(choice);
        }
    }
    if choices.is_empty() {
        return Err(ConformanceError::Format(format!(
            "empty backend list `{list}` (expected `all` or some of: {})",
            backend_names()
        )));
    }
    Ok(Some(choices))
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

/// Parses the value of [`REQUIRE_VAR`]: comma-separated backend names (optionally with a device
/// number, as `--backend` takes them), or `all`.
pub fn parse_required(list: &str) -> Result<BTreeSet<String>> {
    if list.trim().is_empty() {
        return Ok(BTreeSet::new());
    }
    let choices = parse_backend_list(list)
        .map_err(|e| ConformanceError::Format(format!("{REQUIRE_VAR}: {e}")))?
        .unwrap_or_else(|| ORDER.map(BackendChoice::first).to_vec());
    Ok(choices.iter().map(BackendChoice::name).collect())
}

fn backend_names() -> String {
    ORDER.map(BackendKind::name).join(", ")
}
