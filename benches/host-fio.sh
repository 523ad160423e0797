#!/usr/bin/env bash
# Host-mount benchmark, side by side in one run: fio (psync, O_DIRECT) on
#   raw tmpfs · fusebox mount (/dev/fuse) · fusebox mount --io-uring ·
#   fusebox mount --io-uring --kernel-passthrough (the kernel does the data
#   I/O of open files on the host files) ·
#   libfuse 3.14 passthrough_hp (Debian's fuse3 source, built with g++; 3.14
#   predates kernel passthrough, so it serves every read and write)
# for 4 KiB random read and write and 1 MiB sequential read and write.
# Prints a table of IOPS and MiB/s and the ratios to libfuse and to tmpfs.
# Usage (root): benches/host-fio.sh [seconds per job, default 10]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
export DEBIAN_FRONTEND=noninteractive

need=()
command -v fio >/dev/null || need+=(fio)
command -v g++ >/dev/null || need+=(g++)
command -v pkg-config >/dev/null || need+=(pkg-config)
dpkg -s libfuse3-dev >/dev/null 2>&1 || need+=(libfuse3-dev)
dpkg -s fuse3 >/dev/null 2>&1 || need+=(fuse3)
dpkg -s dpkg-dev >/dev/null 2>&1 || need+=(dpkg-dev)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# passthrough_hp is not among the examples Debian ships in libfuse3-dev:
# build it from the fuse3 3.14 source package.
hp=target/bench/passthrough_hp
if [ ! -x "$hp" ]; then
  mkdir -p target/bench/src
  src_list=/etc/apt/sources.list.d/fusebox-deb-src.sources
  if ! grep -rqs "deb-src" /etc/apt/sources.list.d/; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$src_list"
    apt-get update -qq
  fi
  (cd target/bench/src && apt-get source -qq --download-only fuse3 >/dev/null &&
     dpkg-source -x --no-check fuse3_*.dsc fuse3 >/dev/null)
  g++ -O2 -std=c++17 -o "$hp" target/bench/src/fuse3/example/passthrough_hp.cc \
    $(pkg-config fuse3 --cflags --libs) -lpthread
fi
cargo build -q --release -p fusebox

work=$(mktemp -d /tmp/fusebox-fio.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/tmpfs" "$work/mnt"
mount -t tmpfs -o size=2g fusebox-fio "$work/tmpfs"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  sleep 0.5
  umount -l "$work/mnt" 2>/dev/null || true
  umount -l "$work/tmpfs" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_mount() {
  for _ in $(seq 200); do
    grep -q " $work/mnt fuse" /proc/mounts && return 0
    sleep 0.05
  done
  echo "mount did not appear" >&2
  return 1
}

# job name -> fio arguments
declare -A jobs=(
  [randread4k]="--rw=randread --bs=4k"
  [randwrite4k]="--rw=randwrite --bs=4k"
  [seqread1m]="--rw=read --bs=1m"
  [seqwrite1m]="--rw=write --bs=1m"
)
order=(randread4k randwrite4k seqread1m seqwrite1m)

run_fio() { # dir job -> "iops bw_mib"
  local dir=$1 job=$2
  fio --name="$job" --directory="$dir" --filename=fio.dat --size=256m \
    --ioengine=psync --direct=1 ${jobs[$job]} --numjobs=1 \
    --time_based --runtime="$secs" --ramp_time=1 --group_reporting \
    --output-format=terse --terse-version=3 2>/dev/null |
    awk -F';' '{ r=$8+0; w=$49+0; rb=$7+0; wb=$48+0; printf "%d %.1f\n", r+w, (rb+wb)/1024 }'
}

declare -A res
bench_target() { # name dir
  local name=$1 dir=$2
  # Lay the file out first so reads read data.
  fio --name=prep --directory="$dir" --filename=fio.dat --size=256m --rw=write --bs=1m \
    --direct=1 --ioengine=psync >/dev/null 2>&1
  for j in "${order[@]}"; do
    res[$name,$j]=$(run_fio "$dir" "$j")
  done
  rm -f "$dir/fio.dat"
}

bench_target tmpfs "$work/tmpfs"

target/release/fusebox mount --shared-dir "$work/tmpfs" "$work/mnt" >"$work/log1" 2>&1 &
pids+=($!); wait_mount
bench_target fusebox-devfuse "$work/mnt"
kill -INT "${pids[-1]}"; wait "${pids[-1]}" || true

target/release/fusebox mount --io-uring --shared-dir "$work/tmpfs" "$work/mnt" >"$work/log2" 2>&1 &
pids+=($!); wait_mount
bench_target fusebox-iouring "$work/mnt"
kill -INT "${pids[-1]}"; wait "${pids[-1]}" || true

target/release/fusebox mount --io-uring --kernel-passthrough --shared-dir "$work/tmpfs" \
  "$work/mnt" >"$work/log4" 2>&1 &
pids+=($!); wait_mount
bench_target fusebox-iouring-kpt "$work/mnt"
kill -INT "${pids[-1]}"; wait "${pids[-1]}" || true
grep -q "kernel passthrough on" "$work/log4" || { echo "kernel passthrough was not on:" >&2; cat "$work/log4" >&2; exit 1; }

"$hp" --foreground "$work/tmpfs" "$work/mnt" >"$work/log3" 2>&1 &
pids+=($!); wait_mount
bench_target libfuse-passthrough_hp "$work/mnt"
umount "$work/mnt"; wait "${pids[-1]}" || true

printf '\nfio psync O_DIRECT, %ss per job, tmpfs backing (%s)\n' "$secs" "$(date -u +%F)"
printf '%-24s %14s %14s %14s %14s\n' target "4k randread" "4k randwrite" "1M read MiB/s" "1M write MiB/s"
for t in tmpfs fusebox-devfuse fusebox-iouring fusebox-iouring-kpt libfuse-passthrough_hp; do
  set -- ${res[$t,randread4k]} ${res[$t,randwrite4k]} ${res[$t,seqread1m]} ${res[$t,seqwrite1m]}
  printf '%-24s %14s %14s %14s %14s\n' "$t" "$1" "$3" "$6" "$8"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo
for t in fusebox-devfuse fusebox-iouring fusebox-iouring-kpt; do
  for j in randread4k randwrite4k; do
    set -- ${res[$t,$j]}; mine=$1
    set -- ${res[libfuse-passthrough_hp,$j]}; lf=$1
    set -- ${res[tmpfs,$j]}; raw=$1
    echo "$t $j: $(ratio "$mine" "$lf")x libfuse, $(ratio "$mine" "$raw")x tmpfs"
  done
done
