#!/usr/bin/env bash
# The main job: share a host directory with a real guest.
#
#   ./scripts/demo.sh DIR            boot the test guest, show what it sees of DIR
#   ./scripts/demo.sh --shell DIR    the same, with a shell in the guest
#   ./scripts/demo.sh --queues 4 --backports DIR   multiqueue (QEMU 10, Linux 6.12)
#
# On a fresh machine it installs QEMU and busybox-static, fetches a Debian
# kernel .deb (tests/guest/setup.sh), builds fusebox, starts it on a
# vhost-user socket and boots QEMU (TCG) with the directory as virtiofs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$root/scripts/lib.sh"
run=demo queues=1 setup_args=()
while [ $# -gt 1 ]; do
	case $1 in
		--shell) run=shell ;;
		--queues) queues=$2; shift ;;
		--backports) setup_args+=(--backports) ;;
		*) break ;;
	esac
	shift
done
dir=${1:?usage: scripts/demo.sh [--shell] [--queues N] [--backports] DIR}
dir=$(cd "$dir" && pwd)
setup_guest "${setup_args[@]}"
build_fusebox
work=$(mktemp -d /tmp/fusebox-demo.XXXXXX)
trap 'kill $fpid 2>/dev/null || true; rm -rf "$work"' EXIT
"$root/target/release/fusebox" --socket-path "$work/vfs.sock" --shared-dir "$dir" \
	--queues "$queues" --xattr 2> "$work/fusebox.log" &
fpid=$!
wait_socket "$work/vfs.sock" || true
echo "demo: fusebox shares $dir on $work/vfs.sock; booting the guest (QEMU TCG, ~10 s)"
vhost_user_fs_vm "$work/vfs.sock" "$gdir/initramfs.gz" "fusebox.run=$run" 2 1G ",num-request-queues=$queues"
"$qemu" "${vm_args[@]}" -nographic -no-reboot
wait "$fpid" || true
fpid=
echo "demo: fusebox's counters when the guest left:"
sed -n '/frontend disconnected/,$p' "$work/fusebox.log"
