#!/usr/bin/env bash
# The test command: formatting, lints, unit/integration tests, loom models,
# the decoder fuzz harness and the docs. Everything runs on stable Rust.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy (warnings denied)"
cargo clippy --workspace --all-targets -- -D warnings

step "tests"
cargo test --workspace

step "loom models (fuse-core)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo clippy -p fuse-core --tests -- -D warnings
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p fuse-core --test loom --release

step "decoder fuzz harness (${FUSEBOX_FUZZ_ITERS:=5000000} inputs)"
FUSEBOX_FUZZ_ITERS="$FUSEBOX_FUZZ_ITERS" cargo test -p fuse-core --release --test decode_fuzz

step "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

step "embedded demo"
cargo run -q -p fuse-core --example demo
