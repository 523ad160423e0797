# The guest's half of tests/guest/reboot.sh, run by /init as /reboot.sh
# (fusebox.run=reboot) with the share's mount point, on both boots of the
# same guest. Prints REBOOT-MOUNTED first, then waits for the host's file
# go in the share (the host counts the daemon's fds before making it).
# The first boot (no file booted in the share yet) makes booted, opens 50
# files and takes a POSIX lock and a flock on lockfile (guestcheck hold:
# "HELD ...") and keeps them until the host resets the machine. The
# second takes both locks on lockfile again without waiting and prints
# REBOOT-RELOCK-OK or REBOOT-RELOCK-FAIL with what each call returned.
M=$1
echo "REBOOT-MOUNTED"
i=0
while [ ! -e "$M/go" ]; do
	i=$((i + 1))
	[ $i -gt 1500 ] && { echo "REBOOT-FAIL no go from the host in 300 s"; exit 1; }
	sleep 0.2
done
if [ ! -e "$M/booted" ]; then
	echo "REBOOT-BOOT 1"
	echo 1 > "$M/booted" && mkdir "$M/held" || { echo "REBOOT-FAIL cannot write the share"; exit 1; }
	/guestcheck hold "$M/held" 50 "$M/lockfile"
	echo "REBOOT-FAIL the holder ended"
else
	echo "REBOOT-BOOT 2"
	if out=$(/guestcheck relock "$M/lockfile" 2>&1); then
		echo "REBOOT-RELOCK-OK $out"
	else
		echo "REBOOT-RELOCK-FAIL $out"
	fi
fi
