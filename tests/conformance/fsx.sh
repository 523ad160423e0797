#!/usr/bin/env bash
# fsx (the Rust port) with every operation on (mmap, truncate, fsync,
# fdatasync, fallocate, punch hole, sendfile, fadvise, copy_file_range)
# against fusebox's host mount of a fresh tmpfs, with a fixed seed.
# Usage: tests/conformance/fsx.sh OPS SEED [extra fusebox mount options...]
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../../scripts/lib.sh
source scripts/lib.sh
ops=${1:-100000}
seed=${2:-1}
shift 2 || true
cargo_install_missing fsx

source tests/conformance/mount.sh

set +e
fsx -f tests/conformance/fsx.toml -N "$ops" -S "$seed" -P "$work/artifacts" "$work/mnt/fsxfile" >"$work/out" 2>&1
rc=$?
set -e
tail -n 40 "$work/out" | grep -v "^   [0-9]*:\|^  *at "
echo "fsx via fusebox mount $*: $ops operations, seed $seed: $( [ "$rc" -eq 0 ] && echo A-OK || echo FAILED)"
[ "$rc" -eq 0 ]
