#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# torch 2.14.0 (vLLM 0.33's pin) in its own virtual environment, .venv-torch214/, from
# ci/torch-2.14.txt with --no-deps: what CI's check-only build against it needs (ci/gate.sh) and
# the doctor --vllm tests. Idempotent: a stamp holds the sha256 of the requirements file, and a
# second run with the same file installs nothing. The wheels (~2.4 GiB) are kept in
# $FA2PATCH_CACHE/wheels (default ~/.cache/fa2patch/wheels) and installed from there, so a fresh
# clone on the same machine downloads nothing (pip's own cache is not kept on our machines).
set -euo pipefail
cd "$(dirname "$0")/.."
req=ci/torch-2.14.txt
venv=.venv-torch214
stamp=$venv/.fa2patch-installed
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
start=$SECONDS
wheels=${FA2PATCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fa2patch}/wheels
mkdir -p "$wheels"
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
"${pip[@]}" download --no-deps -d "$wheels" -r "$req"   # skips the wheels already there
"${pip[@]}" install --no-deps --no-index --find-links "$wheels" -r "$req"
"$venv/bin/python" -c 'import torch; print("[install] .venv-torch214: torch", torch.__version__,
      "CUDA", torch.version.cuda, "arch list:", torch._C._cuda_getArchFlags())' 2>/dev/null
echo "$want" >"$stamp"
echo "[install] .venv-torch214: $((SECONDS - start)) s"
