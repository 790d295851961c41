# Grant 2012 figures 6.6/6.7 on a lossy link, as measured by bench/dgram_netem.sh: goodput by loss rate, one
# panel per datagram size, one line per path (kernel UDP, datagram-iWARP send/recv, Write-Record).
#   gnuplot -e "out='x.png'; csv='dgram-netem.csv'" bench/plot/dgram-netem.gp
set terminal pngcairo size 1500,520 enhanced font "DejaVu Sans,11" linewidth 1.5
set output out
set datafile separator ","
set grid xtics ytics lc rgb "#d0d0d0"
set xlabel "loss on the link (%)"
set ylabel "goodput (Mbit/s)"
set key top right
set multiplot layout 1,3 title "Datagram goodput under link loss: two soft-RoCE VMs, tc netem, iperf3 -u (Grant 2012 fig. 6.6/6.7 shape)"
do for [size in "1024 8192 65000"] {
    set title sprintf("%s-byte datagrams", size)
    plot for [p in "kernel sendrecv wrecord"] sprintf("< awk -F, '$1==\"%s\" && $2==\"%s\" && $5 > 0' '%s'", p, size, csv) \
         using 3:8 with linespoints pt 7 title p
}
unset multiplot
