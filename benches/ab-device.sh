#!/usr/bin/env bash
# Two fusebox builds side by side on the device path, no VM:
#   benches/ab-device.sh OLD_FUSEBOX NEW_FUSEBOX [ROUNDS [SECS [WORKLOAD [DEPTH]]]]
# Each round starts each daemon (order alternating) on the bench share
# (EXT4_DIR, default /var/tmp/fusebox-bench/share, with a 256 MiB `data`
# file made once), drives it with target/release/fusebox-load (one thread,
# DEPTH chains in flight, as a guest kernel) and prints fusebox-load's
# line: workload depth ops/s MB/s p50 p99 daemon-CPU/op load-CPU/op (µs).
# Compare within a round: this machine's speed moves between rounds.
set -euo pipefail
old=$1 new=$2 rounds=${3:-6} secs=${4:-5} wl=${5:-randread} depth=${6:-16}
root=$(cd "$(dirname "$0")/.." && pwd)
load=$root/target/release/fusebox-load
share=${EXT4_DIR:-/var/tmp/fusebox-bench/share}
[ -x "$load" ] || (cd "$root" && cargo build --release -q -p fusebox)
mkdir -p "$share"
[ -f "$share/data" ] || head -c $((256 << 20)) /dev/urandom >"$share/data"
sock=$(mktemp -u /tmp/fusebox-ab.XXXXXX.sock)
for ((r = 1; r <= rounds; r++)); do
	order=(old new)
	((r % 2)) || order=(new old)
	for who in "${order[@]}"; do
		bin=$old
		[ "$who" = new ] && bin=$new
		cat "$share/data" >/dev/null
		rm -f "$sock"
		"$bin" --socket-path "$sock" --shared-dir "$share" --cache never \
			--sandbox none --seccomp none --log-level error 2>/dev/null &
		pid=$!
		for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.025; done
		line=$("$load" --socket-path "$sock" --workload "$wl" --depth "$depth" \
			--seconds "$secs" --file data --file-mib 256 --daemon-pid "$pid" --terse) || line="failed"
		kill "$pid" 2>/dev/null || true
		while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
		echo "round $r $who: $line"
	done
done
rm -f "$sock"
