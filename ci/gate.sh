#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The patch-integrity gate (README command 1): install, fetch the pristine baseline, replay
# the series from it into a fresh workspace, check the lock/patches/workspace agreement,
# build _vllm_fa2_C for sm_70, verify its schemas, hygiene and kernel budgets, and package
# the wheel for vLLM (dist/). Before that, the same build and verify against torch 2.14.0 (the
# torch vLLM 0.33 pins; .venv-torch214/ from ci/install.sh): the package index's 2.14.0 has no
# sm_70 kernels, so that build is check-only and `package` must refuse it.
# Uses its own workspace (work/gate), so a developer's workspace is never touched.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh

fa2patch=.venv/bin/fa2patch
ws=work/gate
step() {
    local start=$SECONDS
    echo "[gate] fa2patch $*"
    "$fa2patch" "$@"
    echo "[gate] fa2patch $1: $((SECONDS - start)) s"
}
step doctor
step fetch
step replay --workspace "$ws" --force
step check --workspace "$ws"
step build --arch sm_70 --workspace "$ws" --python .venv-torch214/bin/python --allow-torch-without-sm70
step verify --arch sm_70
echo "[gate] fa2patch package --arch sm_70 (must refuse the check-only build)"
if "$fa2patch" package --arch sm_70 --workspace "$ws" 2>work/gate-refusal.log; then
    echo "[gate] package accepted a check-only build" >&2; exit 1
fi
grep -q "a check-only build is not packaged" work/gate-refusal.log || { cat work/gate-refusal.log >&2; exit 1; }
step build --arch sm_70 --workspace "$ws"
step verify --arch sm_70
step package --arch sm_70 --workspace "$ws"
echo "[gate] passed"
