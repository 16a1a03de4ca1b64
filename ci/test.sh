#!/usr/bin/env bash
# The whole test suite, as the README's test command runs it: formatting, lints, every test of the
# workspace, the doc tests and the runner examples. Runnable locally from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, all features, warnings are errors)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "cargo test --workspace"
cargo test --workspace --all-features --locked

step "examples"
cargo run --locked -p specula-sampler --example decode_loop
