#!/bin/bash
# Security labels and xattr mapping, checked from a real guest kernel:
#
#   tests/guest/labels.sh [--backports] [--map user|trusted]
#
# Boots the test guest (tests/guest/setup.sh; --backports: QEMU 10 and
# Linux 6.12, which sends the label as a request extension, where
# bookworm's 6.1 puts it after the request's arguments) with SELinux as
# its LSM (security=selinux; the policy is labels-policy.conf, compiled
# here with checkpolicy and loaded by the guest) against `fusebox
# --security-label --xattrmap :map::PREFIX.virtiofs.:`, and runs
# labels-guest.sh in it. Passes when the guest reports no failure and the
# host shows each label the guest's policy gave a new file, directory
# (and, under trusted., symlink and FIFO:
# the host refuses user.* xattrs on those, so under user. their creation
# fails and leaves nothing behind) stored under
# PREFIX.virtiofs.security.selinux, the type the policy's rule for it
# gives (which the guest reads back through GETXATTR when the new inode
# is instantiated: a label not set at creation would read as file_t).
# Linux's FUSE client sends a new inode's label only with the creating
# request, never by a SETXATTR after it.
set -euo pipefail
export LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../scripts/lib.sh
. "$here/../../scripts/lib.sh"
root=$(cd "$here/../.." && pwd)
setup_args=() map=user
while [ $# -gt 0 ]; do
	case $1 in
		--backports) setup_args+=(--backports) ;;
		--map) map=$2; shift ;;
		*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
case $map in user|trusted) ;; *) echo "--map user|trusted" >&2; exit 2 ;; esac
prefix=$map.virtiofs.
setup_guest "${setup_args[@]}"
if ! command -v checkpolicy >/dev/null; then
	apt_get update
	apt_get install checkpolicy
fi
build_fusebox
fusebox=$root/target/release/fusebox

new_work labels

getx() { python3 -c 'import os, sys
try:
    sys.stdout.write(os.getxattr(sys.argv[1], sys.argv[2], follow_symlinks=False).decode())
except OSError as e:
    sys.stdout.write("errno %d" % e.errno)' "$1" "$2"; }

# A host file with one xattr under the prefix and one outside it.
echo pre > "$share/pre"
python3 -c 'import os, sys
os.setxattr(sys.argv[1], sys.argv[2] + "user.h", b"from-host")
os.setxattr(sys.argv[1], "user.hostonly", b"x")' "$share/pre" "$prefix"

cp "$here/labels-guest.sh" "$work/extra/labels.sh"
checkpolicy -U allow -c 33 -o "$work/extra/policy.33" "$here/labels-policy.conf" > "$work/checkpolicy.log" 2>&1 ||
	{ cat "$work/checkpolicy.log"; exit 1; }
add_to_initrd "$work/extra"

# Starts fusebox and boots the guest; returns when QEMU exits (qrc: its
# exit status).
boot() {
	start_daemon "$fusebox" --socket-path "$sock" --shared-dir "$share" --security-label \
		--xattrmap ":map::$prefix:"
	echo "labels: booting $("$qemu" --version | head -1) with SELinux, labels under $prefix"
	start_qemu 600 "security=selinux fusebox.run=labels fusebox.map=$map" -no-reboot
	wait_qemu labels
}
boot
boot_again_on_tcg_assertion labels
wait_fusebox_exit labels

touch "$work/console.log"
grep -aE '^(PASS|FAIL|GUEST|LABEL)' "$work/console.log" || true
grep -a "SELinux: .*\(error\|invalid\|not valid\|denied\)" "$work/console.log" || true
guest_suite_passed labels 30 || status=1

hfail=0
w=$share/labels
if [ "$map" = user ]; then kinds=". file dir"; else kinds=". file dir link fifo"; fi
for n in $kinds; do
	guest=$(tr -d '\r' < "$work/console.log" 2>/dev/null | awk -v n="$n" '$1 == "LABEL" && $2 == n {v = $3} END {print v}')
	host=$(getx "$w/$n" "${prefix}security.selinux" | tr -d '\0')
	echo "labels: $n: the guest's label '$guest', the host's '$host'"
	hcheck "label-$n" '[ -n "$guest" ] && [ "$host" = "$guest" ]'
	# (A host running SELinux labels every file itself.)
	[ -e /sys/fs/selinux/enforce ] ||
		hcheck "no-host-security-name-$n" '[ "$(getx "$w/$n" security.selinux)" = "errno 61" ]'
done
# Nothing else in the guest's directory: under user. the refused symlink
# and FIFO left nothing (under any name).
if [ "$map" = user ]; then made="dir file relabel"; else made="dir fifo file link relabel"; fi
hcheck nothing-else '[ "$(ls -A "$w" | sort | tr "\n" " ")" = "$made " ]'
hcheck nothing-else-in-share '[ "$(ls -A "$share" | sort | tr "\n" " ")" = "labels pre " ]'
hcheck relabel '[ "$(getx "$w/relabel" "${prefix}security.selinux")" = system_u:object_r:labels_relabel_t ]'
hcheck user-xattr '[ "$(getx "$w/file" "${prefix}user.guest")" = g-value ] && [ "$(getx "$w/file" user.guest)" = "errno 61" ]'
[ $hfail = 0 ] || status=1
[ $status = 0 ] && echo "labels: OK" || { echo "labels: FAILED"; tail -20 "$work/fusebox.log"; }
exit $status
