//! Opening a backend by name.
//!
//! Names are `cpu`, `cuda`, `wgpu`, `xpu-sim`, optionally with a device ordinal (`wgpu:1`), or
//! `auto` for the first available backend in [`BackendKind::ALL`] order (fastest first, CPU last).
//! The CPU backend is always compiled in; the others arrive with their crates, each behind a cargo
//! feature of its name (`cuda`, `wgpu`, `xpu-sim`), and are reported as not compiled until then. A backend that is named explicitly but cannot be opened is
//! an [`Error::Unavailable`] with the reason: there is no silent fallback.
//!
//! ```
//! use specula_sampler::registry;
//! let device = registry::open("cpu")?;
//! assert_eq!(device.info().kind, specula_backend_api::BackendKind::Cpu);
//! assert!(matches!(
//!     registry::open("nope"),
//!     Err(specula_backend_api::Error::Parse { .. })
//! ));
//! # Ok::<(), specula_backend_api::Error>(())
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use specula_backend_api::{BackendKind, Device, DeviceInfo, Error, Result};
use specula_backend_cpu::CpuDevice;
use tracing::{debug, info};

/// A parsed backend name: a kind (or `auto`) and an optional device ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendSpec {
    /// The backend, or `None` for `auto`.
    pub kind: Option<BackendKind>,
    /// The device ordinal (`wgpu:1`); `None` means 0. `auto` takes no ordinal.
    pub ordinal: Option<usize>,
}

impl FromStr for BackendSpec {
    type Err = Error;

    /// Parses `auto`, `NAME` or `NAME:ORDINAL` (ASCII case-insensitive, surrounding whitespace
    /// ignored). Anything else is [`Error::Parse`].
    fn from_str(spec: &str) -> Result<Self> {
        let parse_error = || Error::Parse {
            what: "backend",
            input: spec.to_owned(),
        };
        let lowered = spec.trim().to_ascii_lowercase();
        let (name, ordinal) = match lowered.split_once(':') {
            Some((name, ordinal)) => {
                let ordinal = ordinal.parse::<usize>().map_err(|_| parse_error())?;
                (name, Some(ordinal))
            }
            None => (lowered.as_str(), None),
        };
        if name == "auto" {
            return match ordinal {
                None => Ok(BackendSpec {
                    kind: None,
                    ordinal: None,
                }),
                Some(_) => Err(parse_error()),
            };
        }
        let kind = name.parse::<BackendKind>().map_err(|_| parse_error())?;
        Ok(BackendSpec {
            kind: Some(kind),
            ordinal,
        })
    }
}

impl fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.ordinal) {
            (None, _) => f.write_str("auto"),
            (Some(kind), None) => write!(f, "{kind}"),
            (Some(kind), Some(ordinal)) => write!(f, "{kind}:{ordinal}"),
        }
    }
}

/// Opens a device by name: `cpu`, `cpu:0`, `auto`, and (when compiled in) `cuda[:N]`, `wgpu[:N]`,
/// `xpu-sim[:N]`.
///
/// Errors: an unknown name is [`Error::Parse`]; a known backend that is not compiled into this
/// build, or has no device with that ordinal, is [`Error::Unavailable`] with the reason.
pub fn open(spec: &str) -> Result<Arc<dyn Device>> {
    let parsed: BackendSpec = spec.parse()?;
    match parsed.kind {
        Some(kind) => open_kind(kind, parsed.ordinal.unwrap_or(0)),
        None => open_auto(),
    }
}

/// Opens device `ordinal` of backend `kind`.
pub fn open_kind(kind: BackendKind, ordinal: usize) -> Result<Arc<dyn Device>> {
    match kind {
        BackendKind::Cpu => {
            if ordinal != 0 {
                return Err(Error::Unavailable {
                    backend: kind,
                    reason: format!("no cpu device with ordinal {ordinal} (there is one: cpu:0)"),
                });
            }
            Ok(Arc::new(CpuDevice::new()?))
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => specula_backend_cuda::open(ordinal),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => specula_backend_wgpu::open(ordinal),
        #[cfg(feature = "xpu-sim")]
        BackendKind::XpuSim => specula_backend_xpu_sim::open(ordinal),
        #[allow(unreachable_patterns)] // every kind may be compiled in
        other => Err(Error::Unavailable {
            backend: other,
            reason: not_compiled_reason(other),
        }),
    }
}

/// Whether `kind` is compiled into this build (the CPU backend always is; the others with the cargo
/// feature of their name).
pub fn is_compiled(kind: BackendKind) -> bool {
    match kind {
        BackendKind::Cpu => true,
        BackendKind::Cuda => cfg!(feature = "cuda"),
        BackendKind::Wgpu => cfg!(feature = "wgpu"),
        BackendKind::XpuSim => cfg!(feature = "xpu-sim"),
    }
}

fn not_compiled_reason(kind: BackendKind) -> String {
    format!("not compiled into this build (enable the `{kind}` feature of specula-sampler)")
}

fn open_auto() -> Result<Arc<dyn Device>> {
    let mut last_error = None;
    for kind in BackendKind::ALL {
        if !is_compiled(kind) {
            debug!(backend = %kind, "auto: skipping backend not compiled into this build");
            continue;
        }
        match open_kind(kind, 0) {
            Ok(device) => {
                let info = device.info();
                info!(backend = %kind, device = %info.name, "auto: opened {kind}:0");
                return Ok(device);
            }
            Err(error) => {
                debug!(backend = %kind, %error, "auto: backend unavailable");
                last_error = Some(error);
            }
        }
    }
    Err(last_error.unwrap_or_else(|| Error::Unavailable {
        backend: BackendKind::Cpu,
        reason: "no backend could be opened".to_owned(),
    }))
}

/// What probing one backend found.
#[derive(Debug)]
pub struct Probe {
    /// The backend probed.
    pub kind: BackendKind,
    /// Its devices, or why it cannot be used (a reason to report a skipped backend with).
    pub result: std::result::Result<Vec<DeviceInfo>, String>,
}

impl Probe {
    /// Whether the backend has at least one device.
    pub fn is_available(&self) -> bool {
        self.result
            .as_ref()
            .is_ok_and(|devices| !devices.is_empty())
    }
}

/// Probes every backend of [`BackendKind::ALL`], in that order, without failing: each entry lists
/// the backend's devices or the reason it is unavailable.
pub fn probe_all() -> Vec<Probe> {
    BackendKind::ALL
        .into_iter()
        .map(|kind| Probe {
            kind,
            result: probe(kind),
        })
        .collect()
}

fn probe(kind: BackendKind) -> std::result::Result<Vec<DeviceInfo>, String> {
    match open_kind(kind, 0) {
        Ok(device) => Ok(vec![device.info().clone()]),
        Err(Error::Unavailable { reason, .. }) => Err(reason),
        Err(other) => Err(other.to_string()),
    }
}
