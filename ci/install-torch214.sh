#!/usr/bin/env bash
# torch 2.14.0 (vLLM 0.33's pin) in its own virtual environment, .venv-torch214/, from
# ci/torch-2.14.txt with --no-deps: what CI's check-only build against it needs (ci/gate.sh) and
# the doctor --vllm tests. Idempotent: a stamp holds the sha256 of the requirements file, and a
# second run with the same file installs nothing. pip's cache (~/.cache/pip) keeps the ~2.4 GiB
# of wheels between runs on the same machine.
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
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$req"
"$venv/bin/python" -c 'import torch; print("[install] .venv-torch214: torch", torch.__version__,
      "CUDA", torch.version.cuda, "arch list:", torch._C._cuda_getArchFlags())' 2>/dev/null
echo "$want" >"$stamp"
echo "[install] .venv-torch214: $((SECONDS - start)) s"
