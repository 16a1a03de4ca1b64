//! The launch shape of every kernel: `clusters × cores`.

use std::fmt;
use std::str::FromStr;

use specula_backend_api::{BackendKind, Error, Result};

/// The environment variable read by [`crate::open`]: `CLUSTERSxCORES`, e.g. `2x16`.
pub const LAUNCH_ENV: &str = "SPECULA_XPU_SIM_LAUNCH";

/// The most cores per cluster a launch may ask for (the local scratch of a cluster grows with it).
pub const MAX_CORES: usize = 256;

/// The most clusters a launch may ask for.
pub const MAX_CLUSTERS: usize = 4096;

/// How a kernel is launched: `clusters` work-groups of `cores` work-items each.
///
/// The default is 8 clusters × 64 cores, the shape of a Kunlun XPU launch `<<<ncluster, 64>>>` on
/// a part with 8 clusters of 64 cores: rows (or slots) are dealt to clusters, the cores of a
/// cluster split a row. No exact output depends on the shape (every merge is exact integer
/// arithmetic in a fixed order), and the conformance suite is run with at least two shapes to
/// prove it (`SPECULA_XPU_SIM_LAUNCH=2x16` in CI).
///
/// ```
/// use specula_backend_xpu_sim::LaunchConfig;
/// let launch: LaunchConfig = "2x16".parse()?;
/// assert_eq!((launch.clusters, launch.cores), (2, 16));
/// assert_eq!(LaunchConfig::default().to_string(), "8x64");
/// # Ok::<(), specula_backend_api::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Work-groups per launch (XPU clusters), `1 ..= 4096`.
    pub clusters: usize,
    /// Work-items per work-group (cores per cluster), `1 ..= 256` and at most the device's limit.
    pub cores: usize,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        LaunchConfig {
            clusters: 8,
            cores: 64,
        }
    }
}

impl LaunchConfig {
    /// A launch shape; checked when a device is opened with it.
    pub fn new(clusters: usize, cores: usize) -> Self {
        LaunchConfig { clusters, cores }
    }

    /// The shape from [`LAUNCH_ENV`], or the default when it is unset.
    pub fn from_env() -> Result<Self> {
        match std::env::var(LAUNCH_ENV) {
            Ok(value) => value.parse(),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::Parse {
                what: "SPECULA_XPU_SIM_LAUNCH (CLUSTERSxCORES)",
                input: "<not unicode>".to_owned(),
            }),
        }
    }

    /// Checks the ranges (and the device's work-group limit).
    pub(crate) fn check(&self, device_max_cores: usize) -> Result<()> {
        let max_cores = MAX_CORES.min(device_max_cores.max(1));
        if !(1..=MAX_CLUSTERS).contains(&self.clusters) || !(1..=max_cores).contains(&self.cores) {
            return Err(Error::Unavailable {
                backend: BackendKind::XpuSim,
                reason: format!(
                    "launch {self} out of range: clusters 1..={MAX_CLUSTERS}, cores 1..={max_cores}"
                ),
            });
        }
        Ok(())
    }
}

impl fmt::Display for LaunchConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.clusters, self.cores)
    }
}

impl FromStr for LaunchConfig {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let parse_error = || Error::Parse {
            what: "SPECULA_XPU_SIM_LAUNCH (CLUSTERSxCORES)",
            input: s.to_owned(),
        };
        let (clusters, cores) = s
            .trim()
            .split_once(['x', 'X', '*'])
            .ok_or_else(parse_error)?;
        Ok(LaunchConfig {
            clusters: clusters.trim().parse().map_err(|_| parse_error())?,
            cores: cores.trim().parse().map_err(|_| parse_error())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_clusters_by_cores() {
        assert_eq!(
            "2x16".parse::<LaunchConfig>().ok(),
            Some(LaunchConfig::new(2, 16))
        );
        assert_eq!(
            " 3 X 5 ".parse::<LaunchConfig>().ok(),
            Some(LaunchConfig::new(3, 5))
        );
        assert_eq!(
            "8*64".parse::<LaunchConfig>().ok(),
            Some(LaunchConfig::default())
        );
        for bad in ["", "8", "x64", "8x", "ax4", "-1x4"] {
            assert!(bad.parse::<LaunchConfig>().is_err(), "{bad}");
        }
    }

    #[test]
    fn checks_ranges() {
        assert!(LaunchConfig::new(1, 1).check(4096).is_ok());
        assert!(LaunchConfig::new(0, 4).check(4096).is_err());
        assert!(LaunchConfig::new(4, 0).check(4096).is_err());
        assert!(LaunchConfig::new(4, 512).check(4096).is_err());
        assert!(LaunchConfig::new(4, 64).check(32).is_err());
        assert!(LaunchConfig::new(MAX_CLUSTERS + 1, 4).check(4096).is_err());
    }
}
