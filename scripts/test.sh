#!/usr/bin/env bash
# The README's test command: installs what the tests need when it is missing (MariaDB,
# the Galera provider and rsync for the Galera sandbox, chromium and chromedriver for the
# operations page's browser test), then runs exactly
# `cargo test --workspace` (extra arguments go to it). `.ci/run` calls this too, so the
# two cannot drift: a test that needs a new package adds it here.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=()
if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
  packages+=(mariadb-server mariadb-client)
fi
# The Galera sandbox (osprey_sandbox::Galera): the provider, and rsync for state transfers.
if [ ! -f /usr/lib/galera/libgalera_smm.so ] && [ ! -f /usr/lib/libgalera_smm.so ]; then
  packages+=(galera-4)
fi
if ! command -v rsync >/dev/null 2>&1; then
  packages+=(rsync)
fi
# The MySQL front end's real clients (tests/tests/mysql): sysbench and Python for PyMySQL.
if ! command -v sysbench >/dev/null 2>&1; then
  packages+=(sysbench)
fi
if ! command -v python3 >/dev/null 2>&1; then
  packages+=(python3 python3-pip)
fi
# The operations page's browser test (tests/tests/ui.rs): headless chromium and its
# WebDriver server. The test fails in CI (CI set) without them, and skips loudly elsewhere.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/lib/chromium/chromium ]; then
  packages+=(chromium)
fi
if ! command -v chromedriver >/dev/null 2>&1; then
  packages+=(chromium-driver)
fi
if [ ${#packages[@]} -gt 0 ]; then
  echo "installing what the tests need with apt-get: ${packages[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${packages[@]}"
fi
if ! python3 -c 'import pymysql' >/dev/null 2>&1; then
  echo "installing PyMySQL with pip (tests/tests/mysql)" >&2
  python3 -m pip install -q pymysql 2>/dev/null || python3 -m pip install -q --break-system-packages pymysql
fi
# mariadbd lives in /usr/sbin, which a non-root PATH may lack.
export PATH="$PATH:/usr/sbin"
exec cargo test --workspace "$@"
