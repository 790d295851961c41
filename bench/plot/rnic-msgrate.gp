# Message rate at the receiver against message size (the view the UD-vs-UDP 1 KiB target is stated in).
#   gnuplot -e "csv='docs/results/rnic-sweep.csv'; out='docs/results/rnic-msgrate.png'" bench/plot/rnic-msgrate.gp
if (!exists("out")) out = "docs/results/rnic-msgrate.png"
load "bench/plot/rnic-common.gp"
set logscale y 10
set format y "%.0s%c"
set ylabel "messages per second at the receiver"
set title sprintf("rdmasock-perf back-to-back message rate\n%s\n%s", provider, machine) font ",10"
col = 8   # msg_rate
plot sel("send", "ud", "bw") using 4:col with linespoints ls 1 title "UD send/recv", \
     sel("wrecord", "ud", "bw") using 4:col with linespoints ls 2 title "UD Write-Record", \
     sel("read", "ud", "bw") using 4:col with linespoints ls 3 title "UD RDMA Read", \
     sel("send", "rc", "bw") using 4:col with linespoints ls 4 title "RC send/recv", \
     sel("write", "rc", "bw") using 4:col with linespoints ls 5 title "RC RDMA Write", \
     sel("read", "rc", "bw") using 4:col with linespoints ls 6 title "RC RDMA Read", \
     sel("tcp", "kernel", "bw") using 4:col with linespoints ls 7 title "kernel TCP", \
     sel("udp", "kernel", "bw") using 4:col with linespoints ls 8 title "kernel UDP"
