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
# Node.js for mysql2 (tests/node, tests/tests/mysql/more_drivers.rs).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
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
# mysql-connector-python, pure and C extension: 9.7.0, the last whose C extension runs
# on Debian 12's OpenSSL 3.0 (26.x needs OPENSSL_3.2.0).
if ! python3 -c 'import mysql.connector, _mysql_connector' >/dev/null 2>&1; then
  echo "installing mysql-connector-python with pip (tests/tests/mysql)" >&2
  python3 -m pip install -q mysql-connector-python==9.7.0 2>/dev/null \
    || python3 -m pip install -q --break-system-packages mysql-connector-python==9.7.0
fi
if [ ! -d tests/node/node_modules ]; then
  echo "installing mysql2 with npm ci (tests/node)" >&2
  npm ci --prefix tests/node --no-audit --no-fund
fi
# mariadbd lives in /usr/sbin, which a non-root PATH may lack.
export PATH="$PATH:/usr/sbin"
exec cargo test --workspace "$@"
