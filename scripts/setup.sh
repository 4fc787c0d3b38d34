#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for Kiln and builds it into ./build.
#   - Debian packages: compilers, CMake/Ninja, LLVM/clang/lld 22 (bookworm-security), the HIP
#     headers, and the libraries Kiln uses (fmt, spdlog, nlohmann-json, CLI11, OpenSSL, zstd,
#     libarchive, hiredis, xxhash, googletest, Google Benchmark), and redis-server for the remote-cache
#     tests.
#   - The AMD emulator's Python: a virtual environment .venv with tinygrad 0.14.0 and numpy (the
#     emulator tests and `kiln run --emulator`; see docs/emulator.md).
#   - The CUDA toolkit (NVRTC, nvJitLink, cuda.h) is expected at /usr/local/cuda; Kiln dlopens
#     NVRTC and nvJitLink at run time and needs only cuda.h/nvrtc.h/nvJitLink.h to build.
# Set KILN_SKIP_APT=1 to skip the package step, KILN_SKIP_VENV=1 to skip .venv, KILN_WITH_LLVM=OFF to
# build without LLVM, KILN_BUILD_DIR to build somewhere other than ./build (CI builds the no-LLVM
# configuration into build-nollvm next to the default one).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${KILN_SKIP_APT:-0}" != 1 ]]; then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  pkgs=(g++ cmake ninja-build pkg-config libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev
        libssl-dev libzstd-dev zlib1g-dev libarchive-dev libhiredis-dev libxxhash-dev redis-server libgtest-dev libbenchmark-dev
        libamdhip64-dev python3-venv)
  if [[ "${KILN_WITH_LLVM:-ON}" != OFF ]]; then
    pkgs+=(clang-22 llvm-22-dev libclang-22-dev lld-22 liblld-22-dev libclang-rt-22-dev)
  fi
  $SUDO apt-get install -y -q --no-install-recommends "${pkgs[@]}"
fi

if [[ "${KILN_SKIP_VENV:-0}" != 1 ]] &&
   ! .venv/bin/python3 -c 'import importlib.metadata as m, numpy; assert m.version("tinygrad") == "0.14.0"' 2>/dev/null; then
  echo "setup: making .venv (tinygrad 0.14.0, numpy) for the AMD emulator"
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check tinygrad==0.14.0 "numpy<3"
fi

if [[ ! -f /usr/local/cuda/include/cuda.h ]]; then
  echo "setup: error: /usr/local/cuda/include/cuda.h not found; install the CUDA toolkit (13.x) headers" >&2
  exit 1
fi

build_dir="${KILN_BUILD_DIR:-build}"
launcher=()  # ccache, where installed, serves rebuilds in other checkouts and worktrees
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WITH_LLVM="${KILN_WITH_LLVM:-ON}" "${launcher[@]}"
ninja -C "$build_dir" -j "$(nproc)"
