#!/usr/bin/env bash
# fsx (the Rust port) with every operation on (mmap, truncate, fsync,
# fdatasync, fallocate, punch hole, sendfile, fadvise, copy_file_range)
# against fusebox's host mount of a fresh tmpfs, with a fixed seed.
# Usage: tests/conformance/fsx.sh OPS SEED [extra fusebox mount options...]
set -euo pipefail
cd "$(dirname "$0")/../.."
ops=${1:-100000}
seed=${2:-1}
shift 2 || true
command -v fsx >/dev/null || cargo install --quiet --locked fsx

cargo build -q --release -p fusebox
work=$(mktemp -d /tmp/fusebox-fsx.XXXXXX)
mkdir -p "$work/share" "$work/mnt" "$work/artifacts"
mount -t tmpfs -o size=256m fusebox-fsx "$work/share"
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

set +e
fsx -f tests/conformance/fsx.toml -N "$ops" -S "$seed" -P "$work/artifacts" "$work/mnt/fsxfile" >"$work/out" 2>&1
rc=$?
set -e
tail -n 40 "$work/out" | grep -v "^   [0-9]*:\|^  *at "
echo "fsx via fusebox mount $*: $ops operations, seed $seed: $( [ "$rc" -eq 0 ] && echo A-OK || echo FAILED)"
[ "$rc" -eq 0 ]
