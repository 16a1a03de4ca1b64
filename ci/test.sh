#!/usr/bin/env bash
# The whole test suite, as the README's test command runs it: formatting, lints, every test of the
# workspace (the conformance harness included), the doc tests, the runner examples and
# `specula run --quick`. Runnable locally from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
# Vulkan loaders (lavapipe) want a runtime directory; a bare root shell or a container may not
# have one, and the loader then prints noise on every program's stderr (the tests of wgpu and any
# test binary that opens it). `specula` makes its own; this covers everything else. Removed at exit.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  chmod 700 "$XDG_RUNTIME_DIR"
  export XDG_RUNTIME_DIR
  trap 'rm -rf "$XDG_RUNTIME_DIR"' EXIT
fi

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "section citations: every § names a section of docs/semantics.md"
bash ci/check-sections.sh

step "cargo clippy (all targets, all features, warnings are errors)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --locked

step "cargo test --workspace"
cargo test --workspace --all-features --locked

step "examples"
cargo run --locked -p specula-sampler --example decode_loop

step "sharded sampling across MPI processes (mpirun: 1 to 4 ranks, each against the unsharded reference)"
# The test profile and every feature, as `cargo test --workspace` above built it: nothing to rebuild.
cargo build -q --locked --profile test --all-features -p specula-shard --example shard_check
for ranks in 1 2 3 4; do
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe -n "$ranks" target/debug/examples/shard_check
done

step "across MPI processes (mpirun: 1 to 4 ranks): the sampling ops' quick conformance cases sharded, and a tensor-parallel Decoder emitting the unsharded tokens"
cargo build -q --locked --profile test --all-features -p specula-conformance --example sharded_decode_mpi
for ranks in 1 2 3 4; do
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe -n "$ranks" target/debug/examples/sharded_decode_mpi
done

step "specula run --quick (the conformance command, quick cases, every available backend)"
cargo run --locked -p specula-conformance --bin specula -- run --quick

step "specula fuzz: hostile device contents and memory operations on every backend (fixed seed, 2 minutes)"
cargo run -q --locked -p specula-conformance --bin specula -- fuzz --seconds 120 --seed 20261124

# A backend listed in SPECULA_REQUIRE must run; otherwise an unavailable one is skipped.
required() { case ",${SPECULA_REQUIRE:-}," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

run_backend() { # run_backend NAME [ENV=VALUE ...]: the quick suite on one backend, in a variant
  local name=$1
  shift
  local status=0
  env "$@" cargo run -q --locked -p specula-conformance --bin specula -- run --quick --backend "$name" || status=$?
  if [ "$status" = 2 ] && ! required "$name"; then
    echo "($name unavailable here: skipped)"
  elif [ "$status" != 0 ]; then
    return "$status"
  fi
}

step "cpu on its AVX2 loops (an AVX-512 machine runs them only when asked)"
run_backend cpu SPECULA_CPU_MAX_ISA=avx2

step "xpu-sim in a second launch configuration (2 clusters x 16 cores)"
run_backend xpu-sim SPECULA_XPU_SIM_LAUNCH=2x16

step "wgpu with storage bindings limited to 1 MiB (every large input is processed in chunks)"
run_backend wgpu SPECULA_WGPU_MAX_BINDING_BYTES=1048576

step "CUDA kernels: NVRTC compile check for sm_80 and sm_90"
status=0
cargo run -q --locked --release -p specula-backend-cuda --bin nvrtc-check -- --arch sm_80,sm_90 ${SPECULA_PTXAS:+--ptxas "$SPECULA_PTXAS"} || status=$?
if [ "$status" = 2 ] && [ "${SPECULA_REQUIRE_NVRTC:-0}" != 1 ]; then
  echo "(NVRTC not found here: skipped; .ci/run installs it)"
elif [ "$status" != 0 ]; then
  exit "$status"
fi

step "CUDA kernels on the host emulator (real .cu sources with g++, compared with the CPU reference)"
if command -v g++ >/dev/null 2>&1; then
  SPECULA_REQUIRE="${SPECULA_REQUIRE:+$SPECULA_REQUIRE,}cuda-emulator" cargo test -q --locked -p specula-backend-cuda --test emulated_kernels
else
  echo "(g++ not found: skipped)"
fi
