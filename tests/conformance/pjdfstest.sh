#!/usr/bin/env bash
# pjdfstest (the Rust port) against fusebox's host mount of a fresh tmpfs.
# Usage: tests/conformance/pjdfstest.sh [extra fusebox mount options...]
# Prints the pass/fail counts; exits non-zero if any test failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../../scripts/lib.sh
source scripts/lib.sh
cargo_install_missing pjdfstest
# The suite switches to these users (see pjdfstest.toml).
add_tests_user

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
if [ "$rc" -ne 0 ]; then
  # What the failures said (panic messages and the like).
  grep -vE "^[a-z0-9_:]+ +ok$" "$work/out" | head -60 || true
  # One rerun of each failed test alone, reported as such: the etxtbsy
  # tests exec a file they have just written, and a fork elsewhere on a
  # loaded machine can still hold that file open for writing (ETXTBSY on
  # the exec itself). A real failure fails again.
  failed=$(awk '/FAILED$/ {print $1}' "$work/out")
  [ -n "$failed" ] || exit 1
  rc=0
  for t in $failed; do
    if (cd "$work/mnt" && pjdfstest -c "$OLDPWD/tests/conformance/pjdfstest.toml" -p "$work/mnt" "$t" >"$work/rerun" 2>&1); then
      echo "pjdfstest: $t failed in the full run and passed alone (flaky)"
    else
      echo "pjdfstest: $t failed again alone:"; tail -20 "$work/rerun"; rc=1
    fi
  done
fi
[ "$rc" -eq 0 ]
