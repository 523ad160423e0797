#!/usr/bin/env bash
# A QEMU with vhost-user shared memory (11.1.3, the first releases with
# it, for the DAX window: docs/DAX.md), made once in DIR (default
# /var/cache/fusebox-qemu) without touching the system's packages or apt
# sources: Debian trixie-backports' qemu-system-x86 and its whole
# dependency closure are downloaded through a private apt configuration,
# unpacked into DIR/sysroot, and run by the wrapper DIR/qemu-system-x86_64
# through the sysroot's own loader, libraries, modules and firmware.
# Prints the wrapper's path.
#
#   scripts/qemu-shmem.sh [DIR]
set -euo pipefail
dir=${1:-/var/cache/fusebox-qemu}
version='1:11.1.3+ds-2~bpo13+1'
wrapper=$dir/qemu-system-x86_64
if [ -x "$wrapper" ] && "$wrapper" --version 2>/dev/null | grep -q '11\.1\.3'; then
	echo "$wrapper"
	exit 0
fi
apt=$dir/apt
mkdir -p "$apt/etc/sources.list.d" "$apt/etc/apt.conf.d" "$apt/etc/preferences.d" \
	"$apt/state/lists/partial" "$apt/cache/archives/partial" "$dir/sysroot"
: >"$apt/state/status" # empty: apt fetches the whole closure, libc included
key=/usr/share/keyrings/debian-archive-keyring.gpg
for suite in trixie trixie-updates trixie-backports; do
	echo "deb [signed-by=$key] http://deb.debian.org/debian $suite main"
done >"$apt/etc/sources.list"
cat >"$apt/apt.conf" <<EOF
Dir::State "$apt/state";
Dir::State::status "$apt/state/status";
Dir::Cache "$apt/cache";
Dir::Etc::SourceList "$apt/etc/sources.list";
Dir::Etc::SourceParts "$apt/etc/sources.list.d";
Dir::Etc::Parts "$apt/etc/apt.conf.d";
Dir::Etc::Preferences "$apt/etc/preferences";
Dir::Etc::PreferencesParts "$apt/etc/preferences.d";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
EOF
export APT_CONFIG=$apt/apt.conf
apt-get -q update >&2
# -t trixie-backports: qemu-system-x86 there needs its seabios.
apt-get -q -y -o Debug::NoLocking=1 -t trixie-backports install --download-only \
	--no-install-recommends "qemu-system-x86=$version" "qemu-system-common=$version" \
	"qemu-system-data=$version" >&2
for deb in "$apt"/cache/archives/*.deb; do
	dpkg-deb -x "$deb" "$dir/sysroot"
done
cat >"$wrapper" <<EOF
#!/bin/sh
# QEMU $version from its own sysroot (scripts/qemu-shmem.sh).
S=$dir/sysroot
L=\$S/usr/lib/x86_64-linux-gnu
export QEMU_MODULE_DIR=\$L/qemu
exec "\$L/ld-linux-x86-64.so.2" --library-path "\$L:\$S/usr/lib" --argv0 qemu-system-x86_64 \\
	"\$S/usr/bin/qemu-system-x86_64" -L "\$S/usr/share/qemu" -L "\$S/usr/share/seabios" "\$@"
EOF
chmod +x "$wrapper"
"$wrapper" --version | grep -q '11\.1\.3'
echo "$wrapper"
