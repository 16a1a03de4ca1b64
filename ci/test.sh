#!/usr/bin/env bash
# The whole test suite, as the README's test command runs it: formatting, lints, every test of the
# workspace (the conformance harness included), the doc tests, the runner examples and
# `specula run --quick`. Runnable locally from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, all features, warnings are errors)"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --locked

step "cargo test --workspace"
cargo test --workspace --all-features --locked

step "examples"
cargo run --locked -p specula-sampler --example decode_loop

step "specula run --quick (the conformance command, quick cases, every available backend)"
cargo run --locked -p specula-conformance --bin specula -- run --quick
