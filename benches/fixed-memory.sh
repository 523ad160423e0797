#!/usr/bin/env bash
# fusebox with guest RAM as io_uring fixed buffers (--fixed-guest-memory)
# vs without, side by side in one run, with no VM: fusebox-load (the
# engine as the guest) drives each over its vhost-user socket with the
# data file opened O_DIRECT, on an ext4 image (files there take
# non-blocking I/O, so the data goes through the ring; on tmpfs it would
# not). Needs root (loop mount).
#
#   benches/fixed-memory.sh [SECONDS] [ROUNDS]
#
# Each row runs ROUNDS times, alternating, and reports the median ops/s of
# each and their ratio (fixed / plain).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$root/scripts/lib.sh"
secs=${1:-5}
rounds=${2:-3}
build_fusebox
fb=$root/target/release/fusebox
load=$root/target/release/fusebox-load
work=$(mktemp -d /tmp/fusebox-fixed-bench.XXXXXX)
mkdir -p "$work/share"
truncate -s 1g "$work/fs.img"
mkfs.ext4 -q -F "$work/fs.img"
mount -o loop "$work/fs.img" "$work/share"
trap 'pkill -f "$work/sock" 2>/dev/null || true; umount "$work/share"; rm -rf "$work"' EXIT

# one MODE WORKLOAD DEPTH -> ops/s
one() {
	rm -f "$work/sock"
	local extra=()
	[ "$1" = fixed ] && extra=(--fixed-guest-memory)
	"$fb" --socket-path "$work/sock" --shared-dir "$work/share" --cache auto --sandbox none \
		--seccomp none --log-level warn "${extra[@]}" 2>>"$work/fusebox.log" &
	local pid=$!
	wait_socket "$work/sock" 100 0.05 || true
	"$load" --socket-path "$work/sock" --workload "$2" --depth "$3" --seconds "$secs" \
		--file-mib 256 --direct --terse | awk '{print $3}'
	wait "$pid" 2>/dev/null || true
}

printf 'O_DIRECT on ext4, %ss per run, %s rounds (%s)\n' "$secs" "$rounds" "$(date -u +%F)"
printf '%-10s %5s %14s %14s %8s\n' workload depth fixed plain ratio
for row in "randread 1" "randread 16" "randwrite 1" "randwrite 16" "seqread 4" "seqwrite 4"; do
	set -- $row
	f=() p=()
	for _ in $(seq "$rounds"); do
		f+=("$(one fixed "$1" "$2")")
		p+=("$(one plain "$1" "$2")")
	done
	fm=$(printf '%s\n' "${f[@]}" | median)
	pm=$(printf '%s\n' "${p[@]}" | median)
	printf '%-10s %5s %14s %14s %8s\n' "$1" "$2" "$fm" "$pm" "$(awk -v a="$fm" -v b="$pm" 'BEGIN {printf "%.2f", a / b}')"
done
