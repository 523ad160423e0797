#!/usr/bin/env bash
# fusebox vs virtiofsd, side by side in one run, with no VM: the same
# fusebox-load frontend (the engine as the guest) drives each daemon over
# its vhost-user socket, sharing the same tmpfs directory (so the backend,
# not the disk, is measured). Needs root (tmpfs mount) and virtiofsd:
#   apt-get install libcap-ng-dev libseccomp-dev && cargo install virtiofsd
#
#   benches/vhost-load.sh [SECONDS] [ROUNDS]
#
# Each row runs ROUNDS times, alternating the daemons, and reports the
# median ops/s of each and their ratio.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-5}
rounds=${2:-3}
vfsd=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
[ -x "$vfsd" ] || { echo "virtiofsd not found (cargo install virtiofsd)" >&2; exit 1; }
(cd "$root" && cargo build --release -q -p fusebox)
fb=$root/target/release/fusebox
load=$root/target/release/fusebox-load
work=$(mktemp -d /tmp/fusebox-vhost-bench.XXXXXX)
mkdir -p "$work/share"
mount -t tmpfs -o size=2g tmpfs "$work/share"
trap 'pkill -f "$work/sock" 2>/dev/null || true; umount "$work/share"; rm -rf "$work"' EXIT

start() {
	rm -f "$work/sock"
	case $1 in
		fusebox) "$fb" --socket-path "$work/sock" --shared-dir "$work/share" --cache auto --sandbox none --seccomp none \
			--log-level warn 2>>"$work/fusebox.log" & ;;
		virtiofsd) "$vfsd" --socket-path "$work/sock" --shared-dir "$work/share" --cache auto \
			--sandbox none --seccomp none --log-level warn 2>>"$work/virtiofsd.log" & ;;
	esac
	for _ in $(seq 100); do [ -S "$work/sock" ] && return; sleep 0.05; done
	echo "$1 did not listen" >&2; exit 1
}

# one DAEMON WORKLOAD DEPTH -> ops/s
one() {
	start "$1"
	local pid=$!
	"$load" --socket-path "$work/sock" --workload "$2" --depth "$3" --seconds "$secs" \
		--file-mib 256 --terse | awk '{print $3}'
	wait "$pid" 2>/dev/null || true
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf '%-10s %5s %14s %14s %8s\n' workload depth fusebox virtiofsd ratio
for row in "randread 1" "randread 16" "randwrite 1" "randwrite 16" "seqread 4" "seqwrite 4" "meta 4"; do
	set -- $row
	f=() v=()
	for _ in $(seq "$rounds"); do
		f+=("$(one fusebox "$1" "$2")")
		v+=("$(one virtiofsd "$1" "$2")")
	done
	fm=$(printf '%s\n' "${f[@]}" | median)
	vm=$(printf '%s\n' "${v[@]}" | median)
	printf '%-10s %5s %14s %14s %8s\n' "$1" "$2" "$fm" "$vm" "$(awk -v a="$fm" -v b="$vm" 'BEGIN {printf "%.2f", a / b}')"
done
echo "(ops/s, median of $rounds runs of ${secs}s each; seqread/seqwrite ops are 1 MiB, meta ops are create+stat+unlink)"
