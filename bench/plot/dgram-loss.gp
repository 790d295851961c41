# Grant 2012 figures 6.6 (path='sendrecv') and 6.7 (path='wrecord') as measured by bench/dgram_loss.sh: bandwidth
# by message size, one line per loss rate; socket level solid (to 65,507 B), rnic level dashed (to 1 MiB).
#   gnuplot -e "out='x.png'; med='dgram-loss-median.csv'; rcsv='dgram-loss-rnic.csv'; path='sendrecv'; rtest='send'; losses='0,1000,5000,10000,50000'" bench/plot/dgram-loss.gp
set terminal pngcairo size 1200,760 enhanced font "DejaVu Sans,11" linewidth 1.5
set output out
set datafile separator ","
set grid xtics ytics mytics lc rgb "#d0d0d0"
set logscale x 2
set logscale y 10
set format y "%.0s%c"
set xrange [800:1.3e6]
set xtics ("1K" 1024, "4K" 4096, "16K" 16384, "64K" 65536, "256K" 262144, "1M" 1048576)
set xlabel "message size (bytes); socket level ends at 65,507 B (two soft-RNIC datagrams above 64,512 B)"
set ylabel "bandwidth at the receiver (MB/s)"
set key outside right top vertical Left reverse spacing 1.3 box opaque
set title sprintf("%s bandwidth under datagram loss (Grant 2012 fig. %s shape), loopback, soft RNIC drop knob", \
                  path eq "sendrecv" ? "UD send/recv" : "Write-Record", path eq "sendrecv" ? "6.6" : "6.7") font ",11"
nl = words(system(sprintf("echo '%s' | tr ',' ' '", losses)))
loss(i) = word(system(sprintf("echo '%s' | tr ',' ' '", losses)), i)
sk(i) = sprintf("< awk -F, '$1==\"%s\" && $3==\"%s\"' '%s'", path, loss(i), med)
rn(i) = sprintf("< awk -F, '$1==\"%s\" && $2==\"%s\"' '%s'", loss(i), rtest, rcsv)
label(i) = sprintf("%g%% loss", loss(i) / 1e4)
plot for [i=1:nl] sk(i) using 2:4 with linespoints lc i pt 7 dt 1 title "socket, " . label(i), \
     for [i=1:nl] rn(i) using 5:10 with linespoints lc i pt 6 dt 2 title "rnic, " . label(i)
