# Latency against message size, UD vs RC vs kernel (the shape of Grant 2012, figure 6.4).
#   gnuplot -e "csv='docs/results/rnic-sweep.csv'; out='docs/results/rnic-latency.png'" bench/plot/rnic-latency.gp
if (!exists("out")) out = "docs/results/rnic-latency.png"
load "bench/plot/rnic-common.gp"
set logscale y 10
set ylabel "latency, median (µs)\none-way = round trip / 2; read: whole READ"
set title sprintf("rdmasock-perf ping-pong latency\n%s\n%s", provider, machine) font ",10"
col = 7   # median_us
plot sel("send", "ud", "lat") using 4:col with linespoints ls 1 title "UD send/recv", \
     sel("wrecord", "ud", "lat") using 4:col with linespoints ls 2 title "UD Write-Record", \
     sel("read", "ud", "lat") using 4:col with linespoints ls 3 title "UD RDMA Read", \
     sel("send", "rc", "lat") using 4:col with linespoints ls 4 title "RC send/recv", \
     sel("write", "rc", "lat") using 4:col with linespoints ls 5 title "RC RDMA Write (+ notice)", \
     sel("read", "rc", "lat") using 4:col with linespoints ls 6 title "RC RDMA Read", \
     sel("tcp", "kernel", "lat") using 4:col with linespoints ls 7 title "kernel TCP", \
     sel("udp", "kernel", "lat") using 4:col with linespoints ls 8 title "kernel UDP"
