#!/usr/bin/env bash
# User-space instructions per request of a vhost-user-fs daemon, counted by
# callgrind (deterministic: not at the mercy of a noisy machine's timing).
#   benches/callgrind-op.sh DAEMON [WORKLOAD [DEPTH]]
# DAEMON is a fusebox or virtiofsd binary; WORKLOAD a fusebox-load workload
# (default randread), DEPTH its depth (default 16). The daemon runs under
# `valgrind --tool=callgrind` (--cache never --sandbox none --seccomp none,
# on the ext4 bench share EXT4_DIR, default /var/tmp/fusebox-bench/share,
# with its 256 MiB `data` file, read into the page cache first) while
# target/release/fusebox-load drives it, once for LONG seconds and once for SHORT (default 8 and 2); the
# instructions per request are the difference of the two runs' totals
# over the difference of their requests, so the start-up cost cancels.
# CACHE=1 also simulates the caches (--cache-sim=yes, the sizes of this
# machine's CPU) and prints the instruction-cache misses per request
# (I1mr: the code a request runs through that was not in the 32 KiB L1i)
# and the data-cache misses (D1mr+D1mw).
# Needs valgrind (apt-get install valgrind).
set -euo pipefail
bin=$1 wl=${2:-randread} depth=${3:-16}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$root/scripts/lib.sh"
load=$root/target/release/fusebox-load
share=${EXT4_DIR:-/var/tmp/fusebox-bench/share}
[ -x "$load" ] || build_fusebox
[ -f "$share/data" ] || head -c $((256 << 20)) /dev/urandom >"$share/data"
# Warm: every read is served from the page cache.
cat "$share/data" >/dev/null
# Under callgrind fusebox runs many times slower: its in-line chunks are
# cut after CHUNK_TIME_US (default 20 ms) rather than 50 µs, so they are
# as long as at full speed (a build without the option runs as it is).
extra=()
if "$bin" --help 2>/dev/null | grep -q -- --chunk-time-us; then
	extra=(--chunk-time-us "${CHUNK_TIME_US:-20000}")
fi
work=$(mktemp -d /tmp/callgrind-op.XXXXXX)
trap 'rm -rf "$work"' EXIT

sim=()
[ "${CACHE:-0}" = 1 ] && sim=(--cache-sim=yes)

# run SECONDS: prints "requests instructions [I1-misses D1-misses]"
run() {
	local secs=$1 sock=$work/s.$1.sock out=$work/cg.$1.out pid
	valgrind --tool=callgrind "${sim[@]}" --callgrind-out-file="$out" "$bin" --socket-path "$sock" \
		--shared-dir "$share" --cache never --sandbox none --seccomp none "${extra[@]}" \
		>"$work/daemon.$secs.log" 2>&1 &
	pid=$!
	wait_socket "$sock" 300 || true
	"$load" --socket-path "$sock" --workload "$wl" --depth "$depth" --seconds "$secs" \
		--file data --file-mib 256 >"$work/load.$secs.txt"
	sleep 1
	kill -INT "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	local ops totals
	ops=$(grep -o '([0-9]* ops' "$work/load.$secs.txt" | tr -dc 0-9)
	# Ir, and with the simulation Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw,
	# each followed by its percentage.
	totals=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !n++ {
		for (i = 1; i < NF; i += 2) { v = $i; gsub(",", "", v); printf "%s ", v } }')
	# shellcheck disable=SC2086
	set -- $totals
	if [ "${#sim[@]}" -gt 0 ]; then
		echo "$ops $1 $4 $(($5 + $6))"
	else
		echo "$ops $1"
	fi
}

read -r ops_l ir_l i1_l d1_l < <(run "${LONG:-8}")
read -r ops_s ir_s i1_s d1_s < <(run "${SHORT:-2}")
n=$((ops_l - ops_s))
line="$(basename "$bin") $wl depth $depth: $(((ir_l - ir_s) / n)) instructions per request"
if [ "${#sim[@]}" -gt 0 ]; then
	line+=", $(((i1_l - i1_s) / n)) L1i misses, $(((d1_l - d1_s) / n)) L1d misses"
fi
echo "$line ($ops_l and $ops_s requests)"
