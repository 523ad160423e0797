#!/usr/bin/env bash
# Soak through the host mount: one fsx run of OPS operations, then four
# fsx runs at once on distinct files (OPS/4 each), every operation on
# (tests/conformance/fsx.toml), fixed seeds, against one fusebox mount.
# CI runs the short default; FUSEBOX_SOAK=1 runs 1,000,000 operations.
# Usage: tests/soak/fsx-host.sh [OPS] [extra fusebox mount options...]
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../../scripts/lib.sh
source scripts/lib.sh
if [ -n "${FUSEBOX_SOAK:-}" ]; then default=1000000; else default=40000; fi
ops=${1:-$default}
shift || true
cargo_install_missing fsx
source tests/conformance/mount.sh

# fsx 0.3.2 never unmaps what its mapread maps (domapread has no munmap):
# the mappings pile up, every truncate walks them, and beyond ~360,000
# operations mmap fails with ENOMEM at vm.max_map_count. So a long run is
# a chain of fsx runs of at most 100,000 operations each on the same file,
# the seed moving on each time.
run() { # NAME OPS SEED
	local n=0 k=0 c
	while [ "$n" -lt "$2" ]; do
		c=$(($2 - n)); [ "$c" -gt 100000 ] && c=100000
		fsx -f tests/conformance/fsx.toml -N "$c" -S $(($3 + 100 * k)) -P "$work/artifacts/$1" \
			"$work/mnt/$1" >"$work/$1.out" 2>&1 || return 1
		n=$((n + c)) k=$((k + 1))
		[ "$2" -gt 100000 ] && echo "soak: $1: $n of $2 operations A-OK ($(( $(date +%s) - start )) s)"
	done
	return 0
}
mkdir -p "$work/artifacts"/{one,p1,p2,p3,p4}
fail=0
start=$(date +%s)
run one "$ops" 11 || { echo "fsx one: FAILED"; tail -20 "$work/one.out"; fail=1; }
echo "soak: 1 fsx, $ops operations: $( [ $fail = 0 ] && echo A-OK || echo FAILED) ($(( $(date +%s) - start )) s)"
start=$(date +%s)
pids=()
for i in 1 2 3 4; do run "p$i" $((ops / 4)) $((20 + i)) & pids+=($!); done
pfail=0
for i in 1 2 3 4; do
	wait "${pids[$((i - 1))]}" || { echo "fsx p$i: FAILED"; tail -20 "$work/p$i.out"; pfail=1; }
done
echo "soak: 4 parallel fsx on distinct files, $((ops / 4)) operations each: $( [ $pfail = 0 ] && echo A-OK || echo FAILED) ($(( $(date +%s) - start )) s)"
[ $fail = 0 ] && [ $pfail = 0 ]
