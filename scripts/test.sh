#!/usr/bin/env bash
# The test command: formatting, lints, unit/integration tests, loom models,
# the decoder, device, ring command and state load fuzz harnesses,
# pjdfstest and fsx through a host mount, the QEMU guest suite (one queue,
# then multiqueue), a guest reset, pjdfstest inside a guest, a libvirt
# domain whose virtiofsd is fusebox, live migration, and the docs.
# Everything runs on stable Rust; the tests that mount need root.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
source scripts/lib.sh
export CARGO_TERM_COLOR=never

step() { printf '\n== %s\n' "$*"; }

# Beyond Rust: an unprivileged user with subordinate ids (pjdfstest
# switches to it; the unprivileged daemon runs as it, in the tests and the
# guest suite) and newuidmap/newgidmap for its user namespace's ranges.
add_tests_user
grep -q '^tests:' /etc/subuid 2>/dev/null || usermod --add-subuids 100000-165535 tests
grep -q '^tests:' /etc/subgid 2>/dev/null || usermod --add-subgids 100000-165535 tests
if ! command -v newuidmap >/dev/null 2>&1; then
  apt_install uidmap
fi

step "rustfmt"
cargo fmt --all -- --check

step "clippy (warnings denied)"
cargo clippy --workspace --all-targets -- -D warnings

step "tests"
cargo test --workspace

step "loom models (fuse-core)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo clippy -p fuse-core --tests -- -D warnings
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p fuse-core --test loom --release

step "decoder fuzz harness (${FUSEBOX_FUZZ_ITERS:=5000000} inputs; the fuzz profile: optimised with overflow checks)"
FUSEBOX_FUZZ_ITERS="$FUSEBOX_FUZZ_ITERS" cargo test -p fuse-core --profile fuzz --test decode_fuzz
# The cargo-fuzz targets (run by hand with a nightly toolchain) must keep
# compiling against the ABI they drive.
CARGO_TARGET_DIR=target/fuzz-check cargo check --manifest-path fuzz/Cargo.toml --bins

step "conformance: pjdfstest through the host mount (/dev/fuse and io_uring; kernel passthrough; cache=never; file handles)"
tests/conformance/pjdfstest.sh
tests/conformance/pjdfstest.sh --io-uring
tests/conformance/pjdfstest.sh --io-uring --kernel-passthrough
tests/conformance/pjdfstest.sh --cache never
tests/conformance/pjdfstest.sh --inode-file-handles

step "integrity: fsx, every operation, 100000 ops, fixed seeds, both modes and kernel passthrough"
tests/conformance/fsx.sh 100000 1
tests/conformance/fsx.sh 100000 1 --io-uring
tests/conformance/fsx.sh 100000 1 --io-uring --kernel-passthrough
tests/conformance/fsx.sh 20000 2 --cache never

step "soak: fsx through the host mount, one run then 4 at once on distinct files (FUSEBOX_SOAK=1: 1,000,000 ops)"
tests/soak/fsx-host.sh "${FUSEBOX_SOAK_OPS:-20000}"

step "device fuzz harness: hostile descriptor chains and FUSE bytes (${FUSEBOX_DEVICE_FUZZ_ITERS:=200000} rounds)"
FUSEBOX_DEVICE_FUZZ_ITERS="$FUSEBOX_DEVICE_FUZZ_ITERS" cargo test -p virtio-fs --profile fuzz --test device_fuzz -- --nocapture

step "ring command fuzz: hostile FUSE-over-io_uring command areas (${FUSEBOX_RING_FUZZ_ITERS:=20000} commands)"
FUSEBOX_RING_FUZZ_ITERS="$FUSEBOX_RING_FUZZ_ITERS" cargo test -p fuse-core --profile fuzz --test dev_uring_cmd_fuzz -- --nocapture

step "state load fuzz: hostile migration states taken up by the passthrough on a tmpfs share, no panic, memory bounded by the stream (${FUSEBOX_STATE_FUZZ_ITERS:=500000} states)"
FUSEBOX_STATE_FUZZ_ITERS="$FUSEBOX_STATE_FUZZ_ITERS" cargo test -p passthrough --profile fuzz --test state_fuzz -- --nocapture

step "guest: QEMU TCG guest suite over vhost-user-fs (Debian bookworm kernel, 1 request queue; default --sandbox namespace --seccomp kill)"
tests/guest/run.sh

step "guest: a reset ends the FUSE session (QMP system_reset of a guest holding 50 files, a POSIX lock and a flock: the rebooted guest takes both locks again, fusebox's fds back to the first boot's count)"
tests/guest/reboot.sh

step "guest: POSIX conformance inside the guest (the Rust pjdfstest on its virtiofs mount, every group it runs on Linux: no failure virtiofsd 1.14 does not have; chown, lchown and chmod g+s through supplementary groups, seen on the host)"
tests/guest/pjdfstest.sh

step "libvirt: Debian's libvirt daemon starts fusebox as a TCG domain's virtiofsd (memfd memory; xattr, cache, sandbox, locks, thread pool; the guest's locks held on the host; virsh destroy ends fusebox)"
tests/libvirt/run.sh

step "guest: fusebox started by an unprivileged user (--sandbox namespace in a user namespace where only that user is mapped; 1,000 fsx ops)"
tests/guest/run.sh --as-user tests --fsx-ops 1000
step "guest: fusebox started by an unprivileged user with --sandbox none (every request runs as that user; 400 fsx ops)"
tests/guest/run.sh --as-user tests --fsx-ops 400 --fusebox-args "--sandbox none"

step "guest: multiqueue (bookworm-backports QEMU 10 and Linux 6.12, 4 request queues, 2 CPUs; --sandbox chroot --seccomp none, POSIX ACLs, guest RAM as fixed buffers)"
tests/guest/run.sh --backports --queues 4 --smp 2 --min-queues-used 2 --fusebox-args "--sandbox chroot --seccomp none --posix-acl --fixed-guest-memory"

step "guest: DAX (QEMU 11.1.3's generic vhost-user device with vhost-user shared memory, Linux 6.12 mounted -o dax=inode, --cache-size 64M; the suite with a file read and written through the window, a mapping shared by two guest processes, the guest's msync leaving no dirty host page, and a host write seen through a guest mapping)"
tests/guest/run.sh --dax --fsx-ops 1000

step "guest: security labels and xattr mapping from a guest running SELinux (FUSE_SECURITY_CTX; --xattrmap under user.virtiofs. and trusted.virtiofs.; Linux 6.1, label after the arguments, and 6.12, a request extension)"
for k in "" --backports; do
	for m in user trusted; do
		tests/guest/labels.sh $k --map $m
	done
done

step "live migration: QEMU 10 moves a running guest between two fusebox daemons on one directory (find-paths, then file-handles): open fds, O_APPEND, a directory handle, the cwd, a POSIX lock held on the host"
tests/migration/run.sh --daemon fusebox
tests/migration/run.sh --daemon fusebox --migration-mode file-handles
step "live migration that cannot carry everything: a file unlinked while open (carried by file handle; EIO on it alone with --migration-on-error guest-error; with abort the migration fails and the source VM runs on), a destination lacking a file (abort; guest-error), a corrupted device state (refused by the destination, the source runs on)"
tests/migration/run.sh --daemon fusebox --migration-mode file-handles --scenario unlinked
tests/migration/run.sh --daemon fusebox --scenario unlinked --daemon-args "--migration-on-error guest-error"
tests/migration/run.sh --daemon fusebox --scenario unlinked
tests/migration/run.sh --daemon fusebox --scenario missing
tests/migration/run.sh --daemon fusebox --scenario missing --daemon-args "--migration-on-error guest-error"
tests/migration/run.sh --daemon fusebox --scenario corrupt

step "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

step "embedded demo and the embedded-client example"
cargo run -q -p fuse-core --example demo
cargo run -q -p fuse-core --example embedded
