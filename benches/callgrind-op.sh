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

# run SECONDS: prints "requests instructions"
run() {
	local secs=$1 sock=$work/s.$1.sock out=$work/cg.$1.out pid
	valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --socket-path "$sock" \
		--shared-dir "$share" --cache never --sandbox none --seccomp none "${extra[@]}" \
		>"$work/daemon.$secs.log" 2>&1 &
	pid=$!
	wait_socket "$sock" 300 || true
	"$load" --socket-path "$sock" --workload "$wl" --depth "$depth" --seconds "$secs" \
		--file data --file-mib 256 >"$work/load.$secs.txt"
	sleep 1
	kill -INT "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	local ops ir
	ops=$(grep -o '([0-9]* ops' "$work/load.$secs.txt" | tr -dc 0-9)
	ir=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !n++ {gsub(",", "", $1); print $1}')
	echo "$ops $ir"
}

read -r ops_l ir_l < <(run "${LONG:-8}")
read -r ops_s ir_s < <(run "${SHORT:-2}")
echo "$(basename "$bin") $wl depth $depth: $(( (ir_l - ir_s) / (ops_l - ops_s) )) instructions per request ($ops_l and $ops_s requests)"
