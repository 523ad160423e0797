# The shell library of the tests, benches and scripts: sourced, never run,
# from the sourcing script's own directory (`. "$here/../../scripts/lib.sh"`
# and the like), so it works from any cwd. It sets no shell options: each
# script keeps its own `set -euo pipefail`. Functions set the globals their
# comments name.

# ---- Any script: building, installing, waiting, stopping.

# The checkout this library is in.
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Builds fusebox and fusebox-load (release) in this checkout, quietly.
build_fusebox() { (cd "$repo_root" && cargo build --release -q -p fusebox); }

# Makes the unprivileged user tests (no home, no login), unless it exists.
add_tests_user() { id tests >/dev/null 2>&1 || useradd -M -U -s /usr/sbin/nologin tests; }

# Installs the crates.io tool $1 (cargo install --locked) unless it is on PATH.
cargo_install_missing() { command -v "$1" >/dev/null 2>&1 || cargo install --quiet --locked "$1"; }

# Prints where the cargo-installed tool $1 is: on PATH, else ~/.cargo/bin.
cargo_bin() { command -v "$1" || echo "$HOME/.cargo/bin/$1"; }

# Updates apt's lists, then installs the packages "$@" not asking; both
# very quiet (-qq).
apt_install() {
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

# apt-get "$@", not asking, quiet (-q), its output on stderr (stdout is
# left to the script's own results).
apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Use-Pty=0 "$@" >&2; }

# Runs "$@" until it succeeds, at most $1 times, $2 seconds apart; fails
# if it never did.
wait_until() {
	local tries=$1 secs=$2 i
	shift 2
	for ((i = 1; i <= tries; i++)); do
		"$@" && return 0
		[ "$i" = "$tries" ] || sleep "$secs"
	done
	return 1
}

# Waits for a socket at $1: at most $2 looks (default 100), $3 seconds
# apart (default 0.1); fails if none came, or at once when process $4 (if
# given) has exited.
wait_socket() {
	local i
	for ((i = 1; i <= ${2:-100}; i++)); do
		[ -S "$1" ] && return 0
		[ -z "${4:-}" ] || kill -0 "$4" 2>/dev/null || return 1
		[ "$i" = "${2:-100}" ] || sleep "${3:-0.1}"
	done
	return 1
}

# Whether process $1 is gone: no such process, or a zombie (exited, not
# yet waited for).
gone() { [ ! -e "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }

# Stops process $1 (none if empty): SIGTERM, SIGKILL if it is still there
# after $2 seconds (default 5), then waits for it if it is this shell's.
stop_pid() {
	[ -n "$1" ] || return 0
	kill "$1" 2>/dev/null || true
	timeout "${2:-5}" tail --pid="$1" -f /dev/null 2>/dev/null || kill -9 "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# ---- Tests and benches: checks and figures.

# A host-side check: prints "HOST PASS $1" when the shell expression $2
# holds, else "HOST FAIL $1", counting the failures in hfail.
hcheck() {
	if eval "$2"; then echo "HOST PASS $1"; else echo "HOST FAIL $1"; hfail=$((${hfail:-0} + 1)); fi
}

# Prints the median of the numbers on stdin (the mean of the middle two
# for an even count) with printf format $1 (default: as read, a mean as
# %.2f), or $2 (default n/a) when there are none.
median() {
	sort -g | awk -v f="${1:-}" -v none="${2:-n/a}" '{a[NR] = $1}
		END {
			if (!NR) {print none; exit}
			m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
			if (f != "") printf f "\n", m
			else if (NR % 2) print m
			else printf "%.2f\n", m
		}'
}

# Makes $1 hold $2 MiB of random data unless it is that size already (an
# interrupted write leaves it short, so it is made again).
ensure_file() {
	local size
	size=$(stat -c %s "$1" 2>/dev/null || echo 0)
	[ "$size" = $(($2 << 20)) ] && return
	echo "making $1 ($2 MiB from /dev/urandom)" >&2
	dd if=/dev/urandom of="$1" bs=1M count="$2" conv=fsync status=none
}

# ---- The test guest (tests/guest/setup.sh), for every script that boots it
# (the guest suites, the libvirt and migration tests, scripts/demo.sh).

# Gets the test guest ready (tests/guest/setup.sh "$@"): sets gdir to its
# directory and qemu to the QEMU binary it runs on.
setup_guest() {
	gdir=$("$repo_root/tests/guest/setup.sh" "$@" | tail -1)
	qemu=$(cat "$gdir/qemu")
}

# Copies the shared libraries that the binaries $2... link (as ldd lists
# them) under the directory $1, each at its own path.
copy_libs() {
	local dest=$1 lib
	shift
	for lib in $(ldd "$@" | awk '/=> \// {print $3} /^\t\/lib64/ {print $1}' | sort -u); do
		mkdir -p "$dest$(dirname "$lib")"
		cp -L "$lib" "$dest$lib"
	done
}

# Appends the files of directory $1 to the test guest's initramfs as a
# second cpio archive (the kernel unpacks both); sets initrd to the result.
add_to_initrd() {
	(cd "$1" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/extra.cpio.gz"
	cat "$gdir/initramfs.gz" "$work/extra.cpio.gz" > "$work/initrd.gz"
	initrd=$work/initrd.gz
}

# Sets the array vm_args to QEMU's arguments for the test guest of $gdir
# with a vhost-user-fs share: TCG, a qemu64 CPU (TCG runs this guest's
# kernel 20-25% faster than with -cpu max), $4 CPUs, $5 of memory (memfd,
# shared: the daemon maps it), the kernel with the initramfs $2 and the
# kernel arguments $3 after the console's and fusebox.tag=share, and the
# daemon's socket $1 as vhost-user-fs-pci tag "share" with the device
# options $6 (such as ",num-request-queues=4"); or, when vfs_device is
# set, as that -device (chardev vfs: tests/guest/run.sh --dax).
vhost_user_fs_vm() {
	vm_args=(-accel "tcg,thread=multi" -cpu qemu64 -smp "$4" -m "$5"
		-object "memory-backend-memfd,id=mem,size=$5,share=on" -numa "node,memdev=mem"
		-kernel "$gdir/vmlinuz" -initrd "$2"
		-append "console=ttyS0 panic=-1 quiet fusebox.tag=share $3"
		-chardev "socket,id=vfs,path=$1"
		-device "${vfs_device:-vhost-user-fs-pci,chardev=vfs,tag=share${6:-}}")
}

# ---- The guest suites' host scripts (tests/guest/run.sh, labels.sh,
# pjdfstest.sh, reboot.sh). Each keeps the run's files in $work (the
# daemon's stderr in $work/fusebox.log, whichever daemon it is), the
# daemon's socket in $sock, QEMU's pid in $qpid and the daemon's in $fpid,
# the test guest's directory (tests/guest/setup.sh) in $gdir and its QEMU
# in $qemu, and defines `boot`, which starts the daemon and QEMU.

# Waits for fusebox's socket; ends the script if it never comes.
wait_listening() {
	wait_socket "$sock" || { cat "$work/fusebox.log"; echo "fusebox did not listen"; exit 1; }
}

# Starts the vhost-user daemon "$@" in the background ($fpid), its stderr
# in $work/fusebox.log, and waits for its socket $sock.
start_daemon() {
	rm -f "$sock"
	"$@" 2> "$work/fusebox.log" &
	fpid=$!
	wait_listening
}

# Waits up to 10 s for fusebox to exit, as it does when its VMM has gone;
# sets status (1 with a FAIL line if it did not, or failed). $1 names the
# script in messages.
wait_fusebox_exit() {
	status=0
	if ! wait_until 100 0.1 gone "$fpid"; then
		echo "$1: FAIL fusebox still running after the VMM left"
		kill "$fpid" 2>/dev/null || true
		status=1
	else
		wait "$fpid" || { echo "$1: FAIL fusebox exited with $?"; status=1; }
	fi
	fpid=
}

# The process serving the device: with --sandbox namespace the daemon
# forks and its child serves (in new pid and mount namespaces), otherwise
# $fpid itself.
serving_pid() {
	local c
	c=$(cat "/proc/$fpid/task/$fpid/children" 2>/dev/null | awk '{print $1}')
	echo "${c:-$fpid}"
}

# Boots the test guest in the background ($qpid), bounded by timeout $1
# seconds, as vhost_user_fs_vm has it: $smp CPUs (default 2), 1 GiB, the
# initramfs $initrd (default $gdir's), the kernel arguments $2, the share
# on $sock with the device options $vfs_opts; the serial console in
# $work/console.log, QEMU's stderr in $work/qemu.err. The remaining
# arguments go to QEMU (-no-reboot, -qmp ...).
start_qemu() {
	local tmo=$1 append=$2
	shift 2
	vhost_user_fs_vm "$sock" "${initrd:-$gdir/initramfs.gz}" "$append" "${smp:-2}" 1G "${vfs_opts:-}"
	timeout "$tmo" "$qemu" "${vm_args[@]}" \
		-display none -monitor none -serial file:"$work/console.log" "$@" 2> "$work/qemu.err" &
	qpid=$!
}

# Waits for the QEMU started in the background ($qpid); sets qrc to its
# exit status and passes on its stderr. $1 names the script in messages.
wait_qemu() {
	qrc=0
	wait "$qpid" || qrc=$?
	qpid=
	cat "$work/qemu.err" >&2
	[ "$qrc" = 0 ] || echo "$1: qemu exited with $qrc"
}

# Multi-threaded TCG in QEMU 7.2 and 10.0 now and then trips over its own
# assertion while the guest kernel boots (iotlb_to_section, seen once in
# a few hundred boots here). Before the guest printed anything nothing of
# fusebox's has been exercised: say so, end that fusebox and boot once
# more. $1 names the script in messages.
boot_again_on_tcg_assertion() {
	if [ "$qrc" = 134 ] && grep -q "Assertion" "$work/qemu.err" && ! grep -aq "^GUEST\|^PASS\|^FAIL" "$work/console.log"; then
		echo "$1: QEMU aborted on its own assertion before the guest ran; booting again (once)"
		wait_until 100 0.1 gone "$fpid" || true
		kill "$fpid" 2>/dev/null || true
		wait "$fpid" 2>/dev/null || true
		boot
	fi
}

# Waits up to $2 seconds for the console to show $3 lines (default 1)
# matching the extended regular expression $1 (carriage returns dropped);
# fails at once when QEMU has exited.
wait_console() {
	local end=$(($(date +%s) + $2)) n
	while :; do
		n=$({ tr -d '\r' < "$work/console.log"; } 2>/dev/null | grep -acE "$1" || true)
		[ "$n" -ge "${3:-1}" ] && return 0
		kill -0 "$qpid" 2>/dev/null || return 1
		[ "$(date +%s)" -lt $end ] || return 1
		sleep 0.5
	done
}

# Whether the guest suite's last GUEST-SUITE line in $work/console.log
# says failed=0; if not, says so as $1 and shows the console's last $2
# lines.
guest_suite_passed() {
	local result
	result=$(grep -a 'GUEST-SUITE' "$work/console.log" | tail -1 || true)
	case $result in
	*"failed=0"*) return 0 ;;
	esac
	echo "$1: FAIL guest suite: ${result:-no result}"
	tail -n "$2" "$work/console.log"
	return 1
}

# Makes the run's directory $work (/tmp/fusebox-NAME.XXXXXX) with the
# shared directory $share, the socket path $sock and $work/extra (files
# for the initramfs). At exit QEMU ($qpid) and the daemon ($fpid) are
# stopped, the mounts named in $umount_at (set it after this) unmounted,
# and $work removed.
new_work() {
	work=$(mktemp -d "/tmp/fusebox-$1.XXXXXX")
	share=$work/share
	sock=$work/vfs.sock
	mkdir -p "$share" "$work/extra"
	trap end_work EXIT
}
# The EXIT trap new_work sets: stops QEMU and the daemon, unmounts, removes $work.
end_work() {
	[ -n "${qpid:-}" ] && kill "$qpid" 2>/dev/null || true
	[ -n "${fpid:-}" ] && kill "$fpid" 2>/dev/null || true
	local m
	for m in ${umount_at:-}; do umount "$m" 2>/dev/null || true; done
	rm -rf "$work"
}
