#!/usr/bin/env bash
# Install everything fa2patch needs, from Debian's packages and the Python package index.
# Idempotent: a second run installs nothing new. Creates the virtual environment .venv/.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_missing=()
command -v clang++-22 >/dev/null || apt_missing+=(clang-22)
command -v ccache >/dev/null || apt_missing+=(ccache)
command -v git >/dev/null || apt_missing+=(git)
command -v c++filt >/dev/null || apt_missing+=(binutils)
if ((${#apt_missing[@]})); then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "[install] apt-get install ${apt_missing[*]}"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
# torch 2.9.1 (CUDA 12.8 build) and the CUDA 12.8 wheels: see the `build` extra in pyproject.toml.
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[build,test]'
# fatbinary only: the CUDA 12 wheels lack it, CUDA 13's accepts sm_70 images (baseline.lock).
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps nvidia-cuda-nvcc==13.0.88
echo "[install] ok: $(.venv/bin/fa2patch --version)"
