#!/usr/bin/env bash
# The main job of the README: a speculative and a plain decoding loop on the CPU reference backend,
# checked to emit the same tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --locked -p specula-sampler --example decode_loop -- "$@"
