#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# vLLM's own FA2 kernel test on the GPU lab, through vLLM's real flash_attn_interface.py, for each
# supported vLLM release whose sources are carried (packaging/vllm-releases.toml).
#
#   bash ci/gpu-vllm.sh prepare [VERSION ...]   here, with network: writes .lab/vllm-src-VERSION.tar.gz
#                                   per release (default: the primary one and 0.33.0, the source-build
#                                   release: its Python sources, its FA2 kernel test, and the CMake
#                                   files LAB_VLLM_CMAKE=1 builds with; ~10 MB each) and .lab/numpy-*.whl
#                                   (vLLM's test helpers import numpy)
#   LAB_VLLM=1 bash ci/gpu-lab.sh   on the lab: after the lab build, runs `bash ci/gpu-vllm.sh run`
#   bash ci/gpu-vllm.sh collect     anywhere: the same set-up, then only collects the cases (the
#                                   CPU test of this script)
# FA2PATCH_VLLM_ARCHIVE (one archive) replaces the .lab/vllm-src-*.tar.gz found, and
# FA2PATCH_VLLM_EXTENSION the extension (default: build/<this GPU's arch>/_vllm_fa2_C.abi3.so).
#
# `run` unpacks each release's sources, puts build/<arch>/_vllm_fa2_C.abi3.so where vLLM's build installs
# it (vllm/vllm_flash_attn/), and runs with the SM70 kernels forced (FA2PATCH_FORCE_SM70=1):
# vLLM's tests/kernels/attention/test_flash_attn.py with one edit, DTYPES = [torch.float16] (V100
# has no bf16 tensor cores; vLLM maps bf16 to fp16 below capability 8.0 and our ops refuse bf16),
# ci/vllm-lab/test_kv_cache_views.py (vLLM's KV-cache views through the same interface) and
# ci/vllm-lab/test_per_request_backend.py (fa2patch's V100 backend on the release's own metadata).
# It fails unless, for every release, vLLM's interface imported our extension from there (nothing
# loaded it by hand), every FA2 fp16 case of vLLM's test ran and passed, and every KV-view case passed.
# Results: $OUT/vllm-summary-VERSION.json, $OUT/vllm-junit-VERSION.xml, $OUT/vllm-pytest-VERSION.log.
# Exit 3: no GPU here.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export PYTHONPATH=$PWD/tools${PYTHONPATH:+:$PYTHONPATH}
# The decisions (the archive's contents, the fp16 edit, the verdicts and the expected case counts) are
# tools/fa2patch/lab/labtools.py's; this script orchestrates.
lab() { python3 -m fa2patch.lab.labtools "$@"; }
out=${OUT:-$PWD/lab-out}

case "${1:-}" in
prepare)
    mkdir -p .lab
    shift
    versions=("$@")
    [ ${#versions[@]} -gt 0 ] || read -ra versions <<<"$(.venv/bin/python -m fa2patch.lab.labtools vllm-versions)"
    for v in "${versions[@]}"; do
        .venv/bin/python -m fa2patch.lab.labtools vllm-prepare ".lab/vllm-src-$v.tar.gz" --release "$v" || exit 2
    done
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
if [ -n "${FA2PATCH_VLLM_ARCHIVE:-}" ]; then archives=("$FA2PATCH_VLLM_ARCHIVE"); else archives=(.lab/vllm-src-*.tar.gz); fi
[ -f "${archives[0]}" ] || { echo "[vllm] ${archives[0]} missing: run 'bash ci/gpu-vllm.sh prepare' where there is network" >&2; exit 2; }
so=${FA2PATCH_VLLM_EXTENSION:-build/$arch/_vllm_fa2_C.abi3.so}
[ -f "$so" ] || { echo "[vllm] $so missing: build for this GPU first (ci/gpu-lab.sh does)" >&2; exit 2; }

work=$(mktemp -d /tmp/fa2patch-vllm.XXXXXX)
trap 'rm -rf "$work"' EXIT
# One release: its sources from $1, our extension where vLLM installs it, vLLM's test; the verdict.
one() {
    local archive=$1 dir src run version summary pytest_rc
    dir=$(mktemp -d "$work/release.XXXXXX")
    tar xzf "$archive" -C "$dir" || return 2
    src=$(echo "$dir"/vllm-*)
    version=${src##*/vllm-}
    summary=$out/vllm-summary-$version.json
    cp "$so" "$src/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
    run=$dir/run
    mkdir "$run"
    cp ci/vllm-lab/conftest.py ci/vllm-lab/test_kv_cache_views.py ci/vllm-lab/test_per_request_backend.py \
        tests/vllm/vllm_stubs.py "$run/"
    lab vllm-fp16-test "$src/tests/kernels/attention/test_flash_attn.py" "$run/test_flash_attn.py" || return 2
    echo "[vllm] vLLM $version, extension $so -> vllm/vllm_flash_attn/, SM70 kernels forced"
    runpytest() {
        (cd "$run" && FA2PATCH_FORCE_SM70=1 FA2PATCH_VLLM_SRC="$src" FA2PATCH_VLLM_SUMMARY="$summary" \
            PYTHONPATH="$run:$repo/packaging${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -p no:cacheprovider "$@" \
            test_flash_attn.py test_kv_cache_views.py test_per_request_backend.py)
    }
    if [ "$mode" = collect ]; then
        runpytest -q --collect-only >"$out/vllm-collect-$version.log" 2>&1 || { tail -20 "$out/vllm-collect-$version.log"; return 1; }
        lab vllm-verdict "$summary" --collected
        return $?
    fi
    runpytest -q -rfE --junitxml "$out/vllm-junit-$version.xml" >"$out/vllm-pytest-$version.log" 2>&1
    pytest_rc=$?
    tail -5 "$out/vllm-pytest-$version.log"
    lab vllm-verdict "$summary" --pytest-rc $pytest_rc
}
status=0
for archive in "${archives[@]}"; do
    one "$archive" || status=1
done
exit $status
