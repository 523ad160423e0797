#!/usr/bin/env bash
# Soak through the host mount: one fsx run of OPS operations, then four
# fsx runs at once on distinct files (OPS/4 each), every operation on
# (tests/conformance/fsx.toml), fixed seeds, against one fusebox mount.
# CI runs the short default; FUSEBOX_SOAK=1 runs 1,000,000 operations.
# Usage: tests/soak/fsx-host.sh [OPS] [extra fusebox mount options...]
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${FUSEBOX_SOAK:-}" ]; then default=1000000; else default=40000; fi
ops=${1:-$default}
shift || true
command -v fsx >/dev/null || cargo install --quiet --locked fsx
source tests/conformance/mount.sh

run() { # NAME OPS SEED
	fsx -f tests/conformance/fsx.toml -N "$2" -S "$3" -P "$work/artifacts/$1" "$work/mnt/$1" \
		>"$work/$1.out" 2>&1
}
mkdir -p "$work/artifacts"/{one,p1,p2,p3,p4}
# fsx 0.3.2 never unmaps what its mapread maps (domapread has no munmap),
# so beyond ~360,000 operations it runs into vm.max_map_count (65,530)
# and dies with ENOMEM from mmap. Long runs get room for its leak.
old_maps=$(cat /proc/sys/vm/max_map_count)
if [ "$ops" -gt 200000 ] && [ "$old_maps" -lt $((ops + 65530)) ]; then
	echo $((ops + 65530)) > /proc/sys/vm/max_map_count
fi
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
echo "$old_maps" > /proc/sys/vm/max_map_count
[ $fail = 0 ] && [ $pfail = 0 ]
