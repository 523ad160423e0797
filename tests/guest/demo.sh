#!/bin/sh
# What the demo guest shows of the share on $1 (read-only: nothing is
# written to the shared directory).
M=$1
echo "===== the guest's view of the shared directory ($(uname -r), $(nproc) cpu(s))"
mount | grep " $M "
echo
df -h "$M"
echo
ls -la "$M"
echo
echo "===== up to 40 entries, two levels deep"
find "$M" -maxdepth 2 | head -40
echo
for f in $(find "$M" -maxdepth 1 -type f | head -3); do
	echo "===== $f: $(stat -c '%s bytes, mode %a, uid %u' "$f"), sha256 $(sha256sum "$f" | cut -d' ' -f1)"
done
