# Sourced by the conformance scripts: builds fusebox, mounts a fresh tmpfs
# and serves it with `fusebox mount "$@"` on "$work/mnt"; cleans up on exit.
# Sets: work (a directory readable by the suite's users), daemon (pid).
# Needs scripts/lib.sh, which the scripts source first.
build_fusebox
work=$(mktemp -d /tmp/fusebox-conf.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/share" "$work/mnt" "$work/artifacts"
mount -t tmpfs -o size=256m fusebox-conf "$work/share"
chmod 755 "$work/share"
target/release/fusebox mount --shared-dir "$work/share" "$work/mnt" "$@" >"$work/log" 2>&1 &
daemon=$!
cleanup() {
  kill -INT "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  umount -l "$work/mnt" 2>/dev/null || true
  umount -l "$work/share" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
wait_until 100 0.05 grep -q " $work/mnt fuse.fusebox " /proc/mounts || { cat "$work/log"; exit 1; }
# With --kernel-passthrough the suite must really run on it: the first
# access waits for INIT, after which the daemon says whether it took.
if [[ " $* " == *" --kernel-passthrough "* ]]; then
  stat "$work/mnt" >/dev/null
  wait_until 100 0.05 grep -q "kernel passthrough on" "$work/log" || { echo "kernel passthrough is not on:"; cat "$work/log"; exit 1; }
fi
