//! The backend registry.

use specula_backend_api::{BackendKind, Error};
use specula_sampler::registry::{self, BackendSpec};

#[test]
fn cpu_opens_by_name_and_ordinal() {
    for spec in ["cpu", "cpu:0", " CPU ", "Cpu:0"] {
        let device = registry::open(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(device.info().kind, BackendKind::Cpu, "{spec}");
        assert_eq!(device.info().ordinal, 0);
    }
}

#[test]
fn auto_opens_the_first_available_backend() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let device = registry::open("auto").expect("auto");
    // The first backend, in preference order, that has a device here (the CPU at the latest).
    let expected = registry::probe_all()
        .into_iter()
        .find(|p| p.is_available())
        .map(|p| p.kind)
        .expect("the cpu is always available");
    assert_eq!(device.info().kind, expected);
}

#[test]
fn unknown_names_are_parse_errors() {
    for spec in [
        "", "gpu", "cpu:", "cpu:x", "cpu:-1", "auto:0", "cuda:0:1", "vulkan",
    ] {
        match registry::open(spec) {
            Err(Error::Parse { what, input }) => {
                assert_eq!(what, "backend");
                assert_eq!(input, spec);
            }
            other => panic!("{spec:?}: expected a parse error, got {other:?}"),
        }
    }
}

#[test]
fn absent_backends_are_unavailable_with_a_reason() {
    // Every spec that cannot be opened here must say which backend and why: backends not compiled
    // in, absent drivers, and ordinals beyond the devices present.
    let mut checked = 0;
    for (spec, kind) in [
        ("cuda", BackendKind::Cuda),
        ("cuda:1", BackendKind::Cuda),
        ("wgpu", BackendKind::Wgpu),
        ("wgpu:7", BackendKind::Wgpu),
        ("xpu-sim", BackendKind::XpuSim),
        ("xpu-sim:7", BackendKind::XpuSim),
    ] {
        match registry::open(spec) {
            Ok(device) => {
                assert!(
                    registry::is_compiled(kind),
                    "{spec} opened without being compiled in"
                );
                assert_eq!(device.info().kind, kind, "{spec}");
            }
            Err(Error::Unavailable { backend, reason }) => {
                assert_eq!(backend, kind, "{spec}");
                assert!(!reason.is_empty(), "{spec}");
                if !registry::is_compiled(kind) {
                    assert!(reason.contains(kind.name()), "{spec}: {reason}");
                }
                checked += 1;
            }
            other => panic!("{spec}: expected a device or Unavailable, got {other:?}"),
        }
    }
    // Ordinal 7 exists on no machine this runs on, and cuda:1 nowhere without two GPUs.
    assert!(
        checked >= 2,
        "only {checked} unavailable specs were checked"
    );
    match registry::open("cpu:1") {
        Err(Error::Unavailable { backend, reason }) => {
            assert_eq!(backend, BackendKind::Cpu);
            assert!(reason.contains("ordinal 1"), "{reason}");
        }
        other => panic!("cpu:1: expected Unavailable, got {other:?}"),
    }
}

#[test]
fn probe_all_reports_every_backend() {
    let probes = registry::probe_all();
    let kinds: Vec<_> = probes.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, BackendKind::ALL);
    for probe in &probes {
        match probe.kind {
            BackendKind::Cpu => {
                assert!(probe.is_available());
                let devices = probe.result.as_ref().expect("cpu");
                assert_eq!(devices[0].kind, BackendKind::Cpu);
            }
            kind if !registry::is_compiled(kind) => {
                let reason = probe.result.as_ref().expect_err("not compiled");
                assert!(reason.contains("not compiled"), "{reason}");
            }
            // A compiled-in backend has a device here or says why not; either way, no panic.
            _ => {
                if let Err(reason) = &probe.result {
                    assert!(!reason.is_empty());
                }
            }
        }
    }
}

#[test]
fn specs_round_trip() {
    for spec in ["auto", "cpu", "cpu:0", "wgpu:3", "xpu-sim"] {
        let parsed: BackendSpec = spec.parse().expect(spec);
        assert_eq!(parsed.to_string(), spec);
    }
}
