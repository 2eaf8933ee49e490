#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ (docs/FUZZING.md), one after the other, each for
# SECS seconds, starting from the committed seeds (fuzz/seeds/<target>) and the local
# corpus (fuzz/corpus/<target>, where libFuzzer also keeps what it finds; not in git).
#   scripts/fuzz.sh [SECS] [TARGET...]     (default: 60 s, every target)
# A crash stops the run with a non-zero status and leaves the input in
# fuzz/artifacts/<target>/. Needs cargo-fuzz (`cargo install cargo-fuzz --locked`).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=(frame_decoder body_decoder request sql_scanner)
fi
# cargo-fuzz passes -Z sanitizer flags; this lets the stable toolchain accept them.
export RUSTC_BOOTSTRAP=1
for t in "${targets[@]}"; do
  case $t in
    sql_scanner) dict=fuzz/dicts/sql.dict ;;
    *) dict=fuzz/dicts/msgpack.dict ;;
  esac
  mkdir -p "fuzz/corpus/$t"
  echo "== fuzz target $t, ${secs} s"
  cargo fuzz run "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
    -dict="$dict" -max_total_time="$secs" -timeout=20 -print_final_stats=1
done
