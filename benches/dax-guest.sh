#!/usr/bin/env bash
# Reads through the DAX window against reads through FUSE, in one TCG
# guest (Linux 6.12, QEMU 11.1.3's generic vhost-user device:
# scripts/qemu-shmem.sh), same files, fusebox each time:
#   benches/dax-guest.sh [ROUNDS]
# Configurations, alternating per round: `dax` (--cache-size 512M, the
# share mounted -o dax=inode), and without a window `always` (--cache
# always: the guest keeps what it read in its own page cache, across
# opens), `auto` (--cache auto: each open drops the guest's cached pages
# of the file, as virtiofsd's auto does) and `never` (--cache never:
# every read is a FUSE READ). The file is a 64 MiB one
# (a whole number of 2 MiB ranges, so -o dax=inode maps it), read into
# the host's page cache first. In the guest: one read of the whole file
# (1 MiB reads), with the growth of the guest's page cache (Cached in
# /proc/meminfo) it caused; then three more whole reads (guestcheck
# seqread, 1 MiB reads: MB/s) and three
# runs of 3 s of 4 KiB reads at random offsets (guestcheck randread). On
# the host: how much of the file the host's page cache holds (fincore).
# Prints one line per run and the medians per configuration.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$root/scripts/lib.sh"
rounds=${1:-2}
setup_guest --backports
qemu=$("$root/scripts/qemu-shmem.sh" | tail -1)
vfs_device="vhost-user-test-device-pci,chardev=vfs,virtio-id=26,num_vqs=2,vq_size=1024,config_size=40"
build_fusebox
fusebox=$root/target/release/fusebox
new_work dax-bench
cat > "$work/extra/daxbench.sh" <<'EOF'
M=$1
f=$M/bench.bin
c0=$(awk '/^Cached:/ {print $2}' /proc/meminfo)
dd if="$f" of=/dev/null bs=1M 2>/dev/null
c1=$(awk '/^Cached:/ {print $2}' /proc/meminfo)
echo "BENCH guest-cache-growth-kib $((c1 - c0))"
for i in 1 2 3; do echo "BENCH $(/guestcheck seqread "$f")"; done
for i in 1 2 3; do echo "BENCH $(/guestcheck randread "$f" 3)"; done
EOF
add_to_initrd "$work/extra"
head -c $((64 << 20)) /dev/urandom > "$share/bench.bin"

out=$work/results
: > "$out"
run() { # CONFIG
	local cfg=$1 args mount=
	case $cfg in
	dax) args="--cache auto --cache-size 512M" mount=" fusebox.mount=dax=inode" ;;
	always) args="--cache always" ;;
	auto) args="--cache auto" ;;
	never) args="--cache never" ;;
	esac
	cat "$share/bench.bin" > /dev/null
	# shellcheck disable=SC2086 # $args is a list of options
	start_daemon "$fusebox" --socket-path "$sock" --shared-dir "$share" --tag share \
		--sandbox none --seccomp none $args
	start_qemu 600 "fusebox.run=daxbench$mount" -no-reboot
	wait_qemu dax-bench
	wait_fusebox_exit dax-bench
	local growth seq rr host bench
	bench=$(tr -d '\r' < "$work/console.log" | grep -a 'BENCH' || true)
	[ -n "$bench" ] || { echo "dax-bench: $cfg: no result"; tail -20 "$work/console.log"; exit 1; }
	growth=$(echo "$bench" | awk '/guest-cache-growth-kib/ {print $3}')
	seq=$(echo "$bench" | awk '/SEQREAD/ {printf "%.0f\n", $4 / $6}' | median %.0f)
	rr=$(echo "$bench" | awk '/RANDREAD/ {printf "%.0f\n", $4 * 1e6 / $6}' | median %.0f)
	host=$(fincore -b -n -o RES "$share/bench.bin" | awk '{printf "%.0f", $1 / 1048576}')
	echo "$cfg guest-cache-growth-MiB $((${growth:-0} / 1024)) seq-MB/s ${seq:-n/a} randread-ops/s ${rr:-n/a} host-cache-MiB $host" | tee -a "$out"
}
for ((r = 1; r <= rounds; r++)); do
	for cfg in dax always auto never; do run $cfg; done
done
echo "== medians of $rounds round(s)"
for cfg in dax always auto never; do
	line="$cfg"
	for col in 3 5 7 9; do
		line+=" $(awk -v c="$cfg" -v k="$col" '$1 == c {print $(k - 1) "=" $k}' "$out" | head -1 | cut -d= -f1)=$(awk -v c="$cfg" -v k="$col" '$1 == c {print $k}' "$out" | median)"
	done
	echo "$line"
done
