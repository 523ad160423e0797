#!/bin/bash
# Live migration of a guest using a vhost-user-fs share, from one daemon
# to another serving the same directory.
#
#   tests/migration/run.sh [--daemon virtiofsd|fusebox] [--daemon-args "ARGS"]
#                          [--migration-mode find-paths|file-handles]
#                          [--scenario normal|unlinked|missing|corrupt]
#                          [--expect WHAT] [--daemon-bin PATH] [--trace] [--keep]
#
# As root. Gets the test guest with tests/guest/setup.sh --backports (QEMU
# 10, Linux 6.12; migration of vhost-user-fs needs QEMU >= 8.2) and adds
# /migrate.sh and /migcheck (migcheck.c) to its initramfs. Starts daemon A
# (source) and daemon B (destination) on their own sockets, sharing the
# same directory, both with `--socket-path S --shared-dir D --cache never
# [--migration-mode M] ARGS`. Starts the destination QEMU (TCG, memfd
# shared memory, vhost-user-fs-pci on B's socket, -incoming unix:...)
# and the source QEMU (the same, on A's socket). In the guest, migcheck
# opens files (write, append, read, a directory, a POSIX-locked one)
# with its cwd in a subdirectory of the share, writes phase-1 data and
# prints MIGRATE-READY. Then over QMP: migrate the source to the
# destination, poll query-migrate until completed, check the destination
# runs, quit the source, and make the share's trigger file; the guest, now
# on the destination, goes on through the same descriptors (phase-2
# writes, reads, directory listing, cwd, the lock) and prints MIGRATE-OK.
# Passes when the guest says so, the files on the host hold phase 1 then
# phase 2, the source daemon exits once its QEMU quits, and the
# destination daemon serves until its QEMU exits, then exits.
#
# --daemon fusebox builds fusebox (cargo build --release, CARGO_TARGET_DIR
# respected); --daemon virtiofsd uses virtiofsd from PATH or
# ~/.cargo/bin (--daemon-bin overrides both). --migration-mode is passed
# to both daemons (with virtiofsd and file-handles, also
# --modcaps=+dac_read_search). --trace has both QEMUs trace the vhost-user
# messages they send and receive (and the migration's state changes) and
# prints them, named, at the end. --keep leaves the run's directory (logs,
# consoles, traces) in place. MIGRATION_TIMEOUT (seconds, default 120) bounds
# each wait; MIGRATION_DAEMON_WRAP runs both daemons under a tool (for
# example "strace -f -o FILE").
#
# --scenario picks what goes wrong (default normal: nothing does):
#   unlinked  the guest also holds gone, written and then unlinked, and
#             after the move writes and reads through that fd. With
#             --migration-mode file-handles the fd works on the
#             destination; with find-paths and --daemon-args
#             "--migration-on-error guest-error" the move succeeds and that
#             fd gets EIO; with find-paths and abort the migration fails.
#   missing   the destination's daemon shares another directory: a copy
#             (cp -a) of the share made after MIGRATE-READY, less mig/rd,
#             which the guest holds open. With abort the migration fails;
#             with guest-error the guest runs on the destination (on the
#             copy: its phase-2 data lands there) and rd gives EIO.
#             Not with file-handles (every handle leads out of the copy).
#   corrupt   corrupt-proxy.py sits between the source's migration URI and
#             the destination's and flips one byte of fusebox's device
#             state (after its magic FUSEBOX\x01); the destination must
#             refuse it and log a "fusebox: migration:" error (fusebox
#             only). The migration fails.
# Failure scenarios set QEMU's return-path capability on both sides (the
# source learns so of a load that failed on the destination). When the
# migration is expected to fail: its final status must be "failed", the
# source must be "running" again, the destination QEMU may exit (it does,
# its load failed), the daemon that refused logs a "fusebox: migration:"
# error (fusebox), and the guest goes on on the source: the trigger made
# in the source's share, MIGRATE-OK on the source's console, the source's
# daemon serving until the guest powers off. The trigger tells the guest
# what the host expects: "dest", "dest eio:gone", "dest eio:rd copy"
# (copy: other inode numbers) or "source" (--expect overrides it, for
# daemons that behave otherwise).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../../scripts/lib.sh
. "$root/scripts/lib.sh"
orig_args=("$@")
daemon=virtiofsd daemon_args="" mig_mode="" daemon_bin="" keep=0 trace=0 scenario=normal expect=""
while [ $# -gt 0 ]; do
	case $1 in
		--daemon) daemon=$2; shift ;;
		--daemon-args) daemon_args=$2; shift ;;
		--migration-mode) mig_mode=$2; shift ;;
		--scenario) scenario=$2; shift ;;
		--expect) expect=$2; shift ;;
		--daemon-bin) daemon_bin=$2; shift ;;
		--trace) trace=1 ;;
		--keep) keep=1 ;;
		*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
log() { echo "migration-run: $*"; }
[ "$(id -u)" = 0 ] || { log "needs root"; exit 1; }

# What the scenario is to give, with these daemon options: the trigger's
# contents ("dest" or "source", then "eio:NAME" for each fd to get EIO).
on_error=abort
case " $daemon_args " in *guest-error*) on_error=guest-error ;; esac
case $scenario in
	normal) want=dest ;;
	unlinked)
		if [ "$mig_mode" = file-handles ]; then want=dest
		elif [ $on_error = guest-error ]; then want="dest eio:gone"
		else want=source; fi ;;
	missing)
		if [ "$mig_mode" = file-handles ]; then
			log "--scenario missing needs find-paths: with file handles nothing in the copy is what the guest holds"
			exit 2
		fi
		if [ $on_error = guest-error ]; then want="dest eio:rd copy"; else want=source; fi ;;
	corrupt)
		[ "$daemon" = fusebox ] || { log "--scenario corrupt looks for fusebox's device state: --daemon fusebox"; exit 2; }
		want=source ;;
	*) log "unknown scenario $scenario (normal, unlinked, missing or corrupt)"; exit 2 ;;
esac
[ -n "$expect" ] && want=$expect
outcome=${want%% *}
case $outcome in dest | source) ;; *) log "--expect must start with dest or source"; exit 2 ;; esac
tmo=${MIGRATION_TIMEOUT:-120}
begin=$(date +%s)

if ! command -v python3 >/dev/null; then
	log "installing python3 (the QMP client)"
	apt_get update
	apt_get install python3
fi

target=${CARGO_TARGET_DIR:-$root/target}
setup_guest --backports "$target/guest/backports"
case $daemon in
	virtiofsd)
		bin=${daemon_bin:-$(cargo_bin virtiofsd)}
		[ -n "$mig_mode" ] && daemon_args="--migration-mode $mig_mode $daemon_args"
		[ "$mig_mode" = file-handles ] && daemon_args="--modcaps=+dac_read_search $daemon_args"
		;;
	fusebox)
		if [ -z "$daemon_bin" ]; then
			build_fusebox
			bin=$target/release/fusebox
		else
			bin=$daemon_bin
		fi
		[ -n "$mig_mode" ] && daemon_args="--migration-mode $mig_mode $daemon_args"
		;;
	*) log "unknown daemon $daemon (virtiofsd or fusebox)"; exit 2 ;;
esac
[ -x "$bin" ] || { log "no $daemon binary at $bin"; exit 1; }

work=$(mktemp -d /tmp/fusebox-migration.XXXXXX)
share=$work/share
mkdir "$share"
# The destination's directory: the share, or (missing) a copy of it made
# once the guest holds its files.
dshare=$share
if [ "$scenario" = missing ]; then
	dshare=$work/copy
	mkdir "$dshare"
fi
pa='' pb='' qa='' qb='' px='' status=1
show_logs() {
	local f
	for f in "$work"/console-*.log "$work"/qemu-*.err "$work"/daemon-*.log "$work"/proxy.log; do
		[ -s "$f" ] || continue
		echo "----- the last 25 lines of $(basename "$f")"
		tail -25 "$f"
	done
}
cleanup() {
	local rc=$?
	stop_pid "$qa"; stop_pid "$qb"; stop_pid "$pa"; stop_pid "$pb"; stop_pid "$px"
	[ "$rc" = 0 ] && [ "$status" = 0 ] || show_logs
	if [ $keep = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() { log "FAIL $*"; exit 1; }

# The guest of the $1 side (source, destination) powered off: its QEMU
# (pid in the variable named $2) must exit with 0 within $tmo s, then its
# daemon ($4, pid in the variable named $3) within 10 s. Clears the
# variables of what exited (the cleanup stops the rest); fails, logged,
# otherwise.
powered_off() {
	local side=$1 q=${!2} d=${!3} rc=0 qrc=0 drc=0
	timeout "$tmo" tail --pid="$q" -f /dev/null || { log "FAIL the $side QEMU did not exit after the guest"; rc=1; }
	wait "$q" 2>/dev/null || qrc=$?
	printf -v "$2" ''
	[ "$qrc" = 0 ] || { log "FAIL the $side QEMU exited with $qrc"; rc=1; }
	if wait_until 100 0.1 gone "$d"; then
		wait "$d" 2>/dev/null || drc=$?
		printf -v "$3" ''
		log "$side QEMU exited; daemon $4 exited with $drc"
	else
		log "FAIL daemon $4 still running 10 s after the $side QEMU exited"
		rc=1
	fi
	return $rc
}

# The guest: the test guest's kernel and initramfs, with /migrate.sh and
# /migcheck appended as a second cpio archive.
mkdir "$work/extra"
cp "$here/migrate.sh" "$work/extra/migrate.sh"
chmod +x "$work/extra/migrate.sh"
gcc -static -O2 -Wall -o "$work/extra/migcheck" "$here/migcheck.c"
add_to_initrd "$work/extra"

# The share: the guest's cwd (mig), a file it reads, a directory it lists.
mkdir -p "$share/mig/dir"
python3 -c 'import sys; open(sys.argv[1], "wb").write(bytes((i * 13 + 7) & 255 for i in range(65536)))' "$share/mig/rd"
for i in 1 2 3; do echo "entry$i" > "$share/mig/dir/e$i"; done

# The daemons: A serves the source, B the destination, the same directory.
start_side_daemon() { # name socket directory
	rm -f "$2"
	# shellcheck disable=SC2086 # the daemon's arguments are split on purpose
	${MIGRATION_DAEMON_WRAP:-} "$bin" --socket-path "$2" --shared-dir "$3" --cache never $daemon_args 2> "$work/daemon-$1.log" &
	eval "p$1=$!"
	wait_socket "$2" && return 0
	cat "$work/daemon-$1.log"
	die "daemon $1 did not listen on $2"
}
log "scenario $scenario: expecting \"$want\""
log "$daemon ($bin) for A and B: --socket-path S --shared-dir $share --cache never $daemon_args"
[ "$dshare" = "$share" ] || log "B shares $dshare instead (a copy made once the guest is ready)"
start_side_daemon a "$work/a.sock" "$share"
start_side_daemon b "$work/b.sock" "$dshare"

# QEMU: the same machine on both sides, but for the socket (and -incoming).
start_side_qemu() { # name socket extra-args...
	local n=$1 sock=$2
	shift 2
	local tr=()
	[ $trace = 1 ] && tr=(-D "$work/trace-$n.log" -trace vhost_user_write -trace vhost_user_read
		-trace vhost_dev_start -trace vhost_dev_stop -trace migrate_set_state -trace vhost_user_event)
	vhost_user_fs_vm "$sock" "$initrd" "fusebox.run=migrate migcheck.scenario=$scenario" 1 256M
	"$qemu" "${tr[@]}" -name "mig-$n" "${vm_args[@]}" \
		-display none -monitor none -serial file:"$work/console-$n.log" \
		-qmp unix:"$work/qmp-$n.sock",server=on,wait=off -no-reboot "$@" 2> "$work/qemu-$n.err" &
	eval "q$n=$!"
}
qmp() { # name command [json-args]: prints the return value; fails on an error
	local n=$1
	shift
	timeout 40 python3 "$here/qmp.py" "$work/qmp-$n.sock" "$@"
}
wait_qmp() { # name
	for _ in $(seq 100); do
		[ -S "$work/qmp-$1.sock" ] && qmp "$1" query-status >/dev/null 2>&1 && return 0
		local p
		eval "p=\$q$1"
		gone "$p" && break
		sleep 0.1
	done
	cat "$work/qemu-$1.err"
	die "QEMU $1 did not answer on QMP"
}
vm_status() { qmp "$1" query-status | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])'; }
# The failure scenarios: the source hears of a load that failed on the
# destination only over the return path (both sides must enable it).
return_path() { # name
	[ "$scenario" != normal ] || return 0
	local out
	out=$(qmp "$1" migrate-set-capabilities '{"capabilities": [{"capability": "return-path", "state": true}]}' 2>&1) ||
		die "migrate-set-capabilities return-path on $1: $out"
}

log "starting the destination: $("$qemu" --version | head -1), -incoming unix:$work/mig.sock"
start_side_qemu b "$work/b.sock" -incoming "unix:$work/mig.sock"
wait_qmp b
return_path b
log "destination QEMU is $(vm_status b)"
log "booting the source (TCG, 1 cpu, 256 MiB memfd)"
t0=$(date +%s)
start_side_qemu a "$work/a.sock"
wait_qmp a
return_path a

# The guest: ready when it holds its descriptors and wrote phase 1.
while :; do
	grep -aq '^MIGRATE-READY' "$work/console-a.log" 2>/dev/null && break
	grep -aq '^MIGRATE-FAIL\|^GUEST: mount failed' "$work/console-a.log" 2>/dev/null && break
	gone "$qa" && break
	[ $(( $(date +%s) - t0 )) -lt "$tmo" ] || break
	sleep 0.2
done
grep -a '^GUEST\|^MIGRATE' "$work/console-a.log" | sed 's/^/  source guest: /' || true
if ! grep -aq '^MIGRATE-READY' "$work/console-a.log"; then
	if gone "$qa" && grep -q Assertion "$work/qemu-a.err" && [ -z "${MIGRATION_RETRIED:-}" ] &&
		! grep -aq '^MIGRATE' "$work/console-a.log"; then
		# Multi-threaded TCG now and then trips over its own assertion
		# while the kernel boots (see tests/guest/run.sh): once more.
		log "the source QEMU aborted on its own assertion during boot; running again (once)"
		cat "$work/qemu-a.err"
		trap - EXIT
		stop_pid "$qb"; stop_pid "$pa"; stop_pid "$pb"
		rm -rf "$work"
		MIGRATION_RETRIED=1 exec "$0" "${orig_args[@]}"
	fi
	die "the source guest did not get to MIGRATE-READY within $tmo s"
fi
log "source guest ready $(( $(date +%s) - t0 )) s after its start"

# The guest's POSIX lock on mig/lk, as the host sees it (daemons that pass
# locks on take them on the host file; others keep them in the guest).
lk_ino=$(stat -c %i "$share/mig/lk")
host_locks() { grep -E "[0-9a-f]+:[0-9a-f]+:$lk_ino " /proc/locks || true; }
# Which processes hold them (OFD locks show pid -1 in /proc/locks; the
# holder's fdinfo names them).
lock_holders() {
	local f p
	for f in /proc/[0-9]*/fdinfo/*; do
		grep -qE "^lock:.*[0-9a-f]+:[0-9a-f]+:$lk_ino " "$f" 2>/dev/null || continue
		p=${f#/proc/}
		p=${p%%/*}
		echo "$p($(cat "/proc/$p/comm" 2>/dev/null))"
	done | sort -u | tr '\n' ' '
}
locks_before=$(host_locks)
log "host locks on mig/lk before migration: ${locks_before:-none}${locks_before:+ held by $(lock_holders)}"

# missing: the destination's directory is a copy of the share as the guest
# holds it (phase 1 written), less a file it holds open.
if [ "$scenario" = missing ]; then
	cp -a "$share/." "$dshare/"
	rm "$dshare/mig/rd"
	log "copied the share to $dshare, less mig/rd"
fi

# corrupt: the proxy that flips a byte of the device state on the way.
mig_uri=unix:$work/mig.sock
if [ "$scenario" = corrupt ]; then
	python3 "$here/corrupt-proxy.py" "$work/proxy.sock" "$work/mig.sock" 2> "$work/proxy.log" &
	px=$!
	wait_socket "$work/proxy.sock" 50 || die "corrupt-proxy.py did not listen ($(cat "$work/proxy.log"))"
	mig_uri=unix:$work/proxy.sock
fi

# Migration.
log "QMP migrate to $mig_uri"
t1=$(date +%s)
if ! out=$(qmp a migrate "{\"uri\": \"$mig_uri\"}" 2>&1); then
	die "migrate refused: $out"
fi
while :; do
	mig=$(qmp a query-migrate 2>&1) || die "query-migrate: $mig"
	st=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1]).get("status", "none"))' "$mig")
	case $st in completed | failed | cancelled) break ;; esac
	if [ "$outcome" = dest ] && gone "$qb"; then
		die "the destination QEMU exited during migration ($(tail -3 "$work/qemu-b.err" | tr '\n' ' '))"
	fi
	[ $(( $(date +%s) - t1 )) -lt "$tmo" ] || die "migration still $st after $tmo s: $mig"
	sleep 0.2
done
err=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1]).get("error-desc", "no error-desc"))' "$mig")
if [ "$outcome" = source ]; then
	[ "$st" = failed ] || die "migration $st, but it was to fail (scenario $scenario, $daemon_args)"
	log "migration failed, as expected, after $(( $(date +%s) - t1 )) s: $err"
elif [ "$st" != completed ]; then
	die "migration $st: $err"
fi

if [ "$outcome" = dest ]; then # the guest moves on to the destination
	stats=$(python3 -c '
import json, sys
m = json.loads(sys.argv[1])
r = m.get("ram", {})
print("total %s ms, downtime %s ms, setup %s ms, %s MiB transferred" % (m.get("total-time"), m.get("downtime"), m.get("setup-time"), r.get("transferred", 0) >> 20))' "$mig")
	log "migration completed ($stats)"
	for _ in $(seq 50); do
		sb=$(vm_status b 2>&1) || die "query-status on the destination: $sb"
		[ "$sb" = running ] && break
		sleep 0.1
	done
	[ "$sb" = running ] || die "the destination is $sb, not running, after migration"
	log "destination is running; source is $(vm_status a)"

	# The source goes; so must its daemon.
	qmp a quit >/dev/null || true
	timeout 30 tail --pid="$qa" -f /dev/null || die "the source QEMU did not quit"
	wait "$qa" 2>/dev/null || true
	qa=
	wait_until 100 0.1 gone "$pa" || die "daemon A still running 10 s after the source QEMU quit"
	arc=0
	wait "$pa" 2>/dev/null || arc=$?
	pa=
	log "source QEMU quit; daemon A exited with $arc"
	[ "$arc" = 0 ] || log "note: daemon A's exit status is $arc"
	gone "$pb" && die "daemon B is gone while the destination runs"
	# A daemon that takes the guest's locks on the host must hold them on
	# the destination once the source's daemon is gone (5 s to get there).
	lk_ino=$(stat -c %i "$dshare/mig/lk")
	for _ in $(seq 50); do
		locks_after=$(host_locks)
		[ -z "$locks_before" ] || [ -n "$locks_after" ] && break
		sleep 0.1
	done
	log "host locks on mig/lk after migration: ${locks_after:-none}${locks_after:+ held by $(lock_holders)}"
	if [ -n "$locks_before" ] && [ -z "$locks_after" ]; then
		die "the guest's POSIX lock was held on the host before migration and is not after"
	fi
	[ "$scenario" = normal ] || grep -h '^fusebox: migration:' "$work"/daemon-*.log | sed 's/^/  daemon log: /' || true

	# The guest goes on, on the destination.
	echo "$want" > "$dshare/trigger"
	log "made the trigger file ($want); waiting for the guest on the destination"
	t2=$(date +%s)
	while :; do
		grep -aq '^MIGRATE-OK\|^MIGRATE-FAIL\|^MIGRATE-GUEST' "$work/console-b.log" 2>/dev/null && break
		gone "$qb" && break
		[ $(( $(date +%s) - t2 )) -lt "$tmo" ] || break
		sleep 0.2
	done
	# Daemon B goes when its QEMU does, which a guest that finished quickly
	# may have done already: only an exit before the guest's end is wrong.
	if gone "$pb" && ! grep -aq '^MIGRATE-GUEST' "$work/console-b.log"; then
		die "daemon B exited while the destination guest was running"
	fi
	sleep 0.5
	grep -a '^GUEST\|^MIGRATE' "$work/console-b.log" | sed 's/^/  destination guest: /' || true
	fail=0
	if ! grep -aq '^MIGRATE-OK' "$work/console-b.log"; then
		log "FAIL the guest on the destination: $(grep -a '^MIGRATE-FAIL' "$work/console-b.log" | head -1 || echo "no MIGRATE-OK within $tmo s")"
		fail=1
	fi

	# The destination's guest powers off; its daemon goes then.
	powered_off destination qb pb B || fail=1

else # outcome source: the migration failed, the guest goes on where it was.
	for _ in $(seq 100); do
		sa=$(vm_status a 2>&1) || die "query-status on the source: $sa"
		[ "$sa" = running ] && break
		sleep 0.1
	done
	[ "$sa" = running ] || die "the source is $sa, not running, 10 s after the failed migration"
	log "the source is running again"
	gone "$pa" && die "daemon A exited after the failed migration"
	# The destination's load failed: its QEMU exits (or at least does not run).
	if wait_until 100 0.1 gone "$qb"; then
		qrc=0
		wait "$qb" 2>/dev/null || qrc=$?
		qb=
		log "the destination QEMU exited with $qrc (expected): $(grep -v '^$' "$work/qemu-b.err" | tail -3 | tr '\n' ' ')"
	else
		sb=$(vm_status b 2>&1 || true)
		[ "$sb" = running ] && die "the destination runs as well, after a failed migration"
		log "the destination QEMU is still up ($sb); quitting it"
		qmp b quit >/dev/null || true
		timeout 30 tail --pid="$qb" -f /dev/null || die "the destination QEMU did not quit"
		wait "$qb" 2>/dev/null || true
		qb=
	fi
	wait_until 100 0.1 gone "$pb" || die "daemon B still running 10 s after the destination QEMU went"
	brc=0
	wait "$pb" 2>/dev/null || brc=$?
	pb=
	log "daemon B exited with $brc"
	[ ! -s "$work/proxy.log" ] || sed 's/^/  /' "$work/proxy.log"
	# The daemon that could not save (unlinked) or load (missing, corrupt)
	# the state says why.
	grep -h '^fusebox: migration:' "$work/daemon-a.log" | sed 's/^/  daemon A: /' || true
	grep -h '^fusebox: migration:' "$work/daemon-b.log" | sed 's/^/  daemon B: /' || true
	if [ "$daemon" = fusebox ] && [ -z "$expect" ]; then
		case $scenario in unlinked) rf=a ;; *) rf=b ;; esac
		# (its line on success is "fusebox: migration: device state transferred")
		grep '^fusebox: migration:' "$work/daemon-$rf.log" | grep -vq 'migration: device state transferred$' ||
			die "daemon ${rf^^} logged no \"fusebox: migration:\" error"
	fi
	if [ "$scenario" = corrupt ] && [ -n "$px" ]; then
		timeout 10 tail --pid="$px" -f /dev/null || true
		prc=0
		wait "$px" 2>/dev/null || prc=$?
		px=
		[ "$prc" = 0 ] || die "corrupt-proxy.py exited with $prc (no byte flipped?)"
	fi
	# The source's daemon still holds the guest's locks on the host.
	locks_after=$(host_locks)
	log "host locks on mig/lk after the failed migration: ${locks_after:-none}${locks_after:+ held by $(lock_holders)}"
	if [ -n "$locks_before" ] && [ -z "$locks_after" ]; then
		die "the guest's POSIX lock was held on the host before the migration and is not after it failed"
	fi

	# The guest goes on, on the source.
	echo "$want" > "$share/trigger"
	log "made the trigger file ($want) in the source's share; waiting for the guest on the source"
	t2=$(date +%s)
	while :; do
		grep -aq '^MIGRATE-OK\|^MIGRATE-FAIL\|^MIGRATE-GUEST' "$work/console-a.log" 2>/dev/null && break
		gone "$qa" && break
		if gone "$pa" && ! grep -aq '^MIGRATE-GUEST' "$work/console-a.log"; then
			die "daemon A exited while the source guest was running"
		fi
		[ $(( $(date +%s) - t2 )) -lt "$tmo" ] || break
		sleep 0.2
	done
	sleep 0.5
	grep -a '^GUEST\|^MIGRATE' "$work/console-a.log" | sed 's/^/  source guest: /' || true
	fail=0
	if ! grep -aq '^MIGRATE-OK' "$work/console-a.log"; then
		log "FAIL the guest on the source: $(grep -a '^MIGRATE-FAIL' "$work/console-a.log" | head -1 || echo "no MIGRATE-OK within $tmo s")"
		fail=1
	fi
	if grep -aq '^MIGRATE' "$work/console-b.log" 2>/dev/null; then
		log "FAIL the destination's console shows the guest: $(grep -a '^MIGRATE' "$work/console-b.log" | head -3 | tr '\n' ' ')"
		fail=1
	fi
	# The guest powers off; the source QEMU exits, its daemon then.
	powered_off source qa pa A || fail=1
fi
if grep -q panicked "$work"/daemon-*.log; then
	log "FAIL a daemon panicked"
	fail=1
fi

# The host's half: what the guest wrote before and after, in the
# directory of the daemon it ended on.
hfail=0
if [ "$outcome" = dest ]; then ended=$dshare other=$share; else ended=$share other=$dshare; fi
# shellcheck disable=SC2034 # used in hcheck's expressions
m=$ended/mig
files=". ./mig ./mig/ap ./mig/cwd-after ./mig/dir ./mig/dir/e1 ./mig/dir/e2 ./mig/dir/e3 ./mig/dir/new-after ./mig/lk ./mig/rd ./mig/w ./trigger "
[ "$ended" = "$share" ] || files=${files/.\/mig\/rd /}
hcheck write-fd '[ "$(cat "$m/w")" = "$(printf "w-phase1\nw-phase2")" ]'
hcheck append-fd '[ "$(cat "$m/ap")" = "$(printf "ap-phase1-a\nap-phase1-b\nap-phase2-a\nap-phase2-b")" ]'
hcheck locked-fd '[ "$(cat "$m/lk")" = "$(printf "lk-phase1\nlk-phase2")" ]'
hcheck dirfd-create '[ "$(cat "$m/dir/new-after")" = made-after ]'
hcheck cwd-create '[ "$(cat "$m/cwd-after")" = cwd-after ]'
hcheck read-file-intact 'python3 -c "import sys; sys.exit(open(sys.argv[1], \"rb\").read() != bytes((i * 13 + 7) & 255 for i in range(65536)))" "$share/mig/rd"'
hcheck no-stray-files '[ "$(cd "$ended" && find . | sort | tr "\n" " ")" = "$files" ]'
if [ "$other" != "$ended" ]; then
	# missing: the other directory holds phase 1 only.
	ofiles=". ./mig ./mig/ap ./mig/dir ./mig/dir/e1 ./mig/dir/e2 ./mig/dir/e3 ./mig/lk ./mig/rd ./mig/w "
	[ "$other" = "$share" ] || ofiles=${ofiles/.\/mig\/rd /}
	hcheck other-dir-phase1-only '[ "$(cat "$other/mig/w")" = w-phase1 ] && [ "$(cat "$other/mig/lk")" = lk-phase1 ]'
	hcheck other-dir-untouched '[ "$(cd "$other" && find . | sort | tr "\n" " ")" = "$ofiles" ]'
fi
[ $hfail = 0 ] || fail=1

# The vhost-user messages each QEMU sent (write) and got back (read),
# named as in the vhost-user specification.
print_trace() { # name
	awk 'BEGIN {
		n = split("GET_FEATURES SET_FEATURES SET_OWNER RESET_OWNER SET_MEM_TABLE SET_LOG_BASE SET_LOG_FD SET_VRING_NUM SET_VRING_ADDR SET_VRING_BASE GET_VRING_BASE SET_VRING_KICK SET_VRING_CALL SET_VRING_ERR GET_PROTOCOL_FEATURES SET_PROTOCOL_FEATURES GET_QUEUE_NUM SET_VRING_ENABLE SEND_RARP NET_SET_MTU SET_BACKEND_REQ_FD IOTLB_MSG SET_VRING_ENDIAN GET_CONFIG SET_CONFIG CREATE_CRYPTO_SESSION CLOSE_CRYPTO_SESSION POSTCOPY_ADVISE POSTCOPY_LISTEN POSTCOPY_END GET_INFLIGHT_FD SET_INFLIGHT_FD GPU_SET_SOCKET RESET_DEVICE VRING_KICK GET_MAX_MEM_SLOTS ADD_MEM_REG REM_MEM_REG SET_STATUS GET_STATUS GET_SHARED_OBJECT SET_DEVICE_STATE_FD CHECK_DEVICE_STATE", name, " ")
	}
	{
		line = $0
		sub(/^[0-9]+@[0-9.]+:/, "", line)
		if (match(line, /req:[0-9]+/)) {
			r = substr(line, RSTART + 4, RLENGTH - 4) + 0
			sub(/req:[0-9]+/, "req:" r " " ((r in name) ? name[r] : "?"), line)
		}
		print "  " line
	}' "$work/trace-$1.log"
}
if [ $trace = 1 ]; then
	log "vhost-user messages of the source QEMU (A):"
	print_trace a
	log "vhost-user messages of the destination QEMU (B):"
	print_trace b
fi

status=$fail
if [ "$status" = 0 ]; then
	log "OK ($daemon, $(( $(date +%s) - begin )) s)"
else
	log "FAILED"
fi
exit "$status"
