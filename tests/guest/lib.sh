# Shared by tests/guest/run.sh and tests/guest/labels.sh (sourced). Both
# keep the run's files in $work, fusebox's socket in $sock, QEMU's pid in
# $qpid and fusebox's in $fpid, and define `boot`, which starts fusebox
# and QEMU.

# Waits for fusebox's socket; ends the script if it never comes.
wait_listening() {
	for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
	[ -S "$sock" ] || { cat "$work/fusebox.log"; echo "fusebox did not listen"; exit 1; }
}

# Waits up to 10 s for fusebox to exit, as it does when its VMM has gone;
# sets status (1 with a FAIL line if it did not, or failed). $1 names the
# script in messages.
wait_fusebox_exit() {
	for _ in $(seq 100); do kill -0 "$fpid" 2>/dev/null || break; sleep 0.1; done
	status=0
	if kill -0 "$fpid" 2>/dev/null; then
		echo "$1: FAIL fusebox still running after the VMM left"
		kill "$fpid" 2>/dev/null || true
		status=1
	else
		wait "$fpid" || { echo "$1: FAIL fusebox exited with $?"; status=1; }
	fi
	fpid=
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
		for _ in $(seq 100); do kill -0 "$fpid" 2>/dev/null || break; sleep 0.1; done
		kill "$fpid" 2>/dev/null || true
		wait "$fpid" 2>/dev/null || true
		boot
	fi
}
