#!/bin/bash
# libvirt, for real: libvirt's own daemon starts fusebox as a domain's
# virtiofsd, and the guest uses the share.
#
#   tests/libvirt/run.sh
#
# As root. Installs Debian's libvirt daemon and virsh if they are missing
# (libvirt-daemon and libvirt-clients, without recommends: not
# libvirt-daemon-system, which would pull in systemd), uses a running
# qemu:///system daemon or else starts libvirtd and virtlogd itself (with
# a private qemu.conf, and the libvirt-qemu user libvirt-daemon-system
# would have made) and stops them at the end. Creates a transient TCG
# domain from tests/libvirt/domain.xml: memfd shared memory, the test
# guest's kernel and initramfs (tests/guest/setup.sh) with guest.sh added
# as /libvirt.sh (the guest's /init runs it: fusebox.run=libvirt), and a
# virtiofs <filesystem> whose <binary> is target/release/fusebox (xattr,
# cache, sandbox, locks, thread pool).
# Checks that libvirt started our binary with its socket (--fd), that the
# guest mounted the share and read and wrote files and xattrs, that the
# guest's flock and POSIX lock are held on the host, and that fusebox is
# gone once `virsh destroy` returns. FUSEBOX_LIBVIRT_BOOT_TIMEOUT (seconds,
# default 150) bounds the wait for the guest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../../scripts/lib.sh
. "$root/scripts/lib.sh"
log() { echo "libvirt-run: $*"; }
[ "$(id -u)" = 0 ] || { log "needs root (the qemu:///system daemon starts fusebox)"; exit 1; }
boot_timeout=${FUSEBOX_LIBVIRT_BOOT_TIMEOUT:-150}
begin=$(date +%s)

need=
for p in libvirt-daemon libvirt-clients; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need="$need $p"
done
if [ -n "$need" ]; then
	log "installing$need"
	apt_get update
	apt_get install --no-install-recommends $need
fi

setup_guest
build_fusebox
fusebox=$root/target/release/fusebox

name=fusebox-test-$$
tag=fusebox-libvirt
token=$$-$(date +%s)-$RANDOM
work=$(mktemp -d /tmp/fusebox-libvirt.XXXXXX)
# A running system daemon's QEMU runs as libvirt-qemu: it opens the
# kernel and initrd in here.
chmod 755 "$work"
share=$work/share
console=$work/console.log
mkdir "$share"
lvpid= vlpid= fbpids= status=1
virsh_() { timeout 60 virsh -q -c qemu:///system "$@"; }

logs() {
	local f
	for f in "$console" "$work/libvirtd.log" "$work/virtlogd.log" \
		/var/log/libvirt/qemu/"$name".log /var/log/libvirt/qemu/"$name"-fs*-virtiofsd.log; do
		[ -s "$f" ] || continue
		echo "----- the last 30 lines of $f"
		tail -30 "$f"
	done
}
cleanup() {
	local rc=$? p
	if virsh_ domstate "$name" >/dev/null 2>&1; then
		virsh_ destroy "$name" >/dev/null 2>&1 || true
		virsh_ undefine "$name" >/dev/null 2>&1 || true
	fi
	if [ "$rc" != 0 ] || [ "$status" != 0 ]; then
		logs
	fi
	# A fusebox that outlived its domain (the failure reported above).
	# Only while the pid is still fusebox (not reused since).
	for p in $fbpids; do
		[ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$fusebox" ] && kill -9 "$p" 2>/dev/null || true
	done
	if [ -n "$lvpid" ]; then
		log "stopping the libvirtd started here"
		stop_pid "$lvpid" 15
	fi
	stop_pid "$vlpid" 15
	rm -f /var/log/libvirt/qemu/"$name".log* /var/log/libvirt/qemu/"$name"-fs*-virtiofsd.log*
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The libvirt daemon: the running one, or libvirtd (and virtlogd, which
# keeps QEMU's and fusebox's logs) started here in the foreground.
if virsh_ uri >/dev/null 2>&1; then
	log "using the running libvirt daemon"
else
	# libvirt resolves its default QEMU user before it reads qemu.conf, so
	# the user must exist whatever the configuration says.
	getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
	getent passwd libvirt-qemu >/dev/null ||
		useradd --system --gid libvirt-qemu --home-dir /var/lib/libvirt --no-create-home \
			--shell /usr/sbin/nologin --comment "Libvirt Qemu" libvirt-qemu
	# A private /etc/libvirt (bind-mounted in libvirtd's own mount
	# namespace, so nothing on the machine changes) with qemu.conf's
	# QEMU user root: libvirt 9.0 checks KVM for the QEMU user against
	# its cached capabilities, and where /dev/kvm is root's alone (this
	# CI's) it probes QEMU afresh on every look-up (about 50 s for one
	# virsh create). virtiofsd_debug makes libvirt pass -d.
	etc=$work/etc-libvirt
	mkdir "$etc"
	cp -a /etc/libvirt/. "$etc/"
	cat > "$etc/qemu.conf" <<-EOF
		user = "root"
		group = "root"
		virtiofsd_debug = 1
	EOF
	if ! pgrep -x virtlogd >/dev/null; then
		virtlogd > "$work/virtlogd.log" 2>&1 &
		vlpid=$!
	fi
	# unshare and sh exec: $! is libvirtd's pid.
	unshare --mount --propagation private \
		sh -c 'mount --bind "$1" /etc/libvirt && exec libvirtd' sh "$etc" > "$work/libvirtd.log" 2>&1 &
	lvpid=$!
	for _ in $(seq 150); do
		kill -0 "$lvpid" 2>/dev/null || break
		virsh_ uri >/dev/null 2>&1 && break
		sleep 0.2
	done
	virsh_ uri >/dev/null 2>&1 || { log "FAIL libvirtd did not answer on qemu:///system"; exit 1; }
	log "started libvirtd $(libvirtd --version | awk '{print $NF}') (pid $lvpid)${vlpid:+ and virtlogd (pid $vlpid)}"
fi

# What the guest reads: a file and an xattr.
echo "host $token" > "$share/from-host"
python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.fusebox.host", sys.argv[2].encode())' \
	"$share/from-host" "host $token"

# The guest: the test guest's kernel and initramfs, with /libvirt.sh and
# its helper appended as a second cpio archive.
mkdir "$work/extra"
cp "$here/guest.sh" "$work/extra/libvirt.sh"
gcc -static -O2 -Wall -o "$work/extra/lvcheck" "$here/lvcheck.c"
add_to_initrd "$work/extra"
cp "$gdir/vmlinuz" "$work/vmlinuz"
threads=4
sed -e "s|@NAME@|$name|; s|@KERNEL@|$work/vmlinuz|; s|@INITRD@|$initrd|" \
	-e "s|@CMDLINE@|console=ttyS0 panic=-1 quiet fusebox.tag=$tag fusebox.run=libvirt fusebox.token=$token|" \
	-e "s|@EMULATOR@|$qemu|; s|@FUSEBOX@|$fusebox|; s|@THREADS@|$threads|" \
	-e "s|@SHARE@|$share|; s|@TAG@|$tag|; s|@CONSOLE@|$console|" \
	"$here/domain.xml" > "$work/domain.xml"

log "creating $name: $("$qemu" --version | head -1), TCG, virtiofs served by $fusebox"
t0=$(date +%s)
timeout 240 virsh -q -c qemu:///system create "$work/domain.xml" ||
	{ log "FAIL virsh create"; exit 1; }
log "virsh create took $(( $(date +%s) - t0 )) s"

# The fusebox libvirt started: its processes (with --sandbox namespace, the
# one libvirt started and the sandboxed daemon under it) have our binary
# as their executable, and libvirt's command line passes its socket.
fbpids=$(pgrep -f -- "source=$share," | tr '\n' ' ' || true)
[ -n "$fbpids" ] || { log "FAIL no fusebox process serves $share"; ps -ef | grep -e fusebox -e virtiofsd | grep -v grep || true; exit 1; }
fail=0
want=$(readlink -f "$fusebox")
for p in $fbpids; do
	exe=$(readlink "/proc/$p/exe" || true)
	# A concurrent cargo build replaces the file: " (deleted)".
	if [ "${exe% (deleted)}" != "$want" ]; then
		log "FAIL pid $p serving $share runs ${exe:-?}, not $want"
		fail=1
	fi
done
top=
for p in $fbpids; do
	pp=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || true)
	case " $fbpids " in *" $pp "*) ;; *) top=${top:-$p} ;; esac
done
cmdline=$(tr '\0' ' ' < "/proc/$top/cmdline")
log "libvirt started (pid $top, exe $want): $cmdline"
case "$cmdline" in *--fd=*) ;; *) log "FAIL libvirt did not pass its socket with --fd"; fail=1 ;; esac
pidfile=$(ls /run/libvirt/qemu/*"-$name-fs0-fs.pid" 2>/dev/null | head -1 || true)
if [ -n "$pidfile" ] && [ "$(cat "$pidfile")" != "$top" ]; then
	log "FAIL libvirt's pid file $pidfile names $(cat "$pidfile"), not $top"
	fail=1
fi

# The guest: up, its checks run, its locks taken.
t0=$(date +%s)
state=
while [ $(( $(date +%s) - t0 )) -lt "$boot_timeout" ]; do
	grep -aq '^LIBVIRT-GUEST holding' "$console" 2>/dev/null && break
	state=$(virsh_ domstate "$name" 2>/dev/null || echo gone)
	[ "$state" = running ] || break
	grep -aq '^GUEST: done' "$console" 2>/dev/null && break
	sleep 0.5
done
grep -aE '^(GUEST|PASS|FAIL|LIBVIRT-GUEST)' "$console" || true
if ! grep -aq '^LIBVIRT-GUEST holding' "$console"; then
	log "FAIL the guest did not get to holding its locks within $boot_timeout s (domain: ${state:-running})"
	exit 1
fi
log "guest ready $(( $(date +%s) - t0 )) s after virsh create"
result=$(grep -a '^LIBVIRT-GUEST passed=' "$console" | tail -1 || true)
case $result in
	*"failed=0"*) ;;
	*) log "FAIL guest checks: ${result:-no result}"; fail=1 ;;
esac

# The host's half: what the guest wrote, and the locks it holds.
hfail=0
hcheck guest-file '[ "$(cat "$share/from-guest")" = "guest $token" ]'
hcheck guest-xattr 'python3 -c "import os, sys; sys.exit(os.getxattr(sys.argv[1], \"user.fusebox.guest\") != sys.argv[2].encode())" "$share/from-guest" "guest $token"'
# <lock posix='on' flock='on'/>: the guest's locks are taken on the host file.
hcheck guest-posix-lock-held-on-host 'python3 -c "
import fcntl, sys
f = open(sys.argv[1], \"r+\")
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(0)
sys.exit(1)" "$share/held"'
hcheck guest-flock-held-on-host 'python3 -c "
import fcntl, sys
f = open(sys.argv[1], \"r+\")
try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(0)
sys.exit(1)" "$share/held"'
[ $hfail = 0 ] || fail=1

# virsh destroy: the domain goes, and so does every fusebox process.
t0=$(date +%s)
virsh_ destroy "$name" >/dev/null || { log "FAIL virsh destroy"; exit 1; }
log "virsh destroy took $(( $(date +%s) - t0 )) s"
for _ in $(seq 50); do
	left=
	for p in $fbpids; do gone "$p" || left="$left $p"; done
	[ -z "$left" ] && break
	sleep 0.1
done
if [ -n "$left" ]; then
	log "FAIL fusebox still running 5 s after virsh destroy:$left"
	fail=1
else
	log "fusebox exited (pids $(echo $fbpids))"
	fbpids=
fi
if virsh_ domstate "$name" >/dev/null 2>&1; then
	log "FAIL the transient domain is still listed after destroy"
	fail=1
fi
fslog=$(ls /var/log/libvirt/qemu/"$name"-fs*-virtiofsd.log 2>/dev/null | head -1 || true)
if [ -n "$fslog" ]; then
	log "fusebox's log ($fslog):"
	cat "$fslog"
	if grep -q panicked "$fslog"; then
		log "FAIL fusebox panicked"
		fail=1
	fi
fi

status=$fail
if [ "$status" = 0 ]; then
	log "OK ($(( $(date +%s) - begin )) s)"
else
	log "FAILED"
fi
exit "$status"
