#!/usr/bin/env bash
# The whole test suite, as the README's test command runs it: formatting, lints, every test of the
# workspace (the conformance harness included: the quick cases of every op on every available
# backend, the trials `specula run --quick` runs), the doc tests, the examples, the MPI runs, the
# fuzzer, the conformance command on the backends' variants and the CUDA kernels' checks.
# Runnable locally from the repository root. Each step prints its time, so a CI log shows where
# the minutes go.
set -euo pipefail
cd "$(dirname "$0")/.."
# Vulkan loaders (lavapipe) want a runtime directory; a bare root shell or a container may not
# have one, and the loader then prints noise on every program's stderr (the tests of wgpu and any
# test binary that opens it). `specula` makes its own; this covers everything else. Removed at exit.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  chmod 700 "$XDG_RUNTIME_DIR"
  export XDG_RUNTIME_DIR
  made_runtime_dir=$XDG_RUNTIME_DIR
fi

step_started=$SECONDS
step() {
  printf '\n(%ss; %ss in all)\n==> %s\n' "$((SECONDS - step_started))" "$SECONDS" "$*"
  step_started=$SECONDS
}
finish() {
  printf '\n(%ss; %ss in all)\n' "$((SECONDS - step_started))" "$SECONDS"
  if [ -n "${made_runtime_dir:-}" ]; then rm -rf "$made_runtime_dir"; fi
}
trap finish EXIT

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

# Everything below runs the programs that `cargo test` has just built (the test profile, every
# feature: the bins, and the examples, which `cargo test` compiles too), so that CI compiles the
# workspace once and not again in the dev and release profiles.
built_dir="${CARGO_TARGET_DIR:-target}/debug"
built() { # built PATH: the path of target/debug/PATH, which `cargo test` built
  if [ ! -x "$built_dir/$1" ]; then
    echo "$built_dir/$1 is missing: \`cargo test --workspace --all-features\` should have built it" >&2
    return 1
  fi
  printf '%s' "$built_dir/$1"
}

step "examples"
"$(built examples/decode_loop)"

step "sharded sampling across MPI processes (mpirun: 2 to 4 ranks, each against the unsharded reference)"
for ranks in 2 3 4; do
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe -n "$ranks" "$(built examples/shard_check)"
done

step "across MPI processes (mpirun: 2 to 4 ranks): the sampling ops' quick conformance cases sharded, and a tensor-parallel Decoder emitting the unsharded tokens"
for ranks in 2 3 4; do
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe -n "$ranks" "$(built examples/sharded_decode_mpi)"
done

step "specula fuzz: hostile device contents and memory operations on every backend (fixed seed, 2 minutes)"
"$(built specula)" fuzz --seconds 120 --seed 20261124

# A backend listed in SPECULA_REQUIRE must run; otherwise an unavailable one is skipped.
required() { case ",${SPECULA_REQUIRE:-}," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

run_backend() { # run_backend NAME ENV=VALUE [ARGS...]: the quick suite on one backend, in a variant
  local name=$1 variant=$2
  shift 2
  local status=0
  env "$variant" "$(built specula)" run --quick --backend "$name" "$@" || status=$?
  if [ "$status" = 2 ] && ! required "$name"; then
    echo "($name unavailable here: skipped)"
  elif [ "$status" != 0 ]; then
    return "$status"
  fi
}

step "cpu on its AVX2 loops (an AVX-512 machine runs them only when asked)"
run_backend cpu SPECULA_CPU_MAX_ISA=avx2

# The launch shape is compiled into every program (CORES): this launch builds them all again, so it
# runs the f32 cases of every op (the cluster and core splits do not depend on the dtype) and not
# the whole quick suite, which `cargo test` has run in the default shape.
step "xpu-sim in a second launch configuration (2 clusters x 16 cores): the f32 cases of every op"
run_backend xpu-sim SPECULA_XPU_SIM_LAUNCH=2x16 --filter f32

step "wgpu with storage bindings limited to 64 KiB: the f32 cases of every op, their row matrices bound in chunks (uneven ones too)"
run_backend wgpu SPECULA_WGPU_MAX_BINDING_BYTES=65536 --filter f32

step "CUDA kernels: NVRTC compile check for sm_80 and sm_90"
status=0
"$(built nvrtc-check)" --arch sm_80,sm_90 ${SPECULA_PTXAS:+--ptxas "$SPECULA_PTXAS"} || status=$?
if [ "$status" = 2 ] && [ "${SPECULA_REQUIRE_NVRTC:-0}" != 1 ]; then
  echo "(NVRTC not found here: skipped; .ci/run installs it)"
elif [ "$status" != 0 ]; then
  exit "$status"
fi

step "CUDA kernels on the host emulator (real .cu sources with g++, compared with the CPU reference)"
if command -v g++ >/dev/null 2>&1; then
  SPECULA_REQUIRE="${SPECULA_REQUIRE:+$SPECULA_REQUIRE,}cuda-emulator" cargo test -q --locked --workspace --all-features --test emulated_kernels
else
  echo "(g++ not found: skipped)"
fi
