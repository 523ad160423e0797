#!/bin/bash
# POSIX conformance through a real guest: the Rust pjdfstest (crates.io
# `pjdfstest`) inside the test guest on its virtiofs mount, then the
# ownership checks of guestcheck owners.
#
#   tests/guest/pjdfstest.sh [--daemon fusebox|virtiofsd] [--daemon-args "ARGS"]
#                            [--groups "G ..."] [--timeout S] [--backports]
#
# As root. Gets the test guest (tests/guest/setup.sh; bookworm's Linux 6.1,
# --backports: 6.12 and QEMU 10, which setup.sh installs) and adds to its
# initramfs pjdfstest (from PATH or ~/.cargo/bin; `cargo install --locked
# pjdfstest`) and coreutils' sleep with the libraries ldd lists,
# tests/guest/pjdfstest.toml, pjdfstest-guest.sh, and an /etc/passwd and
# /etc/group with the users the configuration and guestcheck owners
# take: nobody (65534, group nogroup, also in supp1 65531 and supp2
# 65532) and tests (65533, group tests, also in nogroup). Shares a fresh
# tmpfs with the daemon (`--socket-path S --shared-dir D ARGS`, otherwise
# each daemon's defaults), runs the suite's tests of the groups (default:
# all of the port's groups that run on Linux: chmod chown ftruncate link
# mkdir mkfifo mknod open posix_fallocate rename rmdir symlink truncate
# unlink utimensat) as root in the guest, bounded by --timeout (default
# 600 s), then guestcheck owners in the share's directory owners. Lists
# each failed test with what it said. pjdfstest picks tests by substring
# ("link::" also runs unlink's and symlink's): the results of groups not
# asked for are left out.
#
# --daemon fusebox (the default: the build of this tree, or the binary
# FUSEBOX_BIN names) passes when every failed test is in
# tests/guest/pjdfstest-known-failures (the failures virtiofsd 1.14 has
# too; an entry that passed is reported, not an error), every ownership
# check passed, and the host sees the owners and modes those checks left
# in the share. --daemon virtiofsd (from PATH or ~/.cargo/bin, run with
# its defaults) rewrites that list's entries for the groups it ran with
# its failures, keeping the notes of entries that stay, and exits 0 once
# the guest finished: it is how the list is made, not a test (its
# ownership results are printed all the same). CI runs the defaults
# (scripts/test.sh).
set -euo pipefail
export LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../scripts/lib.sh
. "$here/../../scripts/lib.sh"
root=$(cd "$here/../.." && pwd)
setup_args=() daemon=fusebox daemon_args="" tmo=600
all_groups="chmod chown ftruncate link mkdir mkfifo mknod open posix_fallocate rename rmdir symlink truncate unlink utimensat"
groups=$all_groups
while [ $# -gt 0 ]; do
	case $1 in
		--daemon) daemon=$2; shift ;;
		--daemon-args) daemon_args=$2; shift ;;
		--groups) groups=$2; shift ;;
		--timeout) tmo=$2; shift ;;
		--backports) setup_args+=(--backports) ;;
		*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
log() { echo "pjdfstest-guest: $*"; }
[ "$(id -u)" = 0 ] || { log "needs root"; exit 1; }
known=$here/pjdfstest-known-failures
for g in $groups; do
	case " $all_groups " in *" $g "*) ;; *) log "no test group $g (one of: $all_groups)"; exit 2 ;; esac
done
pjd=$(cargo_bin pjdfstest)
[ -x "$pjd" ] || { log "no pjdfstest (cargo install --locked pjdfstest)"; exit 1; }
begin=$(date +%s)

setup_guest "${setup_args[@]}"
case $daemon in
	fusebox)
		daemon_bin=${FUSEBOX_BIN:-}
		if [ -z "$daemon_bin" ]; then
			build_fusebox
			daemon_bin=${CARGO_TARGET_DIR:-$root/target}/release/fusebox
		fi ;;
	virtiofsd) daemon_bin=$(cargo_bin virtiofsd) ;;
	*) log "unknown daemon $daemon (fusebox or virtiofsd)"; exit 2 ;;
esac
[ -x "$daemon_bin" ] || { log "no $daemon at $daemon_bin"; exit 1; }

new_work pjdfstest
umount_at=$share
# A filesystem of the run's own, as the host-mount runs use
# (tests/conformance/mount.sh).
mount -t tmpfs -o size=256m,mode=0755 fusebox-pjdfstest "$share"

# The guest's additions: pjdfstest, a sleep of its own (the ETXTBSY
# tests copy `which sleep` into the share and run it: busybox's, under
# another name, exits at once) and the libraries both link, the suite's
# configuration, the users, what to run.
x=$work/extra
mkdir -p "$x/bin" "$x/pjd-bin" "$x/etc"
cp "$pjd" "$x/bin/pjdfstest"
cp /usr/bin/sleep "$x/pjd-bin/sleep"
copy_libs "$x" "$pjd" /usr/bin/sleep
cp "$here/pjdfstest.toml" "$x/pjdfstest.toml"
cp "$here/pjdfstest-guest.sh" "$x/pjdfstest.sh"
cat > "$x/etc/passwd" <<'EOF'
root:x:0:0:root:/:/bin/sh
tests:x:65533:65533:tests:/nonexistent:/bin/false
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat > "$x/etc/group" <<'EOF'
root:x:0:
supp1:x:65531:nobody
supp2:x:65532:nobody
tests:x:65533:
nogroup:x:65534:tests
EOF
printf 'passwd: files\ngroup: files\n' > "$x/etc/nsswitch.conf"
printf 'tmo=%s\ngroups="%s"\n' "$tmo" "$groups" > "$x/pjdfstest.conf"
add_to_initrd "$x"

# Starts the daemon and boots the guest; returns when QEMU exits (qrc: its
# exit status).
boot() {
	# shellcheck disable=SC2086 # the daemon's arguments split on spaces
	start_daemon "$daemon_bin" --socket-path "$sock" --shared-dir "$share" $daemon_args
	log "booting $("$qemu" --version | head -1), $("$daemon_bin" --version 2>&1 | head -1) ${daemon_args:+($daemon_args) }on the share, $("$pjd" --version), groups: $groups"
	start=$(date +%s)
	start_qemu $((tmo + 300)) "fusebox.run=pjdfstest" -no-reboot
	wait_qemu pjdfstest-guest
}
boot
boot_again_on_tcg_assertion pjdfstest-guest
log "guest ran $(($(date +%s) - start)) s"
wait_fusebox_exit pjdfstest-guest
fusebox_status=$status

tr -d '\r' < "$work/console.log" > "$work/console.txt"
done_line=$(grep -a '^PJD-DONE' "$work/console.txt" | tail -1 || true)
summary=$(grep -a '^PJD-Summary' "$work/console.txt" | tail -1 || true)
if [ -z "$done_line" ] || [ -z "$summary" ]; then
	log "FAIL the guest did not finish the suite${done_line:+ (${done_line#PJD-})}"
	grep -av '^\s*$' "$work/console.txt" | tail -40 | sed 's/^/  /'
	tail -20 "$work/fusebox.log" | sed 's/^/  /'
	exit 1
fi
log "${summary#PJD-} (${done_line#PJD-DONE })"
# Lines whose first word is a test name of one of the groups run.
in_groups() {
	awk -v groups=" $groups " '{ g = $1; sub("::.*", "", g); if (index(groups, " " g " ")) print }'
}
grep -a '^PJD-RESULT .* FAILED$' "$work/console.txt" | awk '{print $2}' | in_groups | sort -u > "$work/failed" || true
grep -a '^PJD-WHY ' "$work/console.txt" | sed 's/^PJD-WHY //' > "$work/why" || true
grep -a '^PJD-RESULT .* skipped$' "$work/console.txt" | awk '{print $2}' | in_groups > "$work/skipped" || true
[ -s "$work/skipped" ] && log "skipped: $(tr '\n' ' ' < "$work/skipped")"

# The known list's entries (NAME, then a note after #) in the groups run.
entries() { awk '!/^(#|$)/' "$known"; }
entries | in_groups | sed 's/ *#.*//' | sort -u > "$work/known"
log "$(wc -l < "$work/failed") failed tests, $(comm -12 "$work/failed" "$work/known" | wc -l) of them on $(basename "$known")"
# Each failure once, "known" or "new" (not on the list) before it, with
# what it said.
while read -r f; do
	grep -qxF "$f" "$work/known" && k=known || k=new
	printf '  %-5s %s: %s\n' "$k" "$f" "$(awk -v f="$f" '$1 == f { $1 = ""; sub(/^ /, ""); print; exit }' "$work/why")"
done < "$work/failed"

# The ownership checks: the guest's lines, then what the host sees.
grep -a '^OWNERS ' "$work/console.txt" | sed 's/^OWNERS /  owners: /' || true
owners_ok=1
grep -aq '^OWNERS-DONE rc=0$' "$work/console.txt" || owners_ok=0
grep -aq '^OWNERS FAIL' "$work/console.txt" && owners_ok=0
host_sees() { # path, expected "uid:gid mode"
	local got
	got=$(stat -c '%u:%g %a' "$share/owners/$1" 2>&1 || true)
	if [ "$got" = "$2" ]; then
		log "host sees owners/$1 as $got: PASS"
	else
		log "host sees owners/$1 as $got, not $2: FAIL"
		owners_ok=0
	fi
}
host_sees own "65534:65532 644"
host_sees own-link "65534:65531 777"
host_sees setgid "65534:65531 2755"
host_sees tests-own "65533:65534 600"

if [ "$daemon" = virtiofsd ]; then
	# Rewrites the list: its header, the entries of groups not run, and one
	# entry per failure now (a kept note where the entry was there).
	{
		sed -n '/^#/p; /^$/q' "$known"
		echo
		{
			entries | awk -v groups=" $groups " '{ g = $1; sub("::.*", "", g); if (!index(groups, " " g " ")) print }'
			while read -r f; do
				note=$(awk -v f="$f" '$1 == f { sub(/^[^#]*# */, ""); print; exit }' "$known")
				[ -n "$note" ] || note="virtiofsd 1.14 fails it too: $(awk -v f="$f" '$1 == f { $1 = ""; sub(/^ /, ""); print; exit }' "$work/why")"
				printf '%s # %s\n' "$f" "$note"
			done < "$work/failed"
		} | sort
	} > "$work/known.new"
	cp "$work/known.new" "$known"
	log "rewrote $known for groups $groups: $(cd "$root" && git diff --stat -- "$known" | tail -1 | grep . || echo unchanged)"
	[ $owners_ok = 1 ] && log "ownership checks passed" || log "ownership checks failed"
	log "$(($(date +%s) - begin)) s"
	exit 0
fi

status=$fusebox_status
new=$(comm -23 "$work/failed" "$work/known" | wc -l)
gone=$(comm -13 "$work/failed" "$work/known")
[ -n "$gone" ] && log "passed here, on the known list (virtiofsd 1.14 fails them): $(echo $gone)"
if [ "$new" != 0 ]; then
	log "FAIL $new failed tests virtiofsd 1.14 does not fail (the lines marked new)"
	status=1
fi
if [ $owners_ok = 1 ]; then
	log "PASS ownership changes through supplementary groups"
else
	log "FAIL ownership changes through supplementary groups"
	status=1
fi
log "$(($(date +%s) - begin)) s"
[ $status = 0 ] && log "OK" || log "FAILED"
exit $status
