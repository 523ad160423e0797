#!/usr/bin/env bash
# pjdfstest (the Rust port) against fusebox's host mount of a fresh tmpfs.
# Usage: tests/conformance/pjdfstest.sh [extra fusebox mount options...]
# Prints the pass/fail counts; exits non-zero if any test failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v pjdfstest >/dev/null || cargo install --quiet --locked pjdfstest
# The suite switches to these users (see pjdfstest.toml).
id tests >/dev/null 2>&1 || useradd -M -U -s /usr/sbin/nologin tests

cargo build -q --release -p fusebox
work=$(mktemp -d /tmp/fusebox-pjd.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/share" "$work/mnt"
mount -t tmpfs -o size=256m fusebox-pjd "$work/share"
chmod 755 "$work/share"
target/release/fusebox mount --shared-dir "$work/share" "$work/mnt" "$@" >"$work/log" 2>&1 &
daemon=$!
cleanup() {
  kill -INT "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  umount -l "$work/mnt" 2>/dev/null || true
  umount -l "$work/share" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do
  grep -q " $work/mnt fuse.fusebox " /proc/mounts && break
  sleep 0.05
done
grep -q " $work/mnt fuse.fusebox " /proc/mounts || { cat "$work/log"; exit 1; }

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
