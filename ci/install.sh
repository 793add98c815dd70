#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Install everything fa2patch needs, from Debian's packages and the Python package index.
# Idempotent: a second run installs nothing new. Creates the virtual environment .venv/.
# The versions come from pyproject.toml's `build` extra and baseline.lock's [toolchain].
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
# torch and the CUDA 12 wheels: the `build` extra in pyproject.toml (`fa2patch check` compares
# it with baseline.lock); `docs` and `plot`: the user guide (ci/docs.sh) and `report --plot`'s tests.
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[build,test,docs,plot]'
pin() {  # a [toolchain] field of baseline.lock
    .venv/bin/python -c 'import sys; from fa2patch.common.lockfile import Lock
print(getattr(Lock.load("baseline.lock").toolchain, sys.argv[1]))' "$1"
}
clang_major=$(pin clang)

apt_missing=()
command -v "clang++-$clang_major" >/dev/null || apt_missing+=("clang-$clang_major")
command -v "clang-format-$clang_major" >/dev/null || apt_missing+=("clang-format-$clang_major")  # tests/series/test_clang_format.py
command -v ccache >/dev/null || apt_missing+=(ccache)
command -v git >/dev/null || apt_missing+=(git)
command -v c++filt >/dev/null || apt_missing+=(binutils)
command -v cmake >/dev/null || apt_missing+=(cmake)  # the --vllm-src tree's build (tests)
if ((${#apt_missing[@]})); then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "[install] apt-get install ${apt_missing[*]}"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi

# fatbinary only: the CUDA 12 wheels lack it, CUDA 13's accepts sm_70 images.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "$(pin fatbinary_wheel)"
echo "[install] ok: $(.venv/bin/fa2patch --version)"
