#!/usr/bin/env bash
# pjdfstest (the Rust port) against fusebox's host mount of a fresh tmpfs.
# Usage: tests/conformance/pjdfstest.sh [extra fusebox mount options...]
# Prints the pass/fail counts; exits non-zero if any test failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v pjdfstest >/dev/null || cargo install --quiet --locked pjdfstest
# The suite switches to these users (see pjdfstest.toml).
id tests >/dev/null 2>&1 || useradd -M -U -s /usr/sbin/nologin tests

source tests/conformance/mount.sh

cd "$work/mnt"
set +e
pjdfstest -c "$OLDPWD/tests/conformance/pjdfstest.toml" -p "$work/mnt" >"$work/out" 2>&1
rc=$?
set -e
cd "$OLDPWD"
grep -E "FAILED" "$work/out" || true
summary=$(grep -E "^Summary:" "$work/out" || echo "Summary: missing (pjdfstest exited $rc)")
echo "pjdfstest via fusebox mount $*: $summary"
[ "$rc" -eq 0 ]
