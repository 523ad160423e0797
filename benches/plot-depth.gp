# Draws the depth picture of `SWEEP=1 benches/vhost-load.sh`: ops/s and
# daemon CPU per op against depth, warm and cold 4 KiB random reads, for
# fusebox, virtiofsd, virtiofsd --thread-pool-size 16 and fio (ops only:
# fio has no daemon).
#
# Usage: gnuplot -e "data='docs/vhost-depth.tsv'; out='docs/vhost-depth.svg'" benches/plot-depth.gp
#   data  the medians vhost-load.sh wrote (default docs/vhost-depth.tsv):
#         a header line of column names (mode depth fusebox_ops ...), one
#         line per mode (warm|cold) and depth, and "# key value" comment
#         lines (date, commit, share, runs, machine) for the caption
#   out   the SVG (default docs/vhost-depth.svg)

if (!exists("data")) data = "docs/vhost-depth.tsv"
if (!exists("out")) out = "docs/vhost-depth.svg"

# meta(KEY): the value of the data file's "# KEY value" line, or "?".
meta(k) = system(sprintf("sed -n 's/^# %s //p' '%s' | head -n 1", k, data))
m(k) = (strlen(meta(k)) > 0 ? meta(k) : "?")

set encoding utf8
set terminal svg size 1100,900 dynamic noenhanced font "sans,12" background "white"
set output out
set datafile separator "\t"
set datafile columnheaders
set datafile commentschars "#"

set style line 1 lc rgb "#d62728" lw 2.5 pt 7   # fusebox
set style line 2 lc rgb "#1f77b4" lw 2 pt 5     # virtiofsd
set style line 3 lc rgb "#2ca02c" lw 2 pt 9     # virtiofsd-tp16
set style line 4 lc rgb "#7f7f7f" lw 2 pt 13 dt 2 # fio
set pointsize 1.1

# in(MODE, COL): column COL on MODE's lines, NaN elsewhere.
in(mode, col) = (strcol("mode") eq mode ? column(col) : NaN)

set multiplot \
	title sprintf("4 KiB random reads over vhost-user-fs, no VM (fusebox-load as the guest): fusebox vs virtiofsd 1.14\n%s, fusebox %s, share %s; median of %s; %s", \
		m("date"), m("commit"), m("share"), m("runs"), m("machine")) font ",12"

# The legend of all four panels: a strip of its own under the title.
set origin 0, 0.865
set size 1, 0.06
unset border
unset tics
set xrange [0:1]
set yrange [0:1]
set key center center horizontal maxrows 1 Left reverse font ",11" samplen 3 width 2
plot NaN with linespoints ls 1 title "fusebox", \
	NaN with linespoints ls 2 title "virtiofsd (default)", \
	NaN with linespoints ls 3 title "virtiofsd --thread-pool-size 16", \
	NaN with linespoints ls 4 title "fio on the host file (the limit; ops/s only)"
unset key
set border
set tics
set tics nomirror
set border 3

set logscale x 2
set xtics ("1" 1, "4" 4, "16" 16, "64" 64)
set xrange [0.8:80]
set xlabel "requests in flight (depth, log2 scale)"
set grid xtics ytics mytics lc rgb "#dddddd"
set size 0.5, 0.43

do for [mode in "warm cold"] {
	what = (mode eq "warm" \
		? "warm: 256 MiB file in the host page cache (fio buffered)" \
		: "cold: 4 GiB file, page cache dropped before each run (fio O_DIRECT)")
	y0 = (mode eq "warm" ? 0.435 : 0)

	set origin 0, y0
	set title sprintf("%s\nthroughput", what) font ",11"
	set ylabel "ops/s (log scale)"
	set logscale y 10
	set format y "%.0s%c"
	set yrange [*:*]
	plot data using "depth":(in(mode, "fusebox_ops")) with linespoints ls 1 notitle, \
		'' using "depth":(in(mode, "virtiofsd_ops")) with linespoints ls 2 notitle, \
		'' using "depth":(in(mode, "tp16_ops")) with linespoints ls 3 notitle, \
		'' using "depth":(in(mode, "fio_ops")) with linespoints ls 4 notitle

	set origin 0.5, y0
	set title sprintf("%s\ndaemon CPU per op (user+system)", what) font ",11"
	set ylabel "daemon CPU per op (µs)"
	unset logscale y
	set format y "%g"
	set yrange [0:*]
	plot data using "depth":(in(mode, "fusebox_cpu_us")) with linespoints ls 1 notitle, \
		'' using "depth":(in(mode, "virtiofsd_cpu_us")) with linespoints ls 2 notitle, \
		'' using "depth":(in(mode, "tp16_cpu_us")) with linespoints ls 3 notitle
}
unset multiplot
