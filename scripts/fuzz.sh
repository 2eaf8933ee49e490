#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ (docs/FUZZING.md), one after the other, each for
# SECS seconds, starting from the committed seeds (fuzz/seeds/<target>) and the local
# corpus (fuzz/corpus/<target>, where libFuzzer also keeps what it finds; not in git).
#   scripts/fuzz.sh [SECS] [TARGET...]     (default: 60 s, every target)
# A crash stops the run with a non-zero status and leaves the input in
# fuzz/artifacts/<target>/. Needs cargo-fuzz (`cargo install cargo-fuzz --locked`).
# OSPREY_FUZZ_QUIET=1 (as .ci/run sets it) keeps libFuzzer's progress lines in
# fuzz/logs/<target>.log and prints one summary line per target (the log's tail on a failure).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=(frame_decoder body_decoder request sql_scanner mysql_packets)
fi
# cargo-fuzz passes -Z sanitizer flags; this lets the stable toolchain accept them.
export RUSTC_BOOTSTRAP=1
for t in "${targets[@]}"; do
  case $t in
    sql_scanner | mysql_packets) dict=fuzz/dicts/sql.dict ;;
    *) dict=fuzz/dicts/msgpack.dict ;;
  esac
  mkdir -p "fuzz/corpus/$t"
  echo "== fuzz target $t, ${secs} s"
  run=(cargo fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" --
    -dict="$dict" -max_total_time="$secs" -timeout=20 -print_final_stats=1)
  if [ "${OSPREY_FUZZ_QUIET:-0}" = 1 ]; then
    mkdir -p fuzz/logs
    log="fuzz/logs/$t.log"
    if ! "${run[@]}" >"$log" 2>&1; then
      tail -n 80 "$log"
      echo "fuzz target $t FAILED (whole log: $log, input in fuzz/artifacts/$t/)"
      exit 1
    fi
    echo "fuzz target $t: $(grep -E '^Done [0-9]+ runs' "$log" | tail -n 1)"
  else
    "${run[@]}"
  fi
done
