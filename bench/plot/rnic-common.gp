# rnic-common.gp: what the rnic plots share (loaded by rnic-latency.gp, rnic-bandwidth.gp, rnic-msgrate.gp).
# Input: csv = an rdmasock-perf CSV (one run); out = the PNG to write.
if (!exists("csv")) csv = "docs/results/rnic-sweep.csv"
set terminal pngcairo size 1200,760 enhanced font "DejaVu Sans,11" linewidth 1.5
set output out
set datafile separator ","
set datafile missing ""
set grid xtics ytics mytics lc rgb "#d0d0d0"
set logscale x 2
set xrange [0.8:1.3e6]
set xtics ("1" 1, "4" 4, "16" 16, "64" 64, "256" 256, "1K" 1024, "4K" 4096, "16K" 16384, "64K" 65536, \
           "256K" 262144, "1M" 1048576)
set xlabel "message size (bytes)"
set key outside right top vertical Left reverse spacing 1.3 box opaque
# The rows of one series are spread over the file (every test runs at each size in turn): pick them with awk.
sel(t, tr, m) = sprintf("< awk -F, '$1==\"%s\" && $2==\"%s\" && $3==\"%s\"' '%s'", t, tr, m, csv)
# "provider soft; wait block; 0.30 s per point; window 128; client on cpu 1, server on cpu 1" -> the essentials
provider = system(sprintf("grep -m1 '^# provider' '%s' | sed -e 's/^# //' -e 's/; window [0-9]*//' -e 's/;/,/g'", csv))
machine = system(sprintf("grep -m1 '^# rdmasock-perf' '%s' | sed -e 's/^# //' -e 's/; [0-9T:+-]*$//' -e 's/;/,/g'", csv))
# One style per series, the same in every plot: UD solid, RC dashed, kernel grey.
set style line 1 lc rgb "#1f77b4" pt 7 ps 0.9 dt 1
set style line 2 lc rgb "#2ca02c" pt 5 ps 0.9 dt 1
set style line 3 lc rgb "#9467bd" pt 9 ps 0.9 dt 1
set style line 4 lc rgb "#d62728" pt 6 ps 0.9 dt 2
set style line 5 lc rgb "#ff7f0e" pt 4 ps 0.9 dt 2
set style line 6 lc rgb "#8c564b" pt 8 ps 0.9 dt 2
set style line 7 lc rgb "#404040" pt 3 ps 0.9 dt 3
set style line 8 lc rgb "#909090" pt 2 ps 0.9 dt 3
