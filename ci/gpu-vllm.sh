#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# vLLM's own FA2 kernel test on the GPU lab, through vLLM's real flash_attn_interface.py.
#
#   bash ci/gpu-vllm.sh prepare     here, with network: writes .lab/vllm-src.tar.gz (the tested
#                                   vLLM release's Python sources, its FA2 kernel test, and the CMake
#                                   files LAB_VLLM_CMAKE=1 builds with; ~10 MB) and .lab/numpy-*.whl
#                                   (vLLM's test helpers import numpy)
#   LAB_VLLM=1 bash ci/gpu-lab.sh   on the lab: after the lab build, runs `bash ci/gpu-vllm.sh run`
#   bash ci/gpu-vllm.sh collect     anywhere: the same set-up, then only collects the cases (the
#                                   CPU test of this script)
# FA2PATCH_VLLM_ARCHIVE and FA2PATCH_VLLM_EXTENSION override the archive and the extension
# (default: build/<this GPU's arch>/_vllm_fa2_C.abi3.so).
#
# `run` unpacks vLLM's sources, puts build/<arch>/_vllm_fa2_C.abi3.so where vLLM's build installs
# it (vllm/vllm_flash_attn/), and runs with the SM70 kernels forced (FA2PATCH_FORCE_SM70=1):
# vLLM's tests/kernels/attention/test_flash_attn.py with one edit, DTYPES = [torch.float16] (V100
# has no bf16 tensor cores; vLLM maps bf16 to fp16 below capability 8.0 and our ops refuse bf16),
# and ci/vllm-lab/test_kv_cache_views.py (vLLM's KV-cache views through the same interface).
# It fails unless vLLM's interface imported our extension from there (nothing loaded it by hand),
# every FA2 fp16 case of vLLM's test ran and passed, and every KV-view case passed.
# Results: $OUT/vllm-summary.json, $OUT/vllm-junit.xml, $OUT/vllm-pytest.log. Exit 3: no GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/tools${PYTHONPATH:+:$PYTHONPATH}
# The decisions (the archive's contents, the fp16 edit, the verdicts and the expected case counts) are
# tools/fa2patch/lab/labtools.py's; this script orchestrates.
lab() { python3 -m fa2patch.lab.labtools "$@"; }
out=${OUT:-$PWD/lab-out}
archive=${FA2PATCH_VLLM_ARCHIVE:-.lab/vllm-src.tar.gz}

case "${1:-}" in
prepare)
    mkdir -p .lab
    .venv/bin/python -m fa2patch.lab.labtools vllm-prepare "$archive" || exit 2
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 -d .lab numpy || exit 2
    du -sh .lab
    exit 0 ;;
run|collect) mode=$1 ;;
*) echo "usage: bash ci/gpu-vllm.sh prepare|run|collect" >&2; exit 2 ;;
esac

mkdir -p "$out"
arch=$(lab gpu-arch 2>/dev/null)  # exit 3: no GPU
rc=$?
[ $rc = 0 ] || [ $rc = 3 ] || { echo "[vllm] $(command -v python3) cannot import torch" >&2; exit 2; }
if [ $rc = 3 ] && [ "$mode" = run ]; then
    echo "[vllm] SKIP: no GPU on this machine (vLLM's kernel test needs one)"; exit 3
fi
[ -f "$archive" ] || { echo "[vllm] $archive missing: run 'bash ci/gpu-vllm.sh prepare' where there is network" >&2; exit 2; }
so=${FA2PATCH_VLLM_EXTENSION:-build/$arch/_vllm_fa2_C.abi3.so}
[ -f "$so" ] || { echo "[vllm] $so missing: build for this GPU first (ci/gpu-lab.sh does)" >&2; exit 2; }

work=$(mktemp -d /tmp/fa2patch-vllm.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar xzf "$archive" -C "$work" || exit 2
src=$(echo "$work"/vllm-*)
cp "$so" "$src/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
run=$work/run
mkdir "$run"
cp ci/vllm-lab/conftest.py ci/vllm-lab/test_kv_cache_views.py tests/vllm/vllm_stubs.py "$run/"
lab vllm-fp16-test "$src/tests/kernels/attention/test_flash_attn.py" "$run/test_flash_attn.py" || exit 2

echo "[vllm] vLLM $(basename "$src"), extension $so -> vllm/vllm_flash_attn/, SM70 kernels forced"
runpytest() {
    (cd "$run" && FA2PATCH_FORCE_SM70=1 FA2PATCH_VLLM_SRC="$src" FA2PATCH_VLLM_SUMMARY="$out/vllm-summary.json" \
        PYTHONPATH="$run${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -p no:cacheprovider "$@" \
        test_flash_attn.py test_kv_cache_views.py)
}
if [ "$mode" = collect ]; then
    runpytest -q --collect-only >"$out/vllm-collect.log" 2>&1 || { tail -20 "$out/vllm-collect.log"; exit 1; }
    lab vllm-verdict "$out/vllm-summary.json" --collected
    exit $?
fi
runpytest -q -rfE --junitxml "$out/vllm-junit.xml" >"$out/vllm-pytest.log" 2>&1
pytest_rc=$?
tail -5 "$out/vllm-pytest.log"
lab vllm-verdict "$out/vllm-summary.json" --pytest-rc $pytest_rc
