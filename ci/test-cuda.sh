#!/usr/bin/env bash
# The CUDA lane. Two parts:
#
#  1. Compile check (any machine, no GPU needed): every CUDA kernel of backend-cuda is compiled by
#     NVRTC from the nvidia-cuda-nvrtc-cu12 wheel for sm_80 and sm_90 with the options the runtime
#     uses; any error or warning fails. When ptxas (nvidia-cuda-nvcc-cu12) is available, every
#     instance is also assembled and registers/spills per kernel are printed. Then the host
#     emulation of the kernels (real kernel sources, g++, one process per block) is compared with
#     the CPU reference (SPECULA_REQUIRE=cuda-emulator: ignored elsewhere, failing here without a
#     C++20 compiler).
#  2. On a machine with an NVIDIA GPU (nvidia-smi works, or SPECULA_CUDA_GPU=1): the full
#     conformance suite with SPECULA_REQUIRE=cuda (a missing device is a failure there), the
#     driver-call counts (after its warm-up an op makes 0 allocations, 0 synchronisations and 0
#     copies: only its launches) and the captured step, then the benchmarks (kernel time next to
#     the device read floor, and the step captured as a CUDA graph).
#
# Environment: VENV (default .venv-cuda) for the wheels; NVRTC_ARCHS (default sm_80,sm_90);
# SPECULA_CUDA_SKIP_EMULATION=1 skips the (slow, minutes) emulated-kernel tests.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

VENV="${VENV:-.venv-cuda}"
ARCHS="${NVRTC_ARCHS:-sm_80,sm_90}"

step "NVRTC and ptxas from the CUDA 12.9 wheels"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet "nvidia-cuda-nvrtc-cu12==12.9.*" "nvidia-cuda-nvcc-cu12==12.9.*"
NVRTC_LIB="$("$VENV/bin/python" -c 'import nvidia.cuda_nvrtc as m; print(list(m.__path__)[0])')/lib"
PTXAS="$("$VENV/bin/python" -c 'import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])')/bin/ptxas"
export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

step "compile every CUDA kernel for $ARCHS (errors and warnings fail)"
PTXAS_ARGS=()
if [ -x "$PTXAS" ]; then
    PTXAS_ARGS=(--ptxas "$PTXAS")
else
    echo "ptxas not found: registers and spills are not reported"
fi
cargo run --locked --release -p specula-backend-cuda --bin nvrtc-check -- --arch "$ARCHS" "${PTXAS_ARGS[@]}"

step "the workspace builds with the cuda feature (no CUDA needed)"
cargo build --locked -p specula-sampler --features cuda

step "the NCCL engine of sharded sampling compiles (a one-rank check runs on a GPU machine below)"
cargo build --locked -p specula-shard --features nccl --tests

step "backend-cuda unit tests and the host build of common.cuh"
cargo test --locked -p specula-backend-cuda

if [ "${SPECULA_CUDA_SKIP_EMULATION:-0}" != "1" ]; then
    step "the kernels on the host emulator against the CPU reference"
    # The emulated tests run when SPECULA_REQUIRE names cuda-emulator (a missing compiler fails).
    SPECULA_REQUIRE="${SPECULA_REQUIRE:+$SPECULA_REQUIRE,}cuda-emulator" \
        cargo test --locked -p specula-backend-cuda --test emulated_kernels
fi

have_gpu=0
if [ "${SPECULA_CUDA_GPU:-}" = "1" ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    have_gpu=1
fi
if [ "$have_gpu" != "1" ]; then
    step "no NVIDIA GPU here: conformance reports cuda as skipped (with its reason)"
    cargo test --locked -p specula-conformance --test conformance -- cuda:: 2>&1 | tail -n 3
    exit 0
fi

step "conformance on the GPU (SPECULA_REQUIRE=cuda: a missing device fails)"
nvidia-smi -L
SPECULA_REQUIRE=cuda cargo test --locked --release -p specula-conformance --test conformance -- cuda::
SPECULA_REQUIRE=cuda cargo test --locked --release -p specula-backend-cuda --test runner_stream

step "driver calls per op after the warm-up (0 allocations, 0 synchronisations), the captured step"
SPECULA_REQUIRE=cuda cargo test --locked --release -p specula-backend-cuda --test driver_counts
SPECULA_REQUIRE=cuda cargo run --locked --release -p specula-conformance --bin specula -- run --backend cuda

step "sharded sampling over a one-rank NCCL communicator (SPECULA_REQUIRE=nccl: a missing NCCL fails)"
SPECULA_REQUIRE=nccl cargo test --locked --release -p specula-shard --features nccl --test nccl

step "benchmarks on the GPU: host, kernel and end-to-end time per op next to the device read floor"
cargo run --locked --release -p specula-conformance --bin specula -- bench --quick --backend cuda --graph --json target/bench-cuda-quick.json
cargo run --locked --release -p specula-conformance --bin specula -- bench --backend cuda,cpu --graph --json target/bench-cuda.json
