#!/usr/bin/env bash
# Makes the browser suite runnable: Debian's chromium (installed with apt-get
# when missing) and playwright-core from package-lock.json (`npm ci`, cached
# in tests/dashboard/node_modules until the lock file changes).
#
# Prints the Chromium path on success. Exits non-zero with the reason on
# stderr when something cannot be had; tests/dashboard.rs then fails under
# CI=true and skips otherwise.
set -euo pipefail
cd "$(dirname "$0")"

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

command -v node >/dev/null || { echo "node is not installed" >&2; exit 1; }
command -v npm >/dev/null || { echo "npm is not installed" >&2; exit 1; }

if [ ! -x "$CHROMIUM" ]; then
  as_root=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      as_root=(sudo -n)
    else
      echo "$CHROMIUM is missing and apt-get needs root (install Debian's chromium package)" >&2
      exit 1
    fi
  fi
  echo "setup.sh: installing chromium with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! "${as_root[@]}" apt-get install -y -q chromium >&2; then
    "${as_root[@]}" apt-get update -q >&2 || true
    "${as_root[@]}" apt-get install -y -q chromium >&2 ||
      { echo "apt-get could not install chromium" >&2; exit 1; }
  fi
  [ -x "$CHROMIUM" ] || { echo "chromium installed but $CHROMIUM is missing" >&2; exit 1; }
fi

want="$(sha256sum package-lock.json | cut -d' ' -f1)"
stamp=node_modules/.anarchon-lock-sha256
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] ||
  [ ! -f node_modules/playwright-core/package.json ]; then
  echo "setup.sh: npm ci (playwright-core)" >&2
  npm ci --no-audit --no-fund --loglevel=error >&2 ||
    { echo "npm ci failed (is the npm registry reachable?)" >&2; exit 1; }
  echo "$want" >"$stamp"
fi

echo "$CHROMIUM"
