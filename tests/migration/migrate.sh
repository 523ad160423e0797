#!/bin/sh
# The guest half of tests/migration/run.sh: runs in the test guest (busybox
# sh, from /init with fusebox.run=migrate) on the virtiofs mount $1.
# /migcheck prints MIGRATE-READY, waits for the host's trigger file (made
# once the guest runs on the destination) and prints MIGRATE-OK or
# MIGRATE-FAIL lines; /init then unmounts and powers off.
/migcheck "$1"
echo "MIGRATE-GUEST: migcheck exited $?"
