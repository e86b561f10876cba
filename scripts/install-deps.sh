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
  nftables            # a firewall rule between namespaces (test_preflight.sh: a blocked pair)
  procps psmisc       # pgrep/pkill in integration tests
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

# Python packages the integration tests' checkers import (numpy: test_dp.sh compares
# parameter dumps; yaml: test_k8s_env.sh reads scripts/k8s/*.yaml), for whichever
# python3 is first on PATH (pyenv, venv or Debian's). MODULE:PIP_NAME.
py_missing=()
for mp in numpy:numpy yaml:PyYAML; do python3 -c "import ${mp%%:*}" 2>/dev/null || py_missing+=("${mp#*:}"); done

[ ${#missing[@]} -eq 0 ] && [ ${#py_missing[@]} -eq 0 ] && exit 0
if [ "${1:-}" = "--check" ]; then
  echo "missing packages: ${missing[*]} ${py_missing[*]}" >&2
  exit 1
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -ne 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#py_missing[@]} -ne 0 ]; then
  echo "install-deps: pip installing ${py_missing[*]} for $(command -v python3)" >&2
  python3 -m pip install -q "${py_missing[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${py_missing[@]}"
fi
echo "install-deps: done" >&2
