#!/usr/bin/env bash
# The main job of the README: the conformance suite over every backend available on this machine
# (the CPU reference always), full-size cases; prints the op × backend table and a verdict, and
# exits non-zero if any trial failed. Extra arguments go to `specula run` (e.g. --quick, --json FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
# Vulkan loaders (lavapipe) want a runtime directory; a bare shell may not have one.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  export XDG_RUNTIME_DIR
fi
cargo run --release --locked -p specula-conformance --bin specula -- run "$@"
