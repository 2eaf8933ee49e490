#!/usr/bin/env bash
# Soak: steady load through the dispatcher with worker recycling (max_requests = 200),
# sampling the RSS of the dispatcher and of its workers; prints whether memory stayed flat
# (first quarter vs last quarter). See docs/OPERATIONS.md, "Soak".
#
# Usage: scripts/soak.sh [DURATION_SECONDS=300] [SAMPLE_SECONDS=10] [TASKS=8]
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-300}
SAMPLE=${2:-10}
TASKS=${3:-8}
cargo build --bins
OSPREY_SOAK_SECS=$DURATION OSPREY_SOAK_SAMPLE_SECS=$SAMPLE OSPREY_SOAK_TASKS=$TASKS \
  cargo test -p osprey-tests --test chaos -- --ignored --exact soak --nocapture
