#!/bin/bash
# Boots the test guest against fusebox and checks both sides.
#
#   tests/guest/run.sh [--backports] [--queues N] [--smp N] [--min-queues-used K]
#                      [--fusebox-args "ARGS"] [--fsx-ops N] [--fsx-parallel-ops P]
#                      [--as-user USER] [--dax]
#
# Sets up the guest (tests/guest/setup.sh), builds fusebox, shares a fresh
# directory with `--queues N`, boots QEMU TCG with memfd shared memory and
# `vhost-user-fs-pci,num-request-queues=N`, and runs tests/guest/suite.sh
# in the guest. Passes when the guest reports no failure, the host sees
# what the guest wrote (and the guest saw what the host wrote), and
# fusebox's counters show at least K request queues carried requests.
# --fsx-ops sets the guest's fsx soak (default 4000 operations), then four
# runs of P operations at once on distinct files (default a quarter of N).
# FUSEBOX_SOAK=1 makes it 1,000,000 then 4 x 100,000: fsx runs at about
# 240 operations/s in the TCG guest here (470/s for the four together) on
# a quiet machine, so that takes about 85 minutes. --as-user starts
# fusebox as USER (no capabilities, no groups; the shared directory is
# USER's): with the default --sandbox namespace it runs in a user
# namespace where guest root is USER, and guest chown to other ids fails
# (the suite checks that instead). The guest CPU is
# qemu64: TCG runs this guest's kernel 20-25% faster than with -cpu max.
# --dax serves a DAX window (--cache-size 64M) to the 6.12 guest through
# QEMU 11.1's generic vhost-user device (scripts/qemu-shmem.sh), mounted
# with -o dax=inode: the suite's dax-window check reads and writes a host
# file through the window, shares a mapping between two guest processes
# and sees a host write through a mapping; the host checks what it wrote
# there, that the guest's msync left no dirty page of the file in the
# host's page cache (there were some before it), and that fusebox mapped
# and unmapped ranges without an error.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../scripts/lib.sh
. "$here/../../scripts/lib.sh"
root=$(cd "$here/../.." && pwd)
setup_args=() queues=1 smp=2 min_used=1 fb_args="" fsx_ops=4000 fsx_par= as_user= dax=0
[ -n "${FUSEBOX_SOAK:-}" ] && fsx_ops=1000000 fsx_par=100000
while [ $# -gt 0 ]; do
	case $1 in
		--backports) setup_args+=(--backports) ;;
		--queues) queues=$2; shift ;;
		--smp) smp=$2; shift ;;
		--min-queues-used) min_used=$2; shift ;;
		--fusebox-args) fb_args=$2; shift ;;
		--fsx-ops) fsx_ops=$2; shift ;;
		--fsx-parallel-ops) fsx_par=$2; shift ;;
		--as-user) as_user=$2; shift ;;
		--dax) dax=1 setup_args+=(--backports) ;;
		*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
setup_guest "${setup_args[@]}"
dax_args=
if [ $dax = 1 ]; then
	qemu=$("$root/scripts/qemu-shmem.sh" | tail -1)
	vfs_device="vhost-user-test-device-pci,chardev=vfs,virtio-id=26,num_vqs=$((queues + 1)),vq_size=1024,config_size=40"
	dax_args="--tag share --cache-size 64M"
fi
build_fusebox
fusebox=$root/target/release/fusebox

new_work guest
umount_at=$share/submnt

# A submount inside the share: announced, it gets its own st_dev in the guest.
mkdir "$share/submnt"
mount -t tmpfs -o size=16m tmpfs "$share/submnt"
echo sub > "$share/submnt/marker"

# Confinement: a secret next to the share, and links in the share that
# point at it (the guest must never reach or change it).
secret="SECRET-$$-$(date +%s)"
echo "$secret" > "$work/outside-secret"
mkdir "$share/esc"
ln -s ../../outside-secret "$share/esc/rel"
ln -s "$work/outside-secret" "$share/esc/abs"

# The host's half of the 64 MiB check.
head -c $((64 << 20)) /dev/urandom > "$share/host64.bin"
sha256sum "$share/host64.bin" | cut -d' ' -f1 > "$share/host64.sha256"

# The host's half of the DAX check: a file of two 2 MiB ranges; its
# dirty and under-writeback pages in the host's page cache (cachestat(2))
# once the guest wrote through the window (dax-written) and once it
# flushed (dax-synced), each answered with a -seen file; and a write to it
# once the guest has it mapped (it makes dax-go). cachestat needs Linux
# 6.5 or later, and the share a disk file system (/tmp here is ext4; a
# tmpfs page never becomes clean): otherwise the check fails.
if [ $dax = 1 ]; then
	head -c $((4 << 20)) /dev/urandom > "$share/dax.bin"
	# Its pages clean, so the dirty ones the check finds are the guest's.
	sync "$share/dax.bin"
	sha256sum "$share/dax.bin" | cut -d' ' -f1 > "$share/dax.sha256"
	unflushed() {
		python3 - "$share/dax.bin" <<'EOF'
import ctypes, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
whole = (ctypes.c_uint64 * 2)(0, 0)
cs = (ctypes.c_uint64 * 5)()
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(451, fd, whole, cs, 0) != 0:  # cachestat
    sys.exit("cachestat: " + os.strerror(ctypes.get_errno()))
print(cs[1], cs[2])
EOF
	}
	(
		wait_until 9000 0.1 test -e "$share/dax-written" &&
			unflushed > "$work/dax-written" && : > "$share/dax-written-seen" &&
			wait_until 9000 0.1 test -e "$share/dax-synced" &&
			unflushed > "$work/dax-synced" && : > "$share/dax-synced-seen" &&
			wait_until 9000 0.1 test -e "$share/dax-go" &&
			printf HOSTDAX | dd of="$share/dax.bin" bs=1 seek=2101248 conv=notrunc 2>/dev/null
	) &
	dax_writer=$!
fi

# Started unprivileged: the shared directory (and the run's directory,
# where its socket goes) belong to that user.
runner=() unpriv=0
if [ -n "$as_user" ]; then
	id "$as_user" >/dev/null || { echo "guest-run: no user $as_user"; exit 1; }
	# The binary goes where the user can reach it (the checkout may not be).
	cp "$fusebox" "$work/fusebox"
	fusebox=$work/fusebox
	chown -R "$as_user": "$work"
	runner=(setpriv --reuid="$as_user" --regid="$(id -g "$as_user")" --init-groups --inh-caps=-all --)
	unpriv=1
fi

fsx_par=${fsx_par:-$((fsx_ops / 4))}
# The guest's ACL check runs when fusebox serves ACLs.
acl=0
case " $fb_args " in *" --posix-acl "*) acl=1 ;; esac

# Starts fusebox and boots the guest; returns when QEMU exits (qrc: its
# exit status).
vfs_opts=,num-request-queues=$queues,queue-size=1024
boot() {
	# FUSEBOX_WRAP runs fusebox under a tool (for example "strace -f -c -o FILE").
	start_daemon ${FUSEBOX_WRAP:-} "${runner[@]}" "$fusebox" --socket-path "$sock" --shared-dir "$share" --queues "$queues" --xattr \
		--announce-submounts --cache auto $dax_args $fb_args

	echo "guest-run: booting $("$qemu" --version | head -1), $queues request queue(s), $smp cpu(s)"
	start=$(date +%s)
	start_qemu $((1500 + (fsx_ops + 4 * fsx_par) / 50)) \
		"fusebox.fsx_ops=$fsx_ops fusebox.fsx_par=$fsx_par fusebox.acl=$acl fusebox.unpriv=$unpriv$([ $dax = 1 ] && echo " fusebox.dax=1 fusebox.mount=dax=inode")" -no-reboot
	wait_qemu guest-run
}
boot
boot_again_on_tcg_assertion guest-run
echo "guest-run: guest ran $(( $(date +%s) - start )) s"
# fusebox exits when its frontend goes.
wait_fusebox_exit guest-run
[ -n "${dax_writer:-}" ] && { kill "$dax_writer" 2>/dev/null || true; }

grep -E '^(PASS|FAIL|GUEST)' "$work/console.log" || true
guest_suite_passed guest-run 40 || status=1

# The host's half: what the guest left in the shared directory.
hfail=0
w=$share/work
hcheck content '[ "$(cat "$w/a")" = hello ] && [ "$(cat "$w/w")" = 012XY56789 ]'
hcheck append '[ "$(cat "$w/ap")" = "$(printf "one\ntwo")" ]'
hcheck truncate '[ "$(stat -c %s "$w/tr")" = 100 ] && [ "$(head -c 4 "$w/tr")" = 0123 ]'
hcheck rename '[ ! -e "$w/r1" ] && [ "$(cat "$w/r2")" = r ] && [ "$(cat "$w/n2")" = new ] && [ ! -e "$w/n1" ]'
hcheck links '[ "$(stat -c %h "$w/h2")" = 1 ] && [ "$(readlink "$w/sl")" = target ]'
if [ $unpriv = 1 ]; then
	# Guest root is the user: what it made is the user's.
	hcheck modes '[ "$(stat -c %a "$w/cm")" = 4755 ] && [ "$(stat -c %U:%G "$w/co")" = "$as_user:$(id -gn "$as_user")" ]'
else
	hcheck modes '[ "$(stat -c %a "$w/cm")" = 4755 ] && [ "$(stat -c %u:%g "$w/co")" = 1234:5678 ]'
fi
hcheck mtime '[ "$(stat -c %Y "$w/ut")" = "$(date -d "2001-02-03 04:05:06" +%s)" ]'
hcheck mmap-data 'python3 -c "import sys; d=open(sys.argv[1],\"rb\").read(); sys.exit(d != bytes((i*7+3)&255 for i in range(1<<20)))" "$w/mapped"'
[ $acl = 1 ] && hcheck posix-acl '[ "$(stat -c %a "$w/acl")" = 640 ] && python3 -c "import os, sys; sys.exit(len(os.getxattr(sys.argv[1], \"system.posix_acl_access\")) != 44)" "$w/acl"'
hcheck o-direct-data 'python3 -c "import sys; d=open(sys.argv[1],\"rb\").read(); sys.exit(d != bytes((i^(i>>8))&255 for i in range(1<<20)))" "$w/direct"'
hcheck 64MiB-guest-to-host '[ "$(sha256sum "$share/guest64.bin" | cut -d" " -f1)" = "$(cat "$share/guest64.sha256")" ]'
hcheck dir-10000-entries '[ "$(ls "$w/big" | wc -l)" = 10000 ]'
hcheck no-stray-files '[ -z "$(ls -A "$share" | grep -vxE "work|submnt|esc|host64.bin|host64.sha256|guest64.bin|guest64.sha256|dax.bin|dax.sha256|dax-go|dax-written|dax-written-seen|dax-synced|dax-synced-seen")" ]'
if [ $dax = 1 ]; then
	hcheck dax-guest-writes '[ "$(dd if="$share/dax.bin" bs=1 skip=1048576 count=8 2>/dev/null)" = GUESTDAX ] && [ "$(dd if="$share/dax.bin" bs=1 skip=3145728 count=7 2>/dev/null)" = MMAPDAX ] && [ "$(dd if="$share/dax.bin" bs=1 skip=3670016 count=8 2>/dev/null)" = SHAREDAX ]'
	# Dirty pages after the guest's write; none dirty and none under
	# writeback after its msync, an FSYNC the daemon served.
	hcheck dax-fsync-flushes '[ "$(cut -d" " -f1 "$work/dax-written" 2>/dev/null)" -gt 0 ] && [ "$(cat "$work/dax-synced" 2>/dev/null)" = "0 0" ]'
	# fusebox's exit report: mappings made, none refused, some removed.
	report=$(sed -n '/frontend disconnected/,$p' "$work/fusebox.log")
	hcheck dax-counters 'echo "$report" | grep -qE "Setupmapping +count +[1-9][0-9]* +errors +0 " && echo "$report" | grep -qE "Removemapping +count +[1-9]"'
fi
hcheck fsx-files '[ "$(ls "$w" | grep -c "^fsx[0-4]$")" = 5 ]'
hcheck confinement '[ "$(cat "$work/outside-secret")" = "$secret" ] && [ -z "$(ls -A "$work" | grep -vxE "share|extra|outside-secret|console.log|fusebox.log|qemu.err|vfs.sock|fusebox|dax-written|dax-synced")" ] && [ "$(readlink "$share/esc/rel")" = ../../outside-secret ]'
[ $hfail = 0 ] || status=1

echo "guest-run: fusebox's counters:"
sed -n '/frontend disconnected/,$p' "$work/fusebox.log"
# The exit report only: SIGUSR1 reports made during the run repeat the lines.
used=$(sed -n '/frontend disconnected/,$p' "$work/fusebox.log" | grep -cE '^fusebox: queue request[0-9]+: submitted [1-9]' || true)
echo "guest-run: $used of $queues request queue(s) carried requests"
if [ "$used" -lt "$min_used" ]; then
	echo "guest-run: FAIL expected at least $min_used request queues in use"
	status=1
fi
# With guest RAM as fixed buffers, reads through the ring used them.
case " $fb_args " in *" --fixed-guest-memory "*)
	fixed=$(sed -n 's/.*(\([0-9]*\) into fixed guest memory;.*/\1/p' "$work/fusebox.log" | tail -1)
	echo "guest-run: ${fixed:-no} reads into fixed guest memory"
	[ "${fixed:-0}" -gt 0 ] || { echo "guest-run: FAIL no read used the fixed guest memory"; status=1; } ;;
esac
[ $status = 0 ] && echo "guest-run: OK" || { echo "guest-run: FAILED"; tail -20 "$work/fusebox.log"; }
exit $status
