#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The patch-integrity gate (README command 1): install, fetch the pristine baseline, replay
# the series from it into a fresh workspace, check the lock/patches/workspace agreement,
# build _vllm_fa2_C for sm_70 once, verify its schemas, hygiene and kernel budgets, and package
# the wheel for vLLM (dist/). The builds against the other supported vLLM releases' torch are
# CI's test half (tests/vllm/test_compat_builds.py): they cost the first command nothing.
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
step build --arch sm_70 --workspace "$ws"
step verify --arch sm_70
step package --arch sm_70 --workspace "$ws"
echo "[gate] passed in $SECONDS s"
