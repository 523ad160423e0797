#!/usr/bin/env bash
# Memory with every queue full: fusebox with 4 request queues of 1,024
# descriptors, driven by fusebox-load with as many requests in flight as
# the queues hold (256 per queue: a chain takes up to four descriptors,
# as a Linux guest's READ and WRITE chains do), 4 KiB random
# reads and then 1 MiB writes, on a tmpfs share. Reports the daemon's peak
# RSS (VmHWM) and, at the end, its anonymous (own) and shared (guest
# memory it touched) resident memory, its threads, and the largest number
# of requests it held at once (admission keeps the rest in the avail
# rings). Needs root (tmpfs mount).
#
#   benches/rss.sh [SECONDS]   (FUSEBOX_BIN: another fusebox build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$root/scripts/lib.sh"
secs=${1:-5}
build_fusebox
fb=${FUSEBOX_BIN:-$root/target/release/fusebox}
load=$root/target/release/fusebox-load
work=$(mktemp -d /tmp/fusebox-rss.XXXXXX)
mkdir -p "$work/share"
mount -t tmpfs -o size=2g tmpfs "$work/share"
trap 'kill $pid 2>/dev/null || true; umount "$work/share"; rm -rf "$work"' EXIT
status() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
for wl in randread seqwrite; do
	rm -f "$work/sock"
	"$fb" --socket-path "$work/sock" --shared-dir "$work/share" --queues 4 --queue-size 1024 \
		--sandbox none --seccomp none --log-level info 2>"$work/fusebox.log" &
	pid=$!
	wait_socket "$work/sock" 100 0.05 || true
	maxthreads=0
	"$load" --socket-path "$work/sock" --queues 4 --queue-size 1024 --depth 256 \
		--workload "$wl" --seconds "$secs" --file-mib 64 --terse > "$work/load.out" &
	lpid=$!
	hwm=0 anon=0 shm=0
	while kill -0 "$lpid" 2>/dev/null; do
		# Sampled while it runs: the daemon exits when the frontend goes.
		if [ -r "/proc/$pid/status" ]; then
			t=$(status "$pid" Threads) h=$(status "$pid" VmHWM) a=$(status "$pid" RssAnon) m=$(status "$pid" RssShmem)
			[ "${t:-0}" -gt "$maxthreads" ] && maxthreads=$t
			[ "${h:-0}" -gt "$hwm" ] && hwm=$h
			[ "${a:-0}" -gt "$anon" ] && anon=$a
			[ "${m:-0}" -gt "$shm" ] && shm=$m
			kill -USR1 "$pid" 2>/dev/null || true
		fi
		sleep 0.25
	done
	wait "$lpid"
	inflight=$(grep -oE 'in-flight [0-9]+' "$work/fusebox.log" | awk '{print $2}' | sort -n | tail -1)
	echo "rss: $wl, 4 queues x 1024 descriptors, depth 256 per queue: $(cat "$work/load.out"); fusebox peak RSS ${hwm} kB (at most ${anon} kB anonymous, ${shm} kB of guest memory), at most ${maxthreads} threads, at most ${inflight:-?} requests in flight on one queue"
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
done
