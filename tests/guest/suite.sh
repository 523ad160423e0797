#!/bin/sh
# The guest half of the guest suite: runs inside the test VM (busybox sh)
# on the virtiofs mount $1. Prints "PASS name" or "FAIL name: why" per
# check and a last line "GUEST-SUITE passed=N failed=M". The host half
# (tests/guest/run.sh) checks what this leaves in the shared directory.
M=$1
cd "$M" || { echo "GUEST-SUITE passed=0 failed=1"; exit 1; }
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "PASS $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1: $2"; }
check() { name=$1; shift; if out=$("$@" 2>&1); then ok "$name"; else bad "$name" "$out"; fi; }

# First, before anything lists the root: the announced submount.
t_submount() {
	[ "$(cat "$M/submnt/marker")" = sub ] &&
	[ "$(stat -c %d "$M/submnt")" != "$(stat -c %d "$M")" ] &&
	[ "$(stat -c %d "$M/submnt/marker")" = "$(stat -c %d "$M/submnt")" ]
}
check submount-own-st_dev t_submount

mkdir -p work && cd work || exit 1

t_create() { echo hello > a && [ "$(cat a)" = hello ]; }
t_write() { printf '0123456789' > w && printf 'XY' | dd of=w bs=1 seek=3 conv=notrunc 2>/dev/null && [ "$(cat w)" = 012XY56789 ]; }
t_append() { echo one > ap && echo two >> ap && [ "$(cat ap)" = "$(printf 'one\ntwo')" ]; }
t_truncate() { printf '0123456789' > tr && truncate -s 4 tr && [ "$(cat tr)" = 0123 ] && truncate -s 100 tr && [ "$(stat -c %s tr)" = 100 ]; }
t_rename() { echo r > r1 && mv r1 r2 && [ ! -e r1 ] && [ "$(cat r2)" = r ]; }
t_rename_over() { echo new > n1 && echo old > n2 && mv -f n1 n2 && [ "$(cat n2)" = new ] && [ ! -e n1 ]; }
t_hardlink() { echo h > h1 && ln h1 h2 && [ "$(stat -c %h h1)" = 2 ] && [ "$(stat -c %i h1)" = "$(stat -c %i h2)" ] && rm h1 && [ "$(cat h2)" = h ]; }
t_symlink() { echo s > target && ln -s target sl && [ "$(readlink sl)" = target ] && [ "$(cat sl)" = s ]; }
t_chmod() { : > cm && chmod 0640 cm && [ "$(stat -c %a cm)" = 640 ] && chmod 4755 cm && [ "$(stat -c %a cm)" = 4755 ]; }
t_chown() { : > co && chown 1234:5678 co && [ "$(stat -c %u:%g co)" = 1234:5678 ]; }
# fusebox started unprivileged (fusebox.unpriv=1): the daemon's user owns
# what guest root makes (seen as 0:0 through a user namespace, as the
# user's own ids with --sandbox none); a chown to the owner it has works,
# one to other ids fails and changes nothing.
t_chown_unpriv() { : > co && o=$(stat -c %u:%g co) && chown "$o" co && ! chown 1234:5678 co 2>/dev/null && [ "$(stat -c %u:%g co)" = "$o" ]; }
t_utimens() { : > ut && touch -d '2001-02-03 04:05:06' ut && [ "$(stat -c %Y ut)" = "$(date -d '2001-02-03 04:05:06' +%s)" ]; }
t_mkdir_rmdir() { mkdir dd && [ -d dd ] && ! rmdir /nonexistent/x 2>/dev/null && rmdir dd && [ ! -e dd ]; }
t_unlink_open() { echo keep > uo && exec 3< uo && rm uo && [ "$(cat <&3)" = keep ]; r=$?; exec 3<&-; return $r; }
t_errors() { ! cat nosuchfile 2>/dev/null && mkdir e1 && ! mkdir e1 2>/dev/null && : > e1/x && ! rmdir e1 2>/dev/null; }

check create t_create
check write t_write
check append t_append
check truncate t_truncate
check rename t_rename
check rename-over t_rename_over
check hardlink t_hardlink
check symlink t_symlink
check chmod t_chmod
if grep -q "fusebox.unpriv=1" /proc/cmdline; then check chown-unprivileged t_chown_unpriv; else check chown t_chown; fi
check utimens t_utimens
check mkdir-rmdir t_mkdir_rmdir
check unlink-while-open t_unlink_open
check errnos t_errors
check xattr /guestcheck xattr "$M/work/a"
# ACLs, when fusebox serves them (--posix-acl: kernel argument fusebox.acl=1).
grep -q "fusebox.acl=1" /proc/cmdline && check posix-acl /guestcheck acl "$M/work/acl"
check locks /guestcheck lock "$M/work/lockfile"
check mmap /guestcheck mmap "$M/work/mapped"
check o-direct /guestcheck direct "$M/work/direct"

# Confinement, from inside the guest: links in the share that point at a
# host file outside it are followed here, in the guest's own tree, never
# on the host; writing through them changes nothing on the host (the host
# half checks); .. at the mount root stays in the guest; a hard link to a
# guest file cannot cross into the share.
t_confine() {
	for l in rel abs; do
		case $(cat "$M/esc/$l" 2>/dev/null) in SECRET*) echo "read the host's secret via $l"; return 1 ;; esac
		echo pwned 2>/dev/null > "$M/esc/$l" || :
	done
	[ "$(cd "$M/.." && pwd)" = "$(cd "$(dirname "$M")" && pwd)" ] || { echo ".. left the guest"; return 1; }
	! ln /init "$M/work/hl" 2>/dev/null || { echo "hard link across"; return 1; }
	! grep -rqs SECRET "$M/esc" "$M/work" || { echo "secret visible"; return 1; }
}
check confinement t_confine

# 64 MiB both ways: the host's file read here, this one read on the host.
t_host64() { [ "$(sha256sum "$M/host64.bin" | cut -d' ' -f1)" = "$(cat "$M/host64.sha256")" ]; }
t_guest64() {
	dd if=/dev/urandom of="$M/guest64.bin" bs=1M count=64 2>/dev/null &&
	sync && sha256sum "$M/guest64.bin" | cut -d' ' -f1 > "$M/guest64.sha256" &&
	echo 3 > /proc/sys/vm/drop_caches &&
	[ "$(sha256sum "$M/guest64.bin" | cut -d' ' -f1)" = "$(cat "$M/guest64.sha256")" ]
}
check 64MiB-host-to-guest t_host64
check 64MiB-guest-to-host t_guest64

# DAX (fusebox.dax=1: tests/guest/run.sh --dax, the share mounted with
# -o dax=inode): the host's dax.bin, a whole number of 2 MiB ranges, is
# read through the device's window; written there with write(2) and
# through a shared mapping (the host half checks both); and a host write
# to it is seen through a mapping here. dax-go tells the host to write.
# Tells the host (tests/guest/run.sh) to look: makes $1 and waits for
# the host's $1-seen.
dax_told() {
	: > "$M/$1" && i=0
	while [ ! -e "$M/$1-seen" ]; do
		[ $i -ge 120 ] && { echo "the host never looked after $1"; return 1; }
		sleep 1; i=$((i + 1))
	done
}
t_dax() {
	f=$M/dax.bin
	[ "$(sha256sum "$f" | cut -d' ' -f1)" = "$(cat "$M/dax.sha256")" ] || { echo "read through the window differs"; return 1; }
	printf GUESTDAX | dd of="$f" bs=1 seek=1048576 conv=notrunc 2>/dev/null || { echo "write"; return 1; }
	# Written through the window, not flushed: the host finds dirty pages.
	dax_told dax-written || return 1
	# msync(MS_SYNC) is an FSYNC: the host finds none dirty after it.
	/guestcheck mapput "$f" 3145728 MMAPDAX || return 1
	dax_told dax-synced || return 1
	/guestcheck mapshare "$f" 3670016 SHAREDAX || return 1
	sync
	: > "$M/dax-go"
	/guestcheck mapwatch "$f" 2101248 HOSTDAX 60
}
grep -q "fusebox.dax=1" /proc/cmdline && check dax-window t_dax

# 10,000 entries made here, listed here, and counted again on the host.
t_bigdir() {
	mkdir big && i=0 &&
	while [ $i -lt 10000 ]; do : > big/f$i || return 1; i=$((i + 1)); done &&
	[ "$(ls big | wc -l)" = 10000 ] && [ -e big/f9999 ] && [ -e big/f0 ]
}
check dir-10000-entries t_bigdir

# Soak: fsx (every operation on) through the device, one run of OPS
# operations and four at once on distinct files (PAR each); OPS and PAR
# are the kernel arguments fusebox.fsx_ops and fusebox.fsx_par
# (tests/guest/run.sh --fsx-ops, --fsx-parallel-ops).
ops=4000 par=
for a in $(cat /proc/cmdline); do
	case $a in
	fusebox.fsx_ops=*) ops=${a#fusebox.fsx_ops=} ;;
	fusebox.fsx_par=*) par=${a#fusebox.fsx_par=} ;;
	esac
done
par=${par:-$((ops / 4))}
# fsx 0.3.2 never unmaps what its mapread maps and slows down as the
# mappings pile up (a truncate walks every one), so a long run is a chain
# of fsx runs of at most 2,000 operations each, next seed each time (in
# the TCG guest a 20,000-op run averages 30% fewer operations per second).
fsx_chain() { # TAG OPS SEED
	mkdir -p /tmp/$1 && n=0 k=0
	while [ $n -lt $2 ]; do
		c=$(($2 - n)); [ $c -gt 2000 ] && c=2000
		/bin/fsx -q -f /fsx.toml -N $c -S $(($3 + 100 * k)) -P /tmp/$1 "$M/work/$1" > /tmp/$1.out 2>&1 ||
			{ echo "GUEST: $1 failed in run $k"; tail -5 /tmp/$1.out; return 1; }
		n=$((n + c)) k=$((k + 1))
		# To the console itself: check() keeps a check's output until it ends.
		[ $2 -gt 20000 ] && [ $((k % 50)) = 0 ] &&
			echo "GUEST: $1 $n of $2 operations A-OK ($(cut -d. -f1 /proc/uptime) s up)" > /dev/console
	done
	return 0
}
t_fsx() {
	fsx_chain fsx0 "$ops" 7 || return 1
	for i in 1 2 3 4; do fsx_chain fsx$i "$par" $((7 + i)) & done
	r=0; for j in 1 2 3 4; do wait %$j || r=1; done
	return $r
}
check "fsx-$ops-ops-then-4x$par-parallel" t_fsx

# Two CPUs at once: with several request queues each CPU submits on its
# own, and both streams must come back intact.
t_parallel() {
	[ "$(nproc)" -ge 2 ] || return 0
	for c in 0 1; do
		taskset -c $c sh -c "i=0; while [ \$i -lt 200 ]; do
			echo $c.\$i > par$c.\$((i % 8)) && [ \"\$(cat par$c.\$((i % 8)))\" = $c.\$i ] || exit 1
			i=\$((i + 1)); done" &
	done
	wait %1 && wait %2
}
check parallel-cpus t_parallel

cd "$M" && sync
echo "GUEST-SUITE passed=$pass failed=$fail"
