#!/usr/bin/env bash
# CPU the dispatcher and its workers spend handing a large result to a MySQL client:
# starts BINDIR/osprey-dispatcher on the embedded default (its own MariaDB sandbox), loads
# 100 000 rows of 5 columns, then reads them all 10 times with the `mariadb` client through
# the MySQL port, 3 rounds, and prints the CPU (user + system, dispatcher + workers) each
# round took. Used to measure issue 23 item 9 (rows handed on undecoded); run it for two
# builds, alternated, to compare them.
#
#   scripts/bench-big-result.sh target/release after
#   scripts/bench-big-result.sh /tmp/before before
set -euo pipefail
dir=$1
label=${2:-run}
export PATH=$PATH:/usr/sbin
credentials=/tmp/osprey-$(id -u)/credentials
log=$(mktemp /tmp/bench-big-result-XXXX.log)
rm -f "$credentials"
"$dir/osprey-dispatcher" >"$log" 2>&1 &
dispatcher=$!
trap 'kill $dispatcher 2>/dev/null; wait $dispatcher 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 120); do
  grep -q '^mysql=' "$credentials" 2>/dev/null && grep -q 'ready' "$log" && break
  sleep 1
done
mysql=$(sed -n 's/^mysql=//p' "$credentials")
$mysql -e "create table if not exists big (id int primary key, a varchar(40), b double, c datetime(6), d int);
           insert ignore into big select seq, concat('row-', seq), seq / 3, '2020-01-01' + interval seq second, seq * 7
           from seq_1_to_100000"
sleep 3 # the replicas, which serve the reads, apply it
cpu_ticks() {
  local total=0 p t
  for p in $dispatcher $(pgrep -P $dispatcher); do
    t=$(awk '{print $14 + $15}' /proc/$p/stat 2>/dev/null || echo 0)
    total=$((total + t))
  done
  echo $total
}
hz=$(getconf CLK_TCK)
for round in 1 2 3; do
  c0=$(cpu_ticks)
  t0=$(date +%s%N)
  for _ in $(seq 10); do $mysql -e "select * from big" >/dev/null; done
  c1=$(cpu_ticks)
  t1=$(date +%s%N)
  echo "$label round $round: dispatcher + workers CPU $(((c1 - c0) * 1000 / hz)) ms for 10 x 100000 rows, wall $(((t1 - t0) / 1000000)) ms"
done
