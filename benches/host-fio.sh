#!/usr/bin/env bash
# Host-mount benchmark, side by side in one run: fio (psync, O_DIRECT) on
#   raw tmpfs · fusebox mount (/dev/fuse) · fusebox mount --io-uring ·
#   fusebox mount --io-uring --kernel-passthrough (the kernel does the data
#   I/O of open files on the host files itself) ·
#   libfuse 3.14 passthrough_hp (Debian's fuse3 source, built with g++; 3.14
#   predates kernel passthrough, so it serves every read and write)
# for 4 KiB random read and write and 1 MiB sequential read and write.
# Prints a table of IOPS and MiB/s and the ratios to libfuse and to tmpfs.
#
# Then the depth rows (issue 16): fio ioengine=io_uring direct=1, iodepth=16
# with one job, and numjobs=4 with iodepth=1 (many synchronous callers), 4 KiB
# random read and write and 1 MiB sequential read and write, on a tmpfs share
# and on an ext4 share on this machine's disk (page cache warm:
# --invalidate=0 after a warming pass), plus a cold 4 GiB file read at
# iodepth=16 on the ext4 share (the host file's page cache dropped before
# every job); contenders: raw fio on the backing directory, fusebox mount
# --io-uring, and libfuse master's passthrough_hp over io_uring with
# --nopassthrough (built from source). Every contender runs in each round,
# one after the other; ratios are taken within a round and the median of
# the rounds is printed.
#
# Usage (root): benches/host-fio.sh [seconds per job, default 10]
# Environment:
#   FIO_PARTS="psync depth" which parts to run (default both)
#   FIO_ROUNDS=3            rounds of the depth rows
#   FIO_ROWS=REGEX          only depth rows whose name matches (e.g.
#                           '^(qd16-randread4k)$'; unanchored, qd16-randread4k
#                           also matches the cold row);
#                           by default all but qd1-seqread1m and qd64-seqread1m
#                           (the 1 MiB read at other depths) and
#                           warm-qd16-randread4k (buffered reads of the warm
#                           file: the host's page cache)
#   FIO_SHARES="tmpfs ext4" which shares the depth rows use
#   FIO_EXT4_DIR=/var/tmp   an ext4 directory for the ext4 share (its own
#                           filesystem is checked)
#   FIO_COLD_SIZE=4g        the cold row's file size
#   FIO_CONTENDERS="raw fusebox-iouring libfuse-master-iouring"
#                           (also: fusebox-devfuse, libfuse-master-devfuse:
#                           the same daemons over /dev/fuse;
#                           fusebox-iouring-nocache, the mount with --cache
#                           never, for the warm- row)
#   FUSEBOX_RING_DEPTH=16   fusebox mount --in-flight
#   FUSEBOX_BIN=PATH        the fusebox binary the depth rows mount with
#                           (default target/release/fusebox)
#   FUSEBOX_BIN_B=PATH      a second build (or a wrapper that execs one with
#                           more options) for side-by-side runs: contenders
#                           fusebox-b-iouring and fusebox-b-devfuse, with
#                           their ratios to fusebox-iouring and
#                           fusebox-devfuse and to raw (contenders run in
#                           the order given, every round)
#   LIBFUSE_GIT=URL|DIR     where libfuse master comes from (default
#                           https://github.com/libfuse/libfuse; a local
#                           clone or mirror on a machine without GitHub)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=../scripts/lib.sh
source scripts/lib.sh
secs=${1:-10}
parts=${FIO_PARTS:-psync depth}
export DEBIAN_FRONTEND=noninteractive

need=()
command -v fio >/dev/null || need+=(fio)
command -v g++ >/dev/null || need+=(g++)
command -v pkg-config >/dev/null || need+=(pkg-config)
dpkg -s libfuse3-dev >/dev/null 2>&1 || need+=(libfuse3-dev)
dpkg -s fuse3 >/dev/null 2>&1 || need+=(fuse3)
dpkg -s dpkg-dev >/dev/null 2>&1 || need+=(dpkg-dev)
if [ ${#need[@]} -gt 0 ]; then
  apt_install "${need[@]}" >/dev/null
fi

# passthrough_hp is not among the examples Debian ships in libfuse3-dev:
# build it from the fuse3 3.14 source package.
hp=target/bench/passthrough_hp
if [[ " $parts " == *" psync "* ]] && [ ! -x "$hp" ]; then
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
build_fusebox

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
  wait_until 200 0.05 grep -q " $work/mnt fuse" /proc/mounts && return 0
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

if [[ " $parts " == *" psync "* ]]; then
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
fi

[[ " $parts " == *" depth "* ]] || exit 0

# ---- depth rows --------------------------------------------------------
rounds=${FIO_ROUNDS:-3}
rows_re=${FIO_ROWS:-'^(qd16-.*|nj4-.*|qd1-randread4k|cold-qd16-randread4k)$'}
shares=${FIO_SHARES:-tmpfs ext4}
cold_size=${FIO_COLD_SIZE:-4g}
contenders=${FIO_CONTENDERS:-raw fusebox-iouring libfuse-master-iouring}
if [[ " $contenders " == *" fusebox-b-"* ]]; then
  : "${FUSEBOX_BIN_B:?FUSEBOX_BIN_B names the build contenders fusebox-b-iouring and fusebox-b-devfuse mount with}"
fi
ring_depth=${FUSEBOX_RING_DEPTH:-16}

# libfuse master's passthrough_hp, FUSE-over-io_uring capable (3.18+).
hpm=target/bench/libfuse-master/build/example/passthrough_hp
if [[ " $contenders " == *" libfuse-master-"* ]] && [ ! -x "$hpm" ]; then
  need=()
  for p in git meson ninja-build liburing-dev libnuma-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    apt_install "${need[@]}" >/dev/null
  fi
  rm -rf target/bench/libfuse-master
  git clone -q --depth 1 "${LIBFUSE_GIT:-https://github.com/libfuse/libfuse}" target/bench/libfuse-master
  (cd target/bench/libfuse-master && meson setup build -Dexamples=true -Denable-io-uring=true >/dev/null &&
     ninja -C build >/dev/null)
fi

ext4_base=${FIO_EXT4_DIR:-/var/tmp}
if [[ " $shares " == *" ext4 "* ]]; then
  fstype=$(findmnt -no FSTYPE -T "$ext4_base")
  [ "$fstype" = ext4 ] || { echo "FIO_EXT4_DIR=$ext4_base is on $fstype, not ext4" >&2; exit 1; }
  ext4_dir=$(mktemp -d "$ext4_base/fusebox-fio-ext4.XXXXXX")
  chmod 755 "$ext4_dir"
  trap 'cleanup; rm -rf "$ext4_dir"' EXIT
fi
share_dir() { case $1 in tmpfs) echo "$work/tmpfs" ;; ext4) echo "$ext4_dir" ;; esac; }

# row name -> fio arguments (all: io_uring, O_DIRECT, 256 MiB file)
declare -A drows=(
  [qd16-randread4k]="--iodepth=16 --numjobs=1 --rw=randread --bs=4k"
  [qd16-randwrite4k]="--iodepth=16 --numjobs=1 --rw=randwrite --bs=4k"
  [qd16-seqread1m]="--iodepth=16 --numjobs=1 --rw=read --bs=1m"
  [qd16-seqwrite1m]="--iodepth=16 --numjobs=1 --rw=write --bs=1m"
  [nj4-randread4k]="--iodepth=1 --numjobs=4 --rw=randread --bs=4k"
  [nj4-randwrite4k]="--iodepth=1 --numjobs=4 --rw=randwrite --bs=4k"
  [nj4-seqread1m]="--iodepth=1 --numjobs=4 --rw=read --bs=1m"
  [nj4-seqwrite1m]="--iodepth=1 --numjobs=4 --rw=write --bs=1m"
  [qd1-randread4k]="--iodepth=1 --numjobs=1 --rw=randread --bs=4k"
  # Not in the default set: the 1 MiB read at other depths, to see
  # whether the disk's bandwidth, not the depth, bounds that row.
  [qd1-seqread1m]="--iodepth=1 --numjobs=1 --rw=read --bs=1m"
  [qd64-seqread1m]="--iodepth=64 --numjobs=1 --rw=read --bs=1m"
  # Not in the default set: buffered 4 KiB reads of the warm file (the
  # host's page cache, not the disk). Run it against raw and
  # fusebox-iouring-nocache, whose every read reaches the daemon; a
  # caching mount would answer from its own page cache.
  [warm-qd16-randread4k]="--iodepth=16 --numjobs=1 --rw=randread --bs=4k --direct=0"
)
drow_order=(qd16-randread4k qd16-randwrite4k qd16-seqread1m qd16-seqwrite1m
  nj4-randread4k nj4-randwrite4k nj4-seqread1m nj4-seqwrite1m qd1-randread4k
  qd1-seqread1m qd64-seqread1m warm-qd16-randread4k)

fio_depth() { # dir file size extra-args... -> "iops bw_mib"
  local dir=$1 file=$2 size=$3; shift 3
  fio --name=depth --directory="$dir" --filename="$file" --size="$size" \
    --ioengine=io_uring --direct=1 "$@" \
    --time_based --runtime="$secs" --ramp_time=1 --group_reporting \
    --output-format=terse --terse-version=3 2>/dev/null |
    awk -F';' '{ r=$8+0; w=$49+0; rb=$7+0; wb=$48+0; printf "%d %.1f\n", r+w, (rb+wb)/1024 }'
}

# Drops the page cache of one host file (cold rows).
drop_file_cache() { dd if=/dev/null of="$1" oflag=nocache conv=notrunc,fdatasync count=0 status=none; }

fusebox_bin=${FUSEBOX_BIN:-target/release/fusebox}

mount_contender() { # contender share-dir; sets cdir, the dir to run fio in
  local c=$1 dir=$2
  case $c in
    raw) cdir=$dir; return ;;
    fusebox-iouring)
      "$fusebox_bin" mount --io-uring --in-flight "$ring_depth" \
        --shared-dir "$dir" "$work/mnt" >>"$work/log-depth-fusebox" 2>&1 & ;;
    fusebox-iouring-nocache)
      "$fusebox_bin" mount --io-uring --cache never --in-flight "$ring_depth" \
        --shared-dir "$dir" "$work/mnt" >>"$work/log-depth-fusebox" 2>&1 & ;;
    fusebox-b-iouring)
      "$FUSEBOX_BIN_B" mount --io-uring \
        --ring-depth "$ring_depth" --shared-dir "$dir" "$work/mnt" >>"$work/log-depth-fusebox-b" 2>&1 & ;;
    fusebox-devfuse)
      "$fusebox_bin" mount --in-flight "$ring_depth" \
        --shared-dir "$dir" "$work/mnt" >>"$work/log-depth-fusebox" 2>&1 & ;;
    fusebox-b-devfuse)
      "$FUSEBOX_BIN_B" mount --ring-depth "$ring_depth" \
        --shared-dir "$dir" "$work/mnt" >>"$work/log-depth-fusebox-b" 2>&1 & ;;
    libfuse-master-iouring)
      "$hpm" --foreground --nopassthrough -o io_uring -o "io_uring_q_depth=$ring_depth" \
        "$dir" "$work/mnt" >>"$work/log-depth-libfuse" 2>&1 & ;;
    libfuse-master-devfuse)
      "$hpm" --foreground --nopassthrough "$dir" "$work/mnt" >>"$work/log-depth-libfuse" 2>&1 & ;;
    *) echo "unknown contender: $c" >&2; exit 2 ;;
  esac
  pids+=($!)
  wait_mount
  cdir=$work/mnt
}
unmount_contender() {
  [ "$1" = raw ] && return
  umount "$work/mnt" 2>/dev/null || umount -l "$work/mnt"
  wait "${pids[-1]}" || true
}

declare -A dres # round,share,contender,row -> "iops mib"
for round in $(seq "$rounds"); do
  for share in $shares; do
    sdir=$(share_dir "$share")
    # The 256 MiB warm file, and on ext4 the cold one, laid out once.
    [ -f "$sdir/warm.dat" ] || fio --name=prep --directory="$sdir" --filename=warm.dat \
      --size=256m --rw=write --bs=1m --direct=1 --ioengine=psync >/dev/null 2>&1
    if [ "$share" = ext4 ] && [ ! -f "$sdir/cold.dat" ] && [[ cold-qd16-randread4k =~ $rows_re ]]; then
      fio --name=prep --directory="$sdir" --filename=cold.dat --size="$cold_size" \
        --rw=write --bs=1m --direct=1 --ioengine=psync >/dev/null 2>&1
    fi
    for c in $contenders; do
      mount_contender "$c" "$sdir"; dir=$cdir
      # Warm the host page cache (and the mount's) once per mount.
      cat "$dir/warm.dat" >/dev/null
      for row in "${drow_order[@]}"; do
        [[ $row =~ $rows_re ]] || continue
        dres[$round,$share,$c,$row]=$(fio_depth "$dir" warm.dat 256m --invalidate=0 ${drows[$row]})
      done
      if [ "$share" = ext4 ] && [[ cold-qd16-randread4k =~ $rows_re ]]; then
        drop_file_cache "$sdir/cold.dat"
        dres[$round,$share,$c,cold-qd16-randread4k]=$(fio_depth "$dir" cold.dat "$cold_size" \
          --iodepth=16 --numjobs=1 --rw=randread --bs=4k)
      fi
      # Each round's figures, for the spread behind the medians.
      for row in "${drow_order[@]}" cold-qd16-randread4k; do
        if [ -n "${dres[$round,$share,$c,$row]:-}" ]; then
          echo "round $round $share $c $row: ${dres[$round,$share,$c,$row]}" >&2
        fi
      done
      unmount_contender "$c"
    done
  done
done

dratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f\n", a / b }'; }

printf '\nfio io_uring O_DIRECT (warm- rows buffered), %ss per job, medians of %s rounds (%s)\n' "$secs" "$rounds" "$(date -u +%F)"
printf '%-6s %-22s' share row
for c in $contenders; do printf ' %22s' "$c"; done
# fusebox over each transport against libfuse over the same one, and raw.
pairs=()
for f in iouring devfuse; do
  for o in "libfuse-master-$f" raw; do
    [[ " $contenders " == *" fusebox-$f "* && " $contenders " == *" $o "* ]] && pairs+=("fusebox-$f:$o")
  done
done
[[ " $contenders " == *" fusebox-b-iouring "* && " $contenders " == *" fusebox-iouring "* ]] &&
  pairs+=("fusebox-b-iouring:fusebox-iouring")
[[ " $contenders " == *" fusebox-b-iouring "* && " $contenders " == *" raw "* ]] &&
  pairs+=("fusebox-b-iouring:raw")
[[ " $contenders " == *" fusebox-b-devfuse "* && " $contenders " == *" fusebox-devfuse "* ]] &&
  pairs+=("fusebox-b-devfuse:fusebox-devfuse")
[[ " $contenders " == *" fusebox-b-devfuse "* && " $contenders " == *" raw "* ]] &&
  pairs+=("fusebox-b-devfuse:raw")
for p in "${pairs[@]}"; do printf ' %s' "${p/:/\/}"; done
echo
for share in $shares; do
  for row in "${drow_order[@]}" cold-qd16-randread4k; do
    [[ $row =~ $rows_re ]] || continue
    [ "$row" = cold-qd16-randread4k ] && [ "$share" != ext4 ] && continue
    printf '%-6s %-22s' "$share" "$row"
    for c in $contenders; do
      # IOPS for 4k rows, MiB/s for 1m rows.
      col=1; [[ $row == *1m ]] && col=2
      m=$(for r in $(seq "$rounds"); do set -- ${dres[$r,$share,$c,$row]:-0 0}; echo "${!col}"; done | median)
      printf ' %22s' "$m"
    done
    for p in "${pairs[@]}"; do
      f=${p%%:*} other=${p#*:}
      col=1; [[ $row == *1m ]] && col=2
      m=$(for r in $(seq "$rounds"); do
            set -- ${dres[$r,$share,$f,$row]:-0 0}; a=${!col}
            set -- ${dres[$r,$share,$other,$row]:-0 0}; b=${!col}
            dratio "$a" "$b"
          done | median)
      printf ' %*s' "$(( ${#p} ))" "$m"
    done
    echo
  done
done
