#!/bin/bash
# A guest reset ends the FUSE session: what the guest held before is
# released, and the daemon's fds go back to where they were.
#
#   tests/guest/reboot.sh [--backports] [--fusebox-args "ARGS"]
#
# As root. Gets the test guest (tests/guest/setup.sh), adds
# reboot-guest.sh, builds fusebox and shares a fresh directory with it
# (`--socket-path S --shared-dir D ARGS`), and boots the guest with a QMP
# socket and without -no-reboot. Right after each boot's mount (the
# guest's REBOOT-MOUNTED, before it opens anything) the host counts the
# serving process's fds. The first boot opens 50 files in the share and
# holds a POSIX lock and a flock on lockfile (HELD); the host checks that
# it cannot take either lock itself (fcntl.lockf and fcntl.flock, not
# waiting), then resets the machine (QMP system_reset). The same kernel
# boots again, sees the marker the first boot left in the share, and
# takes both locks again without waiting. Passes when the second boot's
# fd count is the first's, the second boot got both locks, the guest
# powered off and fusebox exited once QEMU had gone. REBOOT_TIMEOUT
# (seconds, default 180) bounds each wait for the guest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../scripts/lib.sh
. "$here/../../scripts/lib.sh"
root=$(cd "$here/../.." && pwd)
orig_args=("$@")
setup_args=() fb_args=""
while [ $# -gt 0 ]; do
	case $1 in
		--backports) setup_args+=(--backports) ;;
		--fusebox-args) fb_args=$2; shift ;;
		*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
log() { echo "guest-reboot: $*"; }
[ "$(id -u)" = 0 ] || { log "needs root"; exit 1; }
tmo=${REBOOT_TIMEOUT:-180}
begin=$(date +%s)
setup_guest "${setup_args[@]}"
build_fusebox
fusebox=${CARGO_TARGET_DIR:-$root/target}/release/fusebox

new_work reboot
cp "$here/reboot-guest.sh" "$work/extra/reboot.sh"
add_to_initrd "$work/extra"

status=0
check() { # name, then a command that passes or not
	local name=$1
	shift
	if "$@"; then log "PASS $name"; else log "FAIL $name"; status=1; fi
}
show() {
	log "the guest's console:"
	{ tr -d '\r' < "$work/console.log"; } 2>/dev/null | grep -av '^\s*$' | tail -40 | sed 's/^/  /' || true
	log "fusebox's log:"
	tail -20 "$work/fusebox.log" | sed 's/^/  /' || true
}
# Ends the run when the guest did not get to $1 ($2 such lines) in time.
# Multi-threaded TCG now and then aborts on its own assertion (see
# scripts/lib.sh): then the whole run goes again, once, from a fresh daemon.
await() {
	wait_console "$1" "$tmo" "${2:-1}" && return 0
	if ! kill -0 "$qpid" 2>/dev/null; then
		wait_qemu guest-reboot
		if [ "$qrc" = 134 ] && grep -q Assertion "$work/qemu.err" && [ -z "${REBOOT_RETRIED:-}" ]; then
			log "QEMU aborted on its own assertion; running again (once)"
			kill "$fpid" 2>/dev/null || true
			wait "$fpid" 2>/dev/null || true
			fpid=
			cleanup
			trap - EXIT
			REBOOT_RETRIED=1 exec "$0" "${orig_args[@]}"
		fi
	fi
	log "FAIL the guest did not get to $1 within $tmo s"
	show
	exit 1
}
# The serving process's open fds, once the count has held for a second
# (at most 10 s); their targets, sorted, in $work/fds.$1.
fds() {
	local pid n prev=-1
	pid=$(serving_pid)
	for _ in $(seq 10); do
		n=$(ls "/proc/$pid/fd" | wc -l)
		[ "$n" = "$prev" ] && break
		prev=$n
		sleep 1
	done
	for f in "/proc/$pid/fd"/*; do readlink "$f" || true; done | sed 's/\[[0-9]*\]/[N]/' | sort > "$work/fds.$1"
	echo "$n"
}
# Tries both locks on $1 from a host process, not waiting: prints each
# call's outcome ("lockf=taken" or "lockf=errno N", then flock's).
host_locks() {
	python3 - "$1" <<'EOF'
import fcntl, os, sys
out = []
for name, op in (("lockf", fcntl.lockf), ("flock", fcntl.flock)):
    fd = os.open(sys.argv[1], os.O_RDWR)
    try:
        op(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out.append(name + "=taken")
    except OSError as e:
        out.append("%s=errno %d" % (name, e.errno))
    os.close(fd)
print(" ".join(out))
EOF
}

start_daemon "$fusebox" --socket-path "$sock" --shared-dir "$share" $fb_args
log "booting $("$qemu" --version | head -1) against fusebox${fb_args:+ $fb_args}"
start_qemu $((4 * tmo)) "fusebox.run=reboot" -qmp "unix:$work/qmp.sock,server=on,wait=off"

await '^REBOOT-MOUNTED' 1
base=$(fds boot1)
log "first boot mounted the share: fusebox (pid $(serving_pid)) has $base fds open"
touch "$share/go"
await '^HELD' 1
tr -d '\r' < "$work/console.log" | grep -a '^HELD' | sed 's/^/  guest: /'
held=$(fds held)
log "with the guest's files and locks: $held fds"
locks=$(host_locks "$share/lockfile")
log "a host process tries both locks on lockfile: $locks"
check "the host cannot take the guest's POSIX lock or its flock" [ "$locks" = "lockf=errno 11 flock=errno 11" ]
check "the guest's 50 files are open in fusebox" [ "$held" -ge $((base + 50)) ]

rm "$share/go"
log "QMP system_reset: $(python3 "$root/tests/migration/qmp.py" "$work/qmp.sock" system_reset)"
reset_at=$(date +%s)
await '^REBOOT-MOUNTED' 2
after=$(fds boot2)
log "second boot mounted the share $(($(date +%s) - reset_at)) s after the reset: fusebox has $after fds open (first boot: $base)"
if [ "$after" != "$base" ]; then
	log "fds the second boot has that the first did not (digits shown as N):"
	comm -13 "$work/fds.boot1" "$work/fds.boot2" | sed 's/[0-9]\+/N/g' | sort | uniq -c | sed 's/^/  /'
fi
check "fusebox's fds are back to the first boot's count" [ "$after" = "$base" ]
touch "$share/go"
await '^REBOOT-RELOCK' 1
relock=$(tr -d '\r' < "$work/console.log" | grep -a '^REBOOT-RELOCK' | tail -1)
log "the rebooted guest takes both locks again: ${relock#REBOOT-RELOCK-}"
check "the rebooted guest takes both locks again" [ "${relock%% *}" = REBOOT-RELOCK-OK ]

wait_qemu guest-reboot
check "the guest powered off" [ "$qrc" = 0 ]
s=$status
wait_fusebox_exit guest-reboot
[ "$s" = 0 ] || status=$s
[ "$status" = 0 ] || show
log "$(($(date +%s) - begin)) s"
[ "$status" = 0 ] && log "OK" || log "FAILED"
exit $status
