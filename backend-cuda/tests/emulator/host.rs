//! Shared by the tests that build the CUDA kernel sources with a host C++ compiler (`host_helpers`,
//! `emulated_kernels`): the kernels' intrinsics on the host, the injected constants, finding and
//! running the compiler, and a deterministic stream of test values.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The CUDA qualifiers, types and intrinsics the kernels use, for a host compiler.
pub const INTRINSICS: &str = include_str!("intrinsics.hpp");

/// `common.cuh` for the host: the PTX of the exact f16 widening becomes its host emulation.
pub fn host_common() -> String {
    specula_backend_cuda::kernels::COMMON.replace(
        "asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));",
        "f = shim_half_to_float(h);",
    )
}

/// The constants shared with the Rust side, as the `#define` lines NVRTC gets as `-D` options.
pub fn defines() -> String {
    specula_backend_cuda::kernels::defines()
        .into_iter()
        .map(|(name, value)| format!("#define {name} {value}\n"))
        .collect()
}

/// The first C++ compiler (`g++`, `c++` or `clang++`) that accepts `-std=<std>`, or why there is
/// none.
pub fn compiler(std: &str) -> Result<&'static str, String> {
    ["g++", "c++", "clang++"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .args([&format!("-std={std}"), "-x", "c++", "-fsyntax-only", "-"])
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .ok_or_else(|| format!("no {std} compiler (g++, c++ or clang++) on PATH"))
}

/// Compiles `source` as `dir/<name>.cpp` with `-std=<std> -O1 -w` and `flags`; returns the binary.
pub fn build(
    compiler: &str,
    std: &str,
    flags: &[&str],
    dir: &Path,
    name: &str,
    source: &str,
) -> Result<PathBuf, String> {
    let src = dir.join(format!("{name}.cpp"));
    let bin = dir.join(name);
    std::fs::write(&src, source).map_err(|e| format!("write {}: {e}", src.display()))?;
    let built = Command::new(compiler)
        .arg(format!("-std={std}"))
        .args(["-O1", "-w"])
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .map_err(|e| format!("run {compiler}: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "host build of {name} failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    Ok(bin)
}
