#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The GPU lab run (H200, nvcc 13, no network): replay from the carried sdist, build the sm_90
# lab variant with nvcc, verify it, smoke it and run tests/gpu. Carry `.lab/` with the sdist
# and the pure-Python wheels the lab machine lacks (gitpython, gitdb, smmap, tomlkit; nvidia-ml-py
# for bench's and tune's NVML samples):
#   python -m pip download --no-deps --only-binary=:all: -d .lab gitpython gitdb smmap tomlkit nvidia-ml-py
#   .venv/bin/fa2patch fetch && cp ~/.cache/fa2patch/archives/"$(.venv/bin/python -m fa2patch.lab.labtools sdist-name)" .lab/
# Results go to $OUT (or ./lab-out): logs, each pytest session's log and JUnit XML, gpu-summary.json.
# Switches: LAB_REUSE_BUILD=1 keeps an existing build/sm_90 (a warm machine), LAB_TESTS=0 skips
# tests/gpu, LAB_PYTEST_ARGS adds pytest arguments, split as a shell splits words ("-m slow",
# "-k 'a or b'"), LAB_TEST_PATHS replaces tests/gpu (files in the order they should run),
# LAB_PYTEST_TIMEOUT=S interrupts pytest after S seconds (the tests that finished are still
# reported: a run that must fit one device call),
# FA2PATCH_SLOW=1 adds the slow cases, LAB_SANITIZE=1 runs ci/gpu-sanitize.sh and
# merges its verdicts into gpu-summary.json, LAB_BENCH=1 runs `fa2patch bench` (default sweep; LAB_BENCH_ARGS adds arguments),
# LAB_VLLM=1 runs vLLM's own FA2 kernel test through vLLM's interface (ci/gpu-vllm.sh; carry
# .lab/vllm-src-*.tar.gz and the numpy wheel from `bash ci/gpu-vllm.sh prepare`).
# LAB_ENGINE=1 runs vLLM's real engine on fa2patch (ci/gpu-engine.sh: carry .engine/1, then .engine/2
# in the next call, from `bash ci/gpu-engine.sh prepare`).
# LAB_VLLM_CMAKE=1 builds the extension through vLLM's own CMake instead of `fa2patch build`: the
# `fa2patch package --vllm-src` tree, vLLM's real vllm_flash_attn.cmake under the FA2 part of its
# top-level CMakeLists.txt (from .lab/vllm-src-0.33.0.tar.gz, the source-build release), nvcc for sm_90 (TORCH_CUDA_ARCH_LIST=9.0),
# installed as vLLM's setup.py installs it (tools/fa2patch/vllm/cmake.py); `fa2patch verify
# --artifact` checks the installed file, and build/sm_90 then holds it for smoke, tests/gpu and
# LAB_VLLM. Needs cmake >= 3.26; $out/vllm-cmake.json holds the nvcc commands and their check.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/lab-out}
mkdir -p "$out"
if compgen -G ".lab/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/fa2patch-site .lab/*.whl || exit 2
    export PYTHONPATH=/tmp/fa2patch-site
fi
export PYTHONPATH=$PWD/tools${PYTHONPATH:+:$PYTHONPATH}
lab() { python3 -m fa2patch.lab.labtools "$@"; }
lab banner
# The lab image's compilers (/opt/gcc) link libstdc++ statically, which breaks the extension (verify
# checks it): build with the system compiler that nvcc uses. CMake passes $CUDAHOSTCXX to nvcc as
# -ccbin, which is how vLLM's CMake reached /opt/gcc in the run of 2026-12-01 (run3).
unset CXX CC CUDAHOSTCXX NVCC_CCBIN
export FA2PATCH_CACHE=${FA2PATCH_CACHE:-/tmp/fa2patch-cache} FA2PATCH_ROOT=$PWD
f() { echo "[lab] fa2patch $*"; python3 -m fa2patch "$@"; }
# The decisions (the sdist's name, the summaries) are tools/fa2patch/lab/labtools.py's; this script orchestrates.
status=0
if [ "${LAB_REUSE_BUILD:-0}" = 1 ] && [ -f build/sm_90/manifest.json ]; then
    echo "[lab] reusing build/sm_90"
else
    name=$(lab sdist-name) || exit 2
    sdist=(); [ -f ".lab/$name" ] && sdist=(--sdist ".lab/$name")
    f fetch "${sdist[@]}" || exit 2
    f replay --workspace work/lab --force || exit 1
    if [ "${LAB_VLLM_CMAKE:-0}" = 1 ]; then
        [ -n "${CUDA_HOME:-}" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || export CUDA_HOME=/usr/local/cuda
        echo "[lab] vLLM's CMake builds the --vllm-src tree for sm_90 (nvcc)"
        python3 -m fa2patch.vllm.cmake lab --workspace work/lab --vllm-archive "${FA2PATCH_VLLM_ARCHIVE:-.lab/vllm-src-0.33.0.tar.gz}" \
            --work work/vllm-cmake --arch sm_90 --lab-build-dir build/sm_90 --python "$(command -v python3)" \
            --summary "$out/vllm-cmake.json" >"$out/build.log" 2>&1
        rc=$?; tail -5 "$out/build.log"; [ $rc = 0 ] || exit 1
        f verify --arch sm_90 --artifact work/vllm-cmake/install/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so \
            --workspace work/lab 2>&1 | tee "$out/verify.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
    else
        f build --arch sm_90 --cuda-compiler nvcc --workspace work/lab >"$out/build.log" 2>&1
        rc=$?; tail -5 "$out/build.log"; [ $rc = 0 ] || exit 1
        f verify --arch sm_90 2>&1 | tee "$out/verify.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
    fi
    f smoke --arch sm_90 2>&1 | tee "$out/smoke.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "${LAB_TESTS:-1}" = 1 ]; then
    limit=(); [ -n "${LAB_PYTEST_TIMEOUT:-}" ] && limit=(timeout -s INT "$LAB_PYTEST_TIMEOUT")
    words=$(lab shell-words "${LAB_PYTEST_ARGS:-}") || exit 2   # quoted words stay one argument
    extra=(); [ -z "$words" ] || mapfile -t extra <<<"$words"
    # One pytest session per group of test files, all at once (labtools.session_groups says why);
    # LAB_TEST_PATHS: one session over the files given, in their order.
    if [ -n "${LAB_TEST_PATHS:-}" ]; then groups=("$LAB_TEST_PATHS"); else mapfile -t groups < <(lab test-groups tests/gpu); fi
    pids=(); parts=()
    for i in "${!groups[@]}"; do
        echo "[lab] pytest session $i: ${groups[$i]}"
        FA2PATCH_REQUIRE_GPU_BUILD=1 FA2PATCH_GPU_SUMMARY="$out/gpu-summary-$i.json" \
            "${limit[@]}" python3 -m pytest -q -rfEs -p no:cacheprovider "${extra[@]}" ${groups[$i]} \
            --junitxml "$out/gpu-junit-$i.xml" >"$out/pytest-$i.log" 2>&1 &
        pids+=($!); parts+=("$out/gpu-summary-$i.json")
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}"; rc=$?
        echo "[lab] pytest session $i: exit $rc"; tail -3 "$out/pytest-$i.log"
        [ $rc = 0 ] || [ $rc = 5 ] || status=1  # 5: nothing selected in this session (-k)
    done
    lab merge-summaries "$out/gpu-summary.json" "${parts[@]}" || status=1
fi
if [ "${LAB_SANITIZE:-0}" = 1 ]; then
    OUT=$out bash ci/gpu-sanitize.sh || status=1
    [ -f "$out/gpu-summary.json" ] && lab merge-sanitizer "$out/gpu-summary.json" "$out/sanitize-summary.json"
fi
if [ "${LAB_BENCH:-0}" = 1 ]; then
    f bench --arch sm_90 ${LAB_BENCH_ARGS:-} --json-file "$out/bench.json" 2>&1 | tee "$out/bench.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "${LAB_VLLM:-0}" = 1 ]; then
    OUT=$out bash ci/gpu-vllm.sh run || status=1
fi
if [ "${LAB_ENGINE:-0}" = 1 ]; then
    OUT=$out bash ci/gpu-engine.sh lab || status=1
fi
echo "[lab] status $status"
exit $status
