# The guest's half of tests/guest/labels.sh, run by /init as /labels.sh
# (fusebox.run=labels) with the share's mount point. The kernel runs
# SELinux (security=selinux); this loads /policy.33 (labels-policy.conf,
# permissive), whose rules label what the guest creates on the share, and
# the kernel sends each label with the creating request
# (FUSE_SECURITY_CTX). fusebox.map=user|trusted says which host prefix
# fusebox's --xattrmap puts the guest's names under. Prints PASS/FAIL
# lines, LABEL lines (path and the label the guest reads back) for the
# host to compare, and GUEST-SUITE passed=N failed=M.
M=$1/labels
map=user
for a in $(cat /proc/cmdline); do
	case $a in fusebox.map=*) map=${a#fusebox.map=} ;; esac
done
passed=0 failed=0
check() {
	name=$1; shift
	if "$@"; then echo "PASS $name"; passed=$((passed + 1)); else echo "FAIL $name"; failed=$((failed + 1)); fi
}
gx() { /guestcheck getx "$1" "$2"; }

mount -t securityfs none /sys/kernel/security 2>/dev/null
check selinux-is-on grep -q selinux /sys/kernel/security/lsm
mkdir -p /sys/fs/selinux
mount -t selinuxfs none /sys/fs/selinux
check policy-loaded /guestcheck put /policy.33 /sys/fs/selinux/load
echo "GUEST: SELinux context $(cat /proc/self/attr/current), enforcing $(cat /sys/fs/selinux/enforce)"
mkdir "$M"
echo data > "$M/file"
mkdir "$M/dir"
# Creations the host can label under either prefix, then a symlink and a
# FIFO: the host refuses user.* xattrs on those, so under user.virtiofs.
# their creation fails (EPERM) and is undone; under trusted. they work.
ln -s file "$M/link" 2> /tmp/ln.err; lrc=$?
mkfifo "$M/fifo" 2> /tmp/fifo.err; frc=$?
if [ "$map" = user ]; then
	check symlink-refused sh -c "[ $lrc != 0 ] && grep -q 'not permitted' /tmp/ln.err && [ ! -e '$M/link' ] && [ ! -L '$M/link' ]"
	check fifo-refused sh -c "[ $frc != 0 ] && grep -q 'not permitted' /tmp/fifo.err && [ ! -e '$M/fifo' ]"
	labelled="file dir"
else
	check symlink-made sh -c "[ $lrc = 0 ] && [ \"\$(readlink '$M/link')\" = file ]"
	check fifo-made test -p "$M/fifo"
	labelled="file dir link fifo"
fi
# Each got the type the policy's rule for it gives.
l=$(gx security.selinux "$M")
echo "LABEL . $l"
check label-labels-dir [ "$l" = system_u:object_r:labels_dir_t ]
for n in $labelled; do
	l=$(gx security.selinux "$M/$n")
	echo "LABEL $n $l"
	case $n in dir) t=subdir ;; *) t=$n ;; esac
	check "label-$n" [ "$l" = "system_u:object_r:labels_${t}_t" ]
done
# The guest sets a label itself, and another namespace's xattr: both stored
# under the prefix (the host checks), read back under the guest's names
# (the label from the guest's own SELinux, the other from the host).
echo x > "$M/relabel"
check set-label /guestcheck setx security.selinux "system_u:object_r:labels_relabel_t" "$M/relabel"
check get-label sh -c "[ \"\$(/guestcheck getx security.selinux '$M/relabel')\" = system_u:object_r:labels_relabel_t ]"
check set-user /guestcheck setx user.guest g-value "$M/file"
check get-user sh -c "[ \"\$(/guestcheck getx user.guest '$M/file')\" = g-value ]"
# The host's file: its xattr under the prefix shows as the guest's name;
# one outside the prefix is hidden, and the guest cannot reach the
# prefixed name itself.
check host-visible sh -c "[ \"\$(/guestcheck getx user.h '$1/pre')\" = from-host ]"
check host-list sh -c "[ \"\$(/guestcheck listx '$1/pre')\" = user.h ]"
check host-hidden sh -c "[ \"\$(/guestcheck getx user.hostonly '$1/pre')\" = 'errno 61' ]"
check prefix-unreachable sh -c "[ \"\$(/guestcheck getx $map.virtiofs.user.h '$1/pre')\" = 'errno 61' ]"
echo "GUEST-SUITE passed=$passed failed=$failed"
