#!/bin/bash
# Prepares a test guest on a fresh machine: installs QEMU, busybox-static
# and cpio; fetches a Debian kernel .deb with `apt-get download` and
# unpacks it with `dpkg-deb -x` (never installed); builds an initramfs
# with busybox, the virtio_pci, fuse and virtiofs modules (and what they
# depend on), the guest suite and its static helper.
#
#   tests/guest/setup.sh [--backports] [OUTDIR]
#
# --backports takes QEMU and the kernel from bookworm-backports (QEMU 10,
# Linux 6.12 with multiqueue virtiofs), adding that suite to apt's sources
# the way bookworm is listed. Prints the directory holding vmlinuz,
# initramfs.gz and qemu (the QEMU binary to use) on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../../scripts/lib.sh
. "$root/scripts/lib.sh"
backports=0
if [ "${1:-}" = --backports ]; then backports=1; shift; fi
flavour=$([ $backports = 1 ] && echo backports || echo stable)
out=${1:-$root/target/guest/$flavour}
mkdir -p "$out"
log() { echo "guest-setup: $*" >&2; }

if [ $backports = 1 ]; then
	src=/etc/apt/sources.list.d/bookworm-backports.sources
	if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
		log "adding bookworm-backports to apt's sources"
		# Same mirror and keyring as the bookworm entry.
		base=$(grep -rhs -A3 '^Types: deb$' /etc/apt/sources.list.d/debian.sources | awk '/^URIs:/ {print $2; exit}')
		cat > "$src" <<EOF
Types: deb
URIs: ${base:-http://deb.debian.org/debian}
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
		apt_get update
	fi
	if ! dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null | grep -q bpo; then
		log "installing QEMU from bookworm-backports"
		apt_get install -t bookworm-backports qemu-system-x86
	fi
else
	command -v qemu-system-x86_64 >/dev/null || need="${need:-} qemu-system-x86"
fi
for p in busybox-static cpio xz-utils kmod; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need="${need:-} $p"
done
if [ -n "${need:-}" ]; then
	log "installing$need"
	apt_get update
	apt_get install $need
fi

# The kernel: the package linux-image-amd64 points at, from the chosen suite.
if [ $backports = 1 ]; then
	ver=$(apt-cache madison linux-image-amd64 | awk -F'|' '/bookworm-backports/ {gsub(/ /, "", $2); print $2; exit}')
	kpkg=$(apt-cache show "linux-image-amd64=$ver" | awk '/^Depends:/ {print $2; exit}')
else
	kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$kpkg" ] || { log "cannot find the kernel package"; exit 1; }
kdir=$out/kernel
if [ ! -e "$kdir/.done-$kpkg" ]; then
	log "fetching $kpkg"
	rm -rf "$kdir" && mkdir -p "$kdir/deb"
	(cd "$kdir/deb" && apt-get download "$kpkg" >&2)
	dpkg-deb -x "$kdir"/deb/*.deb "$kdir/root"
	touch "$kdir/.done-$kpkg"
fi
kver=$(ls "$kdir/root/lib/modules" | head -1)
cp "$kdir/root/boot/vmlinuz-$kver" "$out/vmlinuz"
mods=$kdir/root/lib/modules/$kver
# The .deb ships no modules.dep (the package's postinst makes it).
[ -e "$mods/modules.dep" ] || depmod -b "$kdir/root" "$kver"

# The initramfs.
ird=$out/initramfs
rm -rf "$ird" && mkdir -p "$ird"/{bin,dev,proc,sys,mnt,lib/modules,tmp}
cp /bin/busybox "$ird/bin/busybox"
gcc -static -O2 -Wall -o "$ird/guestcheck" "$here/guestcheck.c"
cp "$here/suite.sh" "$ird/suite.sh"
cp "$here/demo.sh" "$ird/demo.sh"
cp "$here/init" "$ird/init"
chmod +x "$ird/init" "$ird/suite.sh" "$ird/demo.sh"

# fsx (the Rust port) for the soak check, with the libraries it links.
fsx=$(cargo_bin fsx)
if [ -x "$fsx" ]; then
	cp "$fsx" "$ird/bin/fsx"
	cp "$here/../conformance/fsx.toml" "$ird/fsx.toml"
	copy_libs "$ird" "$fsx"
else
	log "no fsx (cargo install fsx): the guest suite's fsx check will fail"
fi

# Modules in load order: each after what it depends on (modules.dep),
# built-in ones skipped, compressed ones unpacked (busybox insmod).
declare -A seen
: > "$ird/modules.list"
add_module() {
	local path=$1 dep
	[ -n "${seen[$path]:-}" ] && return
	seen[$path]=1
	for dep in $(awk -F: -v m="$path" '$1 == m {print $2}' "$mods/modules.dep"); do
		add_module "$dep"
	done
	local name
	name=$(basename "$path")
	case $name in
		*.xz) xz -dc "$mods/$path" > "$ird/lib/modules/${name%.xz}"; name=${name%.xz} ;;
		*.zst) zstd -dqc "$mods/$path" > "$ird/lib/modules/${name%.zst}"; name=${name%.zst} ;;
		*) cp "$mods/$path" "$ird/lib/modules/$name" ;;
	esac
	echo "$name" >> "$ird/modules.list"
}
for m in virtio_pci fuse virtiofs; do
	path=$(awk -F: -v m="$m" '{n = $1; sub(".*/", "", n); sub("\\.ko.*", "", n); gsub("-", "_", n); if (n == m) {print $1; exit}}' "$mods/modules.dep")
	if [ -n "$path" ]; then
		add_module "$path"
	elif grep -q "/$m.ko" "$mods/modules.builtin"; then
		log "$m is built in"
	else
		log "module $m not found in $kver"; exit 1
	fi
done
(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) > "$out/initramfs.gz"
command -v qemu-system-x86_64 > "$out/qemu"
log "guest ready: kernel $kver, modules: $(tr '\n' ' ' < "$ird/modules.list")"
echo "$out"
