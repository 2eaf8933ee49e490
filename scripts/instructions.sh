#!/usr/bin/env bash
# User-space instructions per request of the worker, the dispatcher or the load generator
# (osprey-bench itself: the SDK's side), counted by callgrind under a point-select load, or
# another of the bench's workloads (docs/BENCHMARKS.md, "Step 4"). Unlike the benchmark's
# CPU time, the count is nearly the same from run to run whatever else the machine does, so
# it can tell a few per cent apart.
#   scripts/instructions.sh worker|dispatcher|loadgen [BIN_DIR=target/release] [WORKLOAD=point-select]
# WORKLOAD is one of the bench's workloads, or sysbench:TEST (e.g. sysbench:oltp_point_select,
# through the MySQL port; loadgen then counts nothing of sysbench's own).
# worker: W=2, C=16, both workers under callgrind; dispatcher: W=8, C=64; loadgen: W=2, C=16.
# CLIENTS=N and WORKERS=N override them (CLIENTS=1: the cost of a request with nothing
# else in flight, when every hop sleeps and wakes). KEEP=DIR keeps the callgrind files
# there, for callgrind_annotate.
# Counts a 15 s window after 8 s of load (callgrind_control zeroes, then dumps), and
# divides by the requests osprey_requests_total counted in it. Needs valgrind, and the
# release build of osprey-bench, osprey-dispatcher and osprey-worker.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?worker, dispatcher or loadgen}
bin=$(realpath "${2:-target/release}")
workload=${3:-point-select}
work=$(mktemp -d /tmp/osprey-instructions-XXXXXX)
keep=${KEEP:-}
trap 'pkill -f "$work/osprey-bench" || true; if [ -n "$keep" ]; then mkdir -p "$keep"; cp "$work"/cg.* "$keep"/ 2>/dev/null || true; fi; rm -rf "$work"' EXIT
# The bench starts the binaries next to itself: a copy of it with wrappers beside it.
cp "$bin/osprey-bench" "$work/"
cp "$bin/osprey-dispatcher" "$work/osprey-dispatcher"
cp "$bin/osprey-worker" "$work/osprey-worker"
bench=("$work/osprey-bench")
case $what in
  worker) wrapped=osprey-worker; args=(--clients "${CLIENTS:-16}" --workers "${WORKERS:-2}") ;;
  dispatcher) wrapped=osprey-dispatcher; args=(--clients "${CLIENTS:-64}" --workers "${WORKERS:-8}") ;;
  loadgen)
    wrapped=
    args=(--clients "${CLIENTS:-16}" --workers "${WORKERS:-2}")
    bench=(valgrind --tool=callgrind --log-file="$work/valgrind.log" --callgrind-out-file="$work/cg.%p.out" "$work/osprey-bench")
    ;;
  *) echo "worker, dispatcher or loadgen" >&2; exit 2 ;;
esac
if [ -n "$wrapped" ]; then
  mv "$work/$wrapped" "$work/$wrapped.real"
  cat > "$work/$wrapped" <<EOW
#!/usr/bin/env bash
exec valgrind --tool=callgrind --callgrind-out-file=$work/cg.%p.out $work/$wrapped.real "\$@" 2>>$work/valgrind.log
EOW
  chmod +x "$work/$wrapped"
fi
# sysbench:TEST runs sysbench's own TEST through the MySQL port instead.
# sysbench runs straight at the primary first, then through Osprey: wait for the first run's
# line.
case $workload in
  sysbench:*) load=(--sysbench "${workload#sysbench:}" --rows 1000 --pairs 1); started="direct: " ;;
  *) load=(--workloads "$workload"); started="run: target=osprey" ;;
esac
"${bench[@]}" --targets osprey "${load[@]}" "${args[@]}" --duration 60 --warmup 1 \
  >"$work/bench.log" 2>&1 &
bench_pid=$!
for _ in $(seq 1 300); do
  grep -q "$started" "$work/bench.log" && break
  kill -0 "$bench_pid" 2>/dev/null || break
  sleep 1
done
grep -q "$started" "$work/bench.log" || { cat "$work/bench.log" >&2; exit 1; }
sleep 8
config=$(ls -td /tmp/osprey-bench-*/ | head -1)osprey.toml
admin=$(sed -n 's/^admin = "\(.*\)"/\1/p' "$config")
requests() {
  curl -s -m 5 -H 'Authorization: Bearer bench-admin-token' "http://$admin/metrics" |
    awk '/^osprey_requests_total/ { s += $NF } END { printf "%d", s }'
}
before=$(requests)
callgrind_control -z >/dev/null 2>&1 || { echo "callgrind_control -z found no process to count" >&2; exit 1; }
sleep 15
after=$(requests)
callgrind_control -d >/dev/null 2>&1
sleep 3
total=0
for f in "$work"/cg.*.out.*; do
  n=$(awk '/^summary:/ { print $2; exit }' "$f")
  total=$((total + n))
done
n=$((after - before))
echo "$what: $n requests, $total instructions, $((total / n)) per request"
