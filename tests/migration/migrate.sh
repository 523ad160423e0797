#!/bin/sh
# The guest half of tests/migration/run.sh: runs in the test guest (busybox
# sh, from /init with fusebox.run=migrate) on the virtiofs mount $1.
# /migcheck prints MIGRATE-READY, waits for the host's trigger file (made
# once the guest runs on the destination, or goes on on the source after a
# failed migration) and prints MIGRATE-OK or MIGRATE-FAIL lines; /init then
# unmounts and powers off. The kernel argument migcheck.scenario=NAME
# (run.sh's --scenario) is passed on to /migcheck.
scenario=normal
for a in $(cat /proc/cmdline); do
	case $a in
		migcheck.scenario=*) scenario=${a#migcheck.scenario=} ;;
	esac
done
/migcheck "$1" "$scenario"
echo "MIGRATE-GUEST: migcheck exited $?"
