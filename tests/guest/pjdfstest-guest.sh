# The guest's half of tests/guest/pjdfstest.sh, run by /init as
# /pjdfstest.sh (fusebox.run=pjdfstest) with the share's mount point.
# /bin/pjdfstest is the Rust pjdfstest, /pjdfstest.toml its configuration,
# /pjd-bin holds the sleep its ETXTBSY tests copy and run,
# /pjdfstest.conf sets tmo (the seconds the suite may take) and groups
# (the test name prefixes to run). Runs the suite as root in a fresh
# directory of the share, with a tmpfs of the guest's own as its second
# filesystem (EXDEV), and prints each test's result as
#   PJD-RESULT NAME ok|FAILED|skipped
# with, after a FAILED one, what the test said as
#   PJD-WHY NAME text
# then
#   PJD-DONE rc=N secs=S
# (rc: pjdfstest's exit status, 143 when it ran out of time). Then the
# ownership checks (guestcheck owners, "OWNERS PASS|FAIL ..." lines) in
# the share's directory owners, and OWNERS-DONE.
M=$1
. /pjdfstest.conf
PATH=/pjd-bin:$PATH
up() { cut -d. -f1 /proc/uptime; }
mkdir -p /scratch && mount -t tmpfs -o mode=0755 scratch /scratch || echo "PJD-WHY setup no tmpfs for EXDEV"
d=$M/pjdfstest
mkdir -m 0755 "$d" || { echo "PJD-DONE rc=setup secs=0"; exit 1; }
t0=$(up)
patterns=
for g in $groups; do patterns="$patterns $g::"; done
# shellcheck disable=SC2086 # one pattern per group
(cd "$d" && NO_COLOR=1 timeout "$tmo" /bin/pjdfstest -c /pjdfstest.toml -p "$d" -s /scratch $patterns) > /tmp/pjd.out 2>&1 < /dev/null
rc=$?
# Name and outcome per line; a failure's message is the next line, a tab
# first (the lines of a backtrace, if any, are left out).
awk '
	/^[a-z_0-9]+::[^ ]* +(ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY)$/ {
		name = $1; sub(/^[^ ]+ +/, ""); print "PJD-RESULT " name " " $0; failed = ($0 == "FAILED"); next
	}
	failed && /^\t/ { sub(/^\t/, ""); print "PJD-WHY " name " " $0; failed = 0; next }
	/^Summary:/ { print "PJD-" $0 }
	/^(error|Error)/ { print "PJD-WHY run " $0 }
' /tmp/pjd.out
echo "PJD-DONE rc=$rc secs=$(($(up) - t0))"
/guestcheck owners "$M/owners"
echo "OWNERS-DONE rc=$?"
