# Grant 2012 figures 6.4 (mode='lat') and 6.5 (mode='bw') as measured by bench/dgram_figures.sh: the datagram
# socket layer (solid) and the rnic.h level (dashed), UD send/recv, Write-Record and kernel UDP, by message size.
#   gnuplot -e "out='x.png'; med='dgram-figures-median.csv'; rcsv='dgram-figures-rnic.csv'; mode='lat'" bench/plot/dgram-figures.gp
set terminal pngcairo size 1200,760 enhanced font "DejaVu Sans,11" linewidth 1.5
set output out
set datafile separator ","
set grid xtics ytics mytics lc rgb "#d0d0d0"
set logscale x 2
set logscale y 10
set xrange [0.8:80000]
set xtics ("1" 1, "4" 4, "16" 16, "64" 64, "256" 256, "1K" 1024, "4K" 4096, "16K" 16384, "64K" 65536)
set xlabel "datagram size (bytes; the last point is 65,507, the largest UDP datagram)"
set key outside right top vertical Left reverse spacing 1.3 box opaque
# socket-level rows: mode,path,size,value
sk(p) = sprintf("< awk -F, '$1==\"%s\" && $2==\"%s\"' '%s'", mode, p, med)
# rdmasock-perf rows: test,transport,mode,size,iterations,avg_us,median_us,msg_rate,mb_per_s,...
rn(t) = sprintf("< awk -F, '!/^#/ && $1==\"%s\" && $3==\"%s\"' '%s'", t, mode, rcsv)
if (mode eq "lat") {
    set ylabel "one-way latency, median (us) = round trip / 2"
    set title "Datagram ping-pong latency (Grant 2012 fig. 6.4 shape), loopback, soft RNIC, one CPU" font ",11"
    rcol = 7
} else {
    set ylabel "bandwidth at the receiver (MB/s)"
    set format y "%.0s%c"
    set title "Datagram unidirectional bandwidth (Grant 2012 fig. 6.5 shape), loopback, soft RNIC, one CPU\nsocket level: windowed stream; rnic level: window 128, no flow control (overrun lost)" font ",11"
    rcol = 9
}
plot sk("sendrecv") using 3:4 with linespoints lc rgb "#1f77b4" pt 7 dt 1 title "socket: UD send/recv", \
     sk("wrecord") using 3:4 with linespoints lc rgb "#2ca02c" pt 5 dt 1 title "socket: Write-Record", \
     sk("kernel") using 3:4 with linespoints lc rgb "#404040" pt 3 dt 1 title "socket: kernel UDP", \
     rn("send") using 4:rcol with linespoints lc rgb "#1f77b4" pt 6 dt 2 title "rnic: UD send/recv", \
     rn("wrecord") using 4:rcol with linespoints lc rgb "#2ca02c" pt 4 dt 2 title "rnic: UD Write-Record", \
     rn("udp") using 4:rcol with linespoints lc rgb "#909090" pt 2 dt 2 title "rnic tool: kernel UDP"
