#!/usr/bin/env bash
# fusebox vs virtiofsd as vhost-user-fs backends, side by side, with no VM.
#
# What it measures: ops/s, p50 latency and daemon CPU per op of three
# backends serving the same shared directory --
#   fusebox         fusebox --cache never --sandbox none --seccomp none
#   virtiofsd       virtiofsd, same options (default: no thread pool)
#   virtiofsd-tp16  the same with --thread-pool-size 16
# -- and, on the read rows, fio on the same host file as the physical limit
# (io_uring, 4 KiB random reads or 1 MiB sequential reads at the row's
# depth; buffered with --invalidate=0 on the warm rows, --direct=1 on the
# cold ones).
#
# How: target/release/fusebox-load plays the guest kernel: it connects to
# the daemon's vhost-user socket and drives request queue 1 (memfd guest
# memory, split virtqueue). A daemon is started per run (both exit when the
# client disconnects). Two share sets:
#   ext4   a directory on this machine's disk (EXT4_DIR, default
#          /var/tmp/fusebox-bench/share; kept between runs, with its 4 GiB
#          file for the cold rows, made once from /dev/urandom)
#   tmpfs  a 2 GiB tmpfs mounted for the run (unmounted on exit)
# Rows (tmpfs has no cold rows):
#   randread-1               4 KiB random reads, depth 1, 256 MiB file, warm
#   randread-16              the same at depth 16
#   randread-16-cold         depth 16 on the 4 GiB file, its page cache
#                            dropped first (fusebox-load --cold)
#   randread-16-cold-direct  the same, the guest opening it O_DIRECT
#   randwrite-16             4 KiB random writes, depth 16
#   syncwrite-16             a 4 KiB write then FSYNC of the file (one op),
#                            16 writers each on its own file (fio --fsync=1
#                            numjobs=16 in a guest)
#   seqread-4 / seqwrite-4   1 MiB sequential reads / writes, depth 4
#   getattr-16               GETATTR of the data file, depth 16
#   meta-4                   create+close+stat+unlink (one op), depth 4; the
#                            unlinked file is then forgotten (a FORGET on
#                            the hiprio queue), as a guest kernel does
# Each round runs every contender once per row, interleaved, the order
# rotating from round to round. Ratios (fusebox/virtiofsd, fusebox/tp16,
# fusebox/fio) are taken within a round; the tables show the median over
# rounds of each ratio and of ops/s, p50 and daemon CPU/op. Only ratios
# measured side by side mean anything on a noisy machine.
#
# The depth picture (SWEEP=1): instead of the rows above, 4 KiB random
# reads on the ext4 share at each depth of DEPTHS (default 1 4 16 64), warm
# (the 256 MiB file) and cold (the 4 GiB file, as randread-16-cold), the
# same four contenders in the same rotating rounds. It then writes the
# medians per contender, mode and depth (ops/s, p50, daemon CPU/op) to
# OUT/vhost-depth.tsv and docs/vhost-depth.tsv, and draws
# docs/vhost-depth.svg from them with benches/plot-depth.gp (gnuplot),
# which redraws it alone from the TSV:
#   gnuplot -e "data='docs/vhost-depth.tsv'; out='docs/vhost-depth.svg'" benches/plot-depth.gp
# fusebox-load keeps 4 descriptors per request, raising the queue size to
# 4 x depth (a power of two, at most 1024): depth 64 runs on 256-entry
# queues; depths above 256 do not run.
#
# SANDBOX=default runs fusebox and both virtiofsd with their default
# sandboxes and seccomp filters instead of --sandbox none --seccomp none.
# Each then serves from a child process, so the daemon CPU column may
# count only the process fusebox-load sees at the socket: compare ops/s.
#
# Note: virtiofsd drops the guest's O_DIRECT unless given
# --allow-direct-io (fusebox honours it), so on randread-16-cold-direct
# virtiofsd reads through the host page cache. VIRTIOFSD_ARGS adds options
# to both virtiofsd contenders.
#
# Needs: root (tmpfs mount), python3, fio (apt-get install fio), gnuplot for
# SWEEP=1 (apt-get install gnuplot-nox), and
# virtiofsd (apt-get install libcap-ng-dev libseccomp-dev &&
# cargo install virtiofsd). Builds fusebox with cargo unless BUILD=0.
#
# Usage: benches/vhost-load.sh [SECONDS] [ROUNDS] [ext4|tmpfs|all]
#   SECONDS per run (default 5), ROUNDS (default 3), share sets (default all)
# Environment:
#   ROWS="randread-1,meta-4"  run only these rows (comma or space separated)
#   OUT=DIR           where results.md and runs.log go
#                     (default target/bench/vhost-load-DATE)
#   EXT4_DIR=DIR      the ext4 share directory
#   VIRTIOFSD=PATH    the virtiofsd binary; VIRTIOFSD_ARGS="..." extra options
#   SWEEP=1           the depth picture instead of the rows (see the
#                     script's header): ext4 only, not with ROWS; writes
#                     OUT/vhost-depth.tsv, docs/vhost-depth.tsv and .svg
#   DEPTHS="1 4 16"   the depths of SWEEP=1 (default 1 4 16 64)
#   BUILD=0           use the fusebox binaries already in target/release
set -euo pipefail

usage() { sed -n '/^# Usage:/,/^# *BUILD=0/s/^# \{0,1\}//p' "$0"; }

case ${1:-} in -h | --help) usage; exit 0 ;; esac
secs=${1:-5}
rounds=${2:-3}
which_sets=${3:-all}
[[ $secs =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ ]] || { usage >&2; exit 2; }
case $which_sets in
	ext4 | tmpfs) sets=("$which_sets") ;;
	all) sets=(ext4 tmpfs) ;;
	*) usage >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$root/scripts/lib.sh"
ext4_dir=${EXT4_DIR:-/var/tmp/fusebox-bench/share}
out=${OUT:-$root/target/bench/vhost-load-$(date +%Y%m%d-%H%M%S)}
vfsd=${VIRTIOFSD:-$(cargo_bin virtiofsd)}
read -r -a vfsd_extra <<<"${VIRTIOFSD_ARGS:-}"
data_file=fusebox-bench.dat
data_mib=256
cold_file=fusebox-bench-4g.dat
cold_mib=4096

# Row: workload depth file(data|cold) mode(warm|cold|cold-direct|-) fio(randread|read|-)
all_rows=(randread-1 randread-16 randread-16-cold randread-16-cold-direct
	randwrite-16 syncwrite-16 seqread-4 seqwrite-4 getattr-16 meta-4)
declare -A spec=(
	[randread-1]="randread 1 data warm randread"
	[randread-16]="randread 16 data warm randread"
	[randread-16-cold]="randread 16 cold cold randread"
	[randread-16-cold-direct]="randread 16 cold cold-direct randread"
	[randwrite-16]="randwrite 16 data - -"
	[syncwrite-16]="syncwrite 16 data - -"
	[seqread-4]="seqread 4 data warm read"
	[seqwrite-4]="seqwrite 4 data - -"
	[getattr-16]="getattr 16 data - -"
	[meta-4]="meta 4 data - -"
)
sweep=${SWEEP:-0}
depths=()
if [ "$sweep" = 1 ]; then
	[ -z "${ROWS:-}" ] || { echo "SWEEP=1 runs its own rows: unset ROWS" >&2; exit 2; }
	[ "$which_sets" != tmpfs ] || { echo "SWEEP=1 runs on the ext4 share only" >&2; exit 2; }
	sets=(ext4)
	read -r -a depths <<<"${DEPTHS:-1 4 16 64}"
	[ ${#depths[@]} -gt 0 ] || { echo "DEPTHS is empty" >&2; exit 2; }
	all_rows=()
	for d in "${depths[@]}"; do
		if ! [[ $d =~ ^[1-9][0-9]*$ ]] || ((d > 256)); then
			echo "depth '$d' is not in 1..256" >&2
			exit 2
		fi
		spec[randread-$d]="randread $d data warm randread"
		spec[randread-$d-cold]="randread $d cold cold randread"
		all_rows+=("randread-$d" "randread-$d-cold")
	done
elif [ "$sweep" != 0 ]; then
	echo "SWEEP is 0 or 1" >&2
	exit 2
fi
rows=()
if [ -n "${ROWS:-}" ]; then
	read -r -a rows <<<"${ROWS//,/ }"
	for r in "${rows[@]}"; do
		[ -n "${spec[$r]+x}" ] || { echo "unknown row '$r' (rows: ${all_rows[*]})" >&2; exit 2; }
	done
else
	rows=("${all_rows[@]}")
fi

# The rows of a share set, in table order.
set_rows() {
	local r
	for r in "${all_rows[@]}"; do
		[[ " ${rows[*]} " == *" $r "* ]] || continue
		[[ $1 == tmpfs && $r == *cold* ]] && continue
		echo "$r"
	done
}

[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
[ -x "$vfsd" ] || { echo "virtiofsd not found (cargo install virtiofsd)" >&2; exit 1; }
command -v fio >/dev/null || { echo "fio not found (apt-get install fio)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 not found" >&2; exit 1; }
if [ "$sweep" = 1 ]; then
	command -v gnuplot >/dev/null || { echo "gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
fi
if [ "${BUILD:-1}" != 0 ]; then
	build_fusebox
fi
fb=$root/target/release/fusebox
load=$root/target/release/fusebox-load
[[ -x $fb && -x $load ]] || { echo "no fusebox binaries in target/release" >&2; exit 1; }

mkdir -p "$out"
log=$out/runs.log
results=$out/results.md
work=$(mktemp -d /tmp/fusebox-vhost-load.XXXXXX)
tmpfs_dir=$work/tmpfs
dpid=
cleanup() {
	if [ -n "$dpid" ] && kill -0 "$dpid" 2>/dev/null; then
		kill "$dpid" 2>/dev/null || true
		wait "$dpid" 2>/dev/null || true
	fi
	if mountpoint -q "$tmpfs_dir" 2>/dev/null; then umount "$tmpfs_dir" || umount -l "$tmpfs_dir"; fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

declare -A share_of=([ext4]=$ext4_dir [tmpfs]=$tmpfs_dir)
for s in "${sets[@]}"; do
	mkdir -p "${share_of[$s]}"
	if [ "$s" = tmpfs ]; then mount -t tmpfs -o size=2g fusebox-bench "$tmpfs_dir"; fi
done

for s in "${sets[@]}"; do
	mapfile -t rs < <(set_rows "$s")
	[ ${#rs[@]} -gt 0 ] || continue
	ensure_file "${share_of[$s]}/$data_file" "$data_mib"
	if [[ " ${rs[*]} " == *cold* ]]; then ensure_file "${share_of[$s]}/$cold_file" "$cold_mib"; fi
done

{
	echo "# vhost-load.sh $secs s x $rounds rounds, $(date -Is), $(uname -r), $(nproc) CPUs"
	echo "# fusebox $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo ?)$(git -C "$root" diff --quiet 2>/dev/null || echo +dirty); $("$vfsd" --version 2>/dev/null | head -1); $(fio --version)"
	echo "# set row round contender ops_per_s mb_per_s p50_us p99_us daemon_cpu_us_per_op load_cpu_us_per_op"
} >"$log"

# The daemons' sandboxes: none, or (SANDBOX=default) each daemon's own
# default (fusebox: namespace + seccomp kill; virtiofsd: namespace +
# seccomp kill).
sandbox=(--sandbox none --seccomp none)
[ "${SANDBOX:-none}" = default ] && sandbox=()

# start_contender NAME SHARE SOCK: start it in the background, as $dpid.
start_contender() {
	local name=$1 share=$2 sock=$3
	rm -f "$sock"
	case $name in
		fusebox) "$fb" --socket-path "$sock" --shared-dir "$share" --cache never \
			"${sandbox[@]}" --log-level error 2>>"$work/$name.err" & ;;
		virtiofsd) "$vfsd" --socket-path "$sock" --shared-dir "$share" --cache never \
			"${sandbox[@]}" --log-level error "${vfsd_extra[@]}" 2>>"$work/$name.err" & ;;
		virtiofsd-tp16) "$vfsd" --socket-path "$sock" --shared-dir "$share" --cache never \
			"${sandbox[@]}" --log-level error --thread-pool-size 16 \
			"${vfsd_extra[@]}" 2>>"$work/$name.err" & ;;
	esac
	dpid=$!
	wait_socket "$sock" 200 0.025 "$dpid" && return 0
	echo "$name did not listen:" >&2
	tail -n 5 "$work/$name.err" >&2 || true
	return 1
}

# stop_contender: wait for $dpid to exit on its own (client gone), else kill it.
stop_contender() {
	[ -n "$dpid" ] || return 0
	wait_until 100 0.05 gone "$dpid" || true
	kill "$dpid" 2>/dev/null || true
	wait "$dpid" 2>/dev/null || true
	dpid=
}

# run_one SET ROW CONTENDER: one run, in this shell (so the EXIT trap sees
# $dpid); sets res="ops mb p50 p99 dcpu lcpu", or fails.
run_one() {
	local set=$1 row=$2 who=$3 wl depth file mode fiorw share path mib
	read -r wl depth file mode fiorw <<<"${spec[$row]}"
	share=${share_of[$set]}
	if [ "$file" = cold ]; then file=$cold_file mib=$cold_mib; else file=$data_file mib=$data_mib; fi
	path=$share/$file
	# Warm rows: make sure the file is in the page cache for everyone.
	[ "$mode" = warm ] && cat "$path" >/dev/null
	if [ "$who" = fio ]; then
		local args=(--name=limit --filename="$path" --ioengine=io_uring --iodepth="$depth"
			--runtime="$secs" --time_based --output-format=json)
		if [ "$fiorw" = read ]; then args+=(--rw=read --bs=1m); else args+=(--rw=randread --bs=4k); fi
		if [ "$mode" = warm ]; then args+=(--direct=0 --invalidate=0); else args+=(--direct=1); fi
		res=$(fio "${args[@]}" 2>>"$work/fio.err" | python3 -c '
import json, sys
s = sys.stdin.read()
j = json.loads(s[s.index("{"):])["jobs"][0]
r = j["read"]
p = r["clat_ns"]["percentile"]
sec = r["runtime"] / 1e3
n = max(r["total_ios"], 1)
cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100 * sec * 1e6 / n
print("%.0f %.1f %.0f %.0f -1 %.2f" % (n / sec, r["bw_bytes"] / 1e6,
      p["50.000000"] / 1e3, p["99.000000"] / 1e3, cpu))') || { tail -n 3 "$work/fio.err" >&2; return 1; }
		return 0
	fi
	local extra=() sock=$work/sock rc=0 line
	case $mode in
		cold) extra=(--cold --host-dir "$share") ;;
		cold-direct) extra=(--cold --host-dir "$share" --direct) ;;
	esac
	start_contender "$who" "$share" "$sock" || { stop_contender; return 1; }
	line=$(timeout $((secs + 120)) "$load" --socket-path "$sock" --workload "$wl" --depth "$depth" \
		--seconds "$secs" --file "$file" --file-mib "$mib" --daemon-pid "$dpid" \
		"${extra[@]}" --terse 2>>"$work/load.err") || rc=$?
	stop_contender
	# meta leaves the files of its last, unfinished ops behind.
	if [ "$wl" = meta ]; then find "$share" -maxdepth 1 -type f -name 'm-[0-9]*-[0-9]*' -delete; fi
	if [ "$rc" != 0 ]; then
		echo "fusebox-load exited $rc:" >&2
		tail -n 3 "$work/load.err" >&2 || true
		return 1
	fi
	local f
	read -r -a f <<<"$line"
	[ ${#f[@]} = 8 ] || { echo "unexpected fusebox-load output: $line" >&2; return 1; }
	res=${f[*]:2}
}

declare -A val # [SET|ROW|CONTENDER|ROUND|ops,p50,dcpu]
for ((round = 1; round <= rounds; round++)); do
	for set in "${sets[@]}"; do
		for row in $(set_rows "$set"); do
			read -r _ _ _ _ fiorw <<<"${spec[$row]}"
			who=(fusebox virtiofsd virtiofsd-tp16)
			[ "$fiorw" != - ] && who+=(fio)
			n=${#who[@]}
			for ((i = 0; i < n; i++)); do
				c=${who[$(((i + round - 1) % n))]}
				if run_one "$set" "$row" "$c"; then
					read -r o mb p5 p9 dc lc <<<"$res"
					echo "$set $row $round $c $o $mb $p5 $p9 $dc $lc" >>"$log"
					k="$set|$row|$c|$round"
					val[$k|ops]=$o val[$k|p50]=$p5
					awk -v d="$dc" 'BEGIN {exit !(d >= 0)}' && val[$k|dcpu]=$dc
					printf '[%d/%d] %-5s %-24s %-14s %10s ops/s  p50 %s us\n' \
						"$round" "$rounds" "$set" "$row" "$c" "$o" "$p5" >&2
				else
					echo "$set $row $round $c FAILED" >>"$log"
					printf '[%d/%d] %-5s %-24s %-14s FAILED\n' "$round" "$rounds" "$set" "$row" "$c" >&2
				fi
				sync -f "${share_of[$set]}"
			done
		done
	done
done

# med FIELD SET ROW CONTENDER FORMAT: median over rounds of FIELD, or "–".
med() {
	local r
	for ((r = 1; r <= rounds; r++)); do
		if [ -n "${val[$2|$3|$4|$r|$1]+x}" ]; then echo "${val[$2|$3|$4|$r|$1]}"; fi
	done | median "$5" –
}
# ratio SET ROW OTHER: median over rounds of fusebox ops / OTHER ops.
ratio() {
	local r k=$1\|$2
	for ((r = 1; r <= rounds; r++)); do
		[[ -n ${val[$k|fusebox|$r|ops]+x} && -n ${val[$k|$3|$r|ops]+x} ]] || continue
		awk -v a="${val[$k|fusebox|$r|ops]}" -v b="${val[$k|$3|$r|ops]}" 'BEGIN {if (b > 0) print a / b}'
	done | median '%.2f' –
}

{
	for set in "${sets[@]}"; do
		mapfile -t rs < <(set_rows "$set")
		[ ${#rs[@]} -gt 0 ] || continue
		echo
		echo "### $set: ${share_of[$set]} ($(findmnt -no FSTYPE -T "${share_of[$set]}")), median of $rounds round(s) of ${secs} s"
		echo
		echo "| row | fusebox ops/s | virtiofsd ops/s | tp16 ops/s | fio IOPS | f/v | f/tp16 | f/fio | p50 µs (f / v / tp16) | daemon CPU µs/op (f / v / tp16) |"
		echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
		for row in "${rs[@]}"; do
			printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s | %s / %s / %s |\n' "$row" \
				"$(med ops "$set" "$row" fusebox '%.0f')" "$(med ops "$set" "$row" virtiofsd '%.0f')" \
				"$(med ops "$set" "$row" virtiofsd-tp16 '%.0f')" "$(med ops "$set" "$row" fio '%.0f')" \
				"$(ratio "$set" "$row" virtiofsd)" "$(ratio "$set" "$row" virtiofsd-tp16)" \
				"$(ratio "$set" "$row" fio)" \
				"$(med p50 "$set" "$row" fusebox '%.0f')" "$(med p50 "$set" "$row" virtiofsd '%.0f')" \
				"$(med p50 "$set" "$row" virtiofsd-tp16 '%.0f')" \
				"$(med dcpu "$set" "$row" fusebox '%.1f')" "$(med dcpu "$set" "$row" virtiofsd '%.1f')" \
				"$(med dcpu "$set" "$row" virtiofsd-tp16 '%.1f')"
		done
	done
	echo
	echo "seqread/seqwrite ops are 1 MiB (fio on seqread: 1 MiB sequential reads); a meta op is create+close+stat+unlink."
} | tee "$results"
echo
echo "results: $results"
echo "per-run log: $log"

[ "$sweep" = 1 ] || exit 0
# The depth picture: the medians as a TSV (NaN where nothing was
# measured), with "# key value" lines plot-depth.gp puts in its caption.
tsv=$out/vhost-depth.tsv
nan() { sed 's/^–$/NaN/'; }
{
	echo "# vhost-load.sh SWEEP=1: medians of 4 KiB random reads by depth"
	echo "# date $(date +%Y-%m-%d)"
	echo "# commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo ?)$(git -C "$root" diff --quiet 2>/dev/null || echo +dirty)"
	echo "# share $ext4_dir ($(findmnt -no FSTYPE -T "$ext4_dir"))"
	echo "# runs $rounds round$([ "$rounds" = 1 ] || echo s) of $secs s"
	echo "# machine Linux $(uname -r), $(nproc) CPUs"
	printf 'mode\tdepth'
	for c in fusebox virtiofsd tp16 fio; do printf '\t%s_ops' "$c"; done
	for c in fusebox virtiofsd tp16; do printf '\t%s_cpu_us' "$c"; done
	for c in fusebox virtiofsd tp16 fio; do printf '\t%s_p50_us' "$c"; done
	echo
	for mode in warm cold; do
		for d in "${depths[@]}"; do
			row=randread-$d
			[ "$mode" = cold ] && row+=-cold
			printf '%s\t%s' "$mode" "$d"
			for c in fusebox virtiofsd virtiofsd-tp16 fio; do printf '\t%s' "$(med ops ext4 "$row" "$c" '%.0f' | nan)"; done
			for c in fusebox virtiofsd virtiofsd-tp16; do printf '\t%s' "$(med dcpu ext4 "$row" "$c" '%.2f' | nan)"; done
			for c in fusebox virtiofsd virtiofsd-tp16 fio; do printf '\t%s' "$(med p50 ext4 "$row" "$c" '%.0f' | nan)"; done
			echo
		done
	done
} >"$tsv"
cp "$tsv" "$root/docs/vhost-depth.tsv"
gnuplot -e "data='$tsv'; out='$root/docs/vhost-depth.svg'" "$root/benches/plot-depth.gp"
echo "depth medians: $tsv (and docs/vhost-depth.tsv)"
echo "depth picture: $root/docs/vhost-depth.svg"
