#!/usr/bin/env bash
# Two fusebox builds side by side on the device path, no VM:
#   benches/ab-device.sh OLD_FUSEBOX NEW_FUSEBOX [ROUNDS [SECS [WORKLOAD [DEPTH]]]]
# Each round starts each daemon (order alternating) on the bench share
# (EXT4_DIR, default /var/tmp/fusebox-bench/share, with a 256 MiB `data`
# file made once), drives it with target/release/fusebox-load (one thread,
# DEPTH chains in flight, as a guest kernel) and prints fusebox-load's
# line: workload depth ops/s MB/s p50 p99 daemon-CPU/op load-CPU/op (µs).
# COLD=1: reads of a 4 GiB file (fusebox-bench-4g.dat in the share, made
# once) whose page cache is dropped before each run (fusebox-load --cold),
# as vhost-load.sh's randread-16-cold row. OLD and NEW may be wrappers
# that exec a build with more options (exec: the daemon's CPU is read from
# the pid started, and only that pid is killed).
# Compare within a round: this machine's speed moves between rounds.
set -euo pipefail
old=$1 new=$2 rounds=${3:-6} secs=${4:-5} wl=${5:-randread} depth=${6:-16}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$root/scripts/lib.sh"
load=$root/target/release/fusebox-load
share=${EXT4_DIR:-/var/tmp/fusebox-bench/share}
[ -x "$load" ] || build_fusebox
mkdir -p "$share"
cold=${COLD:-0}
if [ "$cold" = 1 ]; then
	# Made whole or made again (an interrupted write leaves it short).
	ensure_file "$share/fusebox-bench-4g.dat" 4096
	file=(--file fusebox-bench-4g.dat --file-mib 4096 --cold --host-dir "$share")
else
	[ -f "$share/data" ] || head -c $((256 << 20)) /dev/urandom >"$share/data"
	file=(--file data --file-mib 256)
fi
sock=$(mktemp -u /tmp/fusebox-ab.XXXXXX.sock)
for ((r = 1; r <= rounds; r++)); do
	order=(old new)
	((r % 2)) || order=(new old)
	for who in "${order[@]}"; do
		bin=$old
		[ "$who" = new ] && bin=$new
		[ "$cold" = 1 ] || cat "$share/data" >/dev/null
		rm -f "$sock"
		"$bin" --socket-path "$sock" --shared-dir "$share" --cache never \
			--sandbox none --seccomp none --log-level error 2>/dev/null &
		pid=$!
		wait_socket "$sock" 200 0.025 || true
		line=$("$load" --socket-path "$sock" --workload "$wl" --depth "$depth" \
			--seconds "$secs" "${file[@]}" --daemon-pid "$pid" --terse) || line="failed"
		kill "$pid" 2>/dev/null || true
		while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
		echo "round $r $who: $line"
	done
done
rm -f "$sock"
