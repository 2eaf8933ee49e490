#!/usr/bin/env bash
# Starts the whole system on the local default: installs MariaDB if it is missing,
# builds the dispatcher and worker, and runs the dispatcher, which starts its own
# MariaDB sandbox (a primary and two replicas, failover on) in a temp dir when no backend
# or cluster is configured.
# Extra arguments go to osprey-dispatcher (e.g. --config osprey.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
  echo "MariaDB is not installed; installing it with apt-get" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends mariadb-server mariadb-client
fi
cargo build --release --bins
exec target/release/osprey-dispatcher "$@"
