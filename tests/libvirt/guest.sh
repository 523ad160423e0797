#!/bin/sh
# The guest half of tests/libvirt/run.sh: runs in the test guest (busybox
# sh, from /init with fusebox.run=libvirt) on the virtiofs mount $1.
# Prints "PASS name" or "FAIL name: why" per check and then
# "LIBVIRT-GUEST passed=N failed=M"; then holds a flock and a POSIX lock
# on $1/held, for the host to see, until the domain is destroyed.
M=$1
token=
for a in $(cat /proc/cmdline); do
	case $a in fusebox.token=*) token=${a#fusebox.token=} ;; esac
done
pass=0 fail=0
check() {
	name=$1; shift
	if out=$("$@" 2>&1); then pass=$((pass + 1)); echo "PASS $name"
	else fail=$((fail + 1)); echo "FAIL $name: $out"; fi
}

t_mounted() { awk -v m="$M" '$2 == m && $3 == "virtiofs" {f = 1} END {exit !f}' /proc/mounts; }
# What the host put in the share before the boot.
t_host_file() { [ "$(cat "$M/from-host")" = "host $token" ]; }
t_host_xattr() { [ "$(/lvcheck getxattr "$M/from-host" user.fusebox.host)" = "host $token" ]; }
t_readdir() { [ "$(ls "$M")" = from-host ]; }
# What the host checks after (tests/libvirt/run.sh).
t_write() { echo "guest $token" > "$M/from-guest" && [ "$(cat "$M/from-guest")" = "guest $token" ]; }
t_set_xattr() { /lvcheck setxattr "$M/from-guest" user.fusebox.guest "guest $token"; }
# Set, get, list and remove, and the errnos (tests/guest/guestcheck.c).
t_xattr() { : > "$M/xattr" && /guestcheck xattr "$M/xattr"; }

check mounted t_mounted
check host-file t_host_file
check host-xattr t_host_xattr
check readdir t_readdir
check write t_write
check set-xattr t_set_xattr
check xattr-calls t_xattr
check lock-calls /guestcheck lock "$M/lockfile"
echo "LIBVIRT-GUEST passed=$pass failed=$fail"
exec /lvcheck hold "$M/held"
