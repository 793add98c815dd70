#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A torch of another supported vLLM release in its own virtual environment, from a requirements
# file installed with --no-deps: ci/torch-2.14.txt -> .venv-torch214/ (vLLM 0.33's torch),
# ci/torch-2.9.1.txt -> .venv-torch291/ (vLLM 0.16.0's): what CI's compatibility builds
# (tests/vllm/test_compat_builds.py) and the doctor --vllm tests need. Idempotent: a stamp holds the
# sha256 of the requirements file, and a second run with the same file installs nothing. The wheels
# are kept in $FA2PATCH_CACHE/wheels/<torch-version> (default ~/.cache/fa2patch/wheels/...) and installed
# from there, so a fresh clone on the same machine downloads nothing (pip's own cache is not kept on our
# machines); a folder per requirements file, so that ci/test.sh can run two of these at once.
#   bash ci/install-torch.sh ci/torch-2.14.txt
set -euo pipefail
cd "$(dirname "$0")/.."
req=${1:?usage: bash ci/install-torch.sh ci/torch-<version>.txt}
[ -f "$req" ] || { echo "[install] $req: no such requirements file" >&2; exit 2; }
version=$(basename "$req" .txt)          # torch-2.14 / torch-2.9.1
venv=.venv-${version//[.-]/}             # .venv-torch214 / .venv-torch291
stamp=$venv/.fa2patch-installed
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
start=$SECONDS
wheels=${FA2PATCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fa2patch}/wheels/$version
mkdir -p "$wheels"
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
"${pip[@]}" download --no-deps -d "$wheels" -r "$req"   # skips the wheels already there
"${pip[@]}" install --no-deps --no-index --find-links "$wheels" -r "$req"
"$venv/bin/python" -c 'import sys, torch; print("[install]", sys.argv[1] + ": torch", torch.__version__,
      "CUDA", torch.version.cuda, "arch list:", torch._C._cuda_getArchFlags())' "$venv" 2>/dev/null
echo "$want" >"$stamp"
echo "[install] $venv: $((SECONDS - start)) s"
