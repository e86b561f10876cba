#!/usr/bin/env bash
# install-deps.sh - install the Debian packages dtrun needs to build, test and run
# its demo. Idempotent: quiet and fast (one dpkg query) when everything is present.
# Usage: scripts/install-deps.sh [--check]   (--check: exit 1 if something is missing)
set -euo pipefail

PKGS=(
  build-essential pkg-config
  libuv1-dev          # event loop of the store server and the agent
  libcjson-dev        # config files, meta.json, metrics
  libcriterion-dev    # unit tests
  libopenblas-dev     # CPU matmuls
  fortunes fortunes-min  # offline English text for the demo corpus
  clang libclang-rt-14-dev  # libFuzzer target and LeakSanitizer (make fuzz)
  iproute2            # network namespaces for multi-node tests
  procps psmisc       # pgrep/pkill in integration tests
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

[ ${#missing[@]} -eq 0 ] && exit 0
if [ "${1:-}" = "--check" ]; then
  echo "missing packages: ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
