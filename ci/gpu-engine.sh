#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# vLLM's real engine on the GPU lab with fa2patch's extension (issues 23 and 25): vLLM 0.26.0, the
# release that pins the lab's torch 2.11.0, runs vllm.LLM offline (ci/vllm-lab/engine_run.py) and
# fa2patch.lab.engine judges it against vLLM's own FA3 and TRITON_ATTN.
#
#   bash ci/gpu-engine.sh prepare   here, with network: .engine/1 (the first part of the stripped
#                                   wheel) and .engine/2 (the rest, the manifest and the ~20 wheels the
#                                   lab lacks: ci/vllm-lab/engine-wheels.txt); each fits one device call
#   LAB_ENGINE=1 bash ci/gpu-lab.sh on the lab: runs `bash ci/gpu-engine.sh lab` after the build
#   ENGINE_SERVE=1 LAB_ENGINE=1 ...  runs vLLM's OpenAI server under the soak instead (serve_run.py,
#                                   issue 40; not yet run on the lab), with ci/vllm-lab/serve-wheels.txt
#   bash ci/gpu-engine.sh lab       on the lab: keeps the parts carried in this call outside the work
#                                   tree (they stay while the machine is warm); once all are there,
#                                   unpacks vLLM, puts build/<arch>/_vllm_fa2_C.abi3.so in its place
#                                   and runs the engine. Results: $OUT/engine/ (engine.log,
#                                   results-MODEL.json and verdict-MODEL.json: five files, as a device
#                                   call returns at most eight); models, runs and their logs stay in
#                                   the stash.
#
# Two device calls back to back (README "GPU lab"): the first carries .engine/1 with the lab's usual
# .lab files and builds; the second carries .engine/2 with LAB_REUSE_BUILD=1 and runs. Exit 3: no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/tools${PYTHONPATH:+:$PYTHONPATH}
out=${OUT:-$PWD/lab-out}
stash=${FA2PATCH_ENGINE_STASH:-/tmp/fa2patch-engine}

case "${1:-}" in
prepare)
    rm -rf .engine && mkdir -p .engine/wheel .engine/1 .engine/2/wheels
    release=$(.venv/bin/python -c 'from fa2patch.lab.engine import RELEASE; print(RELEASE)')
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .engine/wheel "vllm==$release" || exit 2
    .venv/bin/python -m fa2patch.lab.engine pack .engine/wheel/vllm-*.whl .engine/parts || exit 2
    mv .engine/parts/*.part00 .engine/1/ && mv .engine/parts/* .engine/2/ && rm -rf .engine/parts .engine/wheel
    platforms=(); for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 -d .engine/2/wheels -r ci/vllm-lab/engine-wheels.txt \
        -r ci/vllm-lab/serve-wheels.txt || exit 2
    du -sh .engine/1 .engine/2
    exit 0 ;;
lab) ;;
*) echo "usage: bash ci/gpu-engine.sh prepare|lab" >&2; exit 2 ;;
esac

mkdir -p "$out/engine" "$stash/parts"
for part in .engine/1 .engine/2; do
    [ -d "$part" ] || continue
    cp -r "$part"/. "$stash/parts/" && echo "[engine] kept $part in $stash/parts"
done
[ -d "$stash/site/vllm" ] || python3 -m fa2patch.lab.engine assemble "$stash/parts" "$stash/site" ||
    { echo "[engine] not all parts here yet: send the next call"; exit 0; }
arch=$(python3 -m fa2patch.lab.labtools gpu-arch) || { echo "[engine] SKIP: no GPU"; exit 3; }
so=build/$arch/_vllm_fa2_C.abi3.so
[ -f "$so" ] || { echo "[engine] $so missing: build first (ci/gpu-lab.sh does)" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --target "$stash/site" "$stash"/parts/wheels/*.whl || exit 2
cp "$so" "$stash/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
export PYTHONPATH=$stash/site:$PWD/packaging:$PYTHONPATH
if [ "${ENGINE_SERVE:-0}" = 1 ]; then  # the served soak (serve_run.py: not yet run on the lab)
    python3 ci/vllm-lab/serve_run.py "$out/engine" "$stash/work" 2>&1 | tee "$out/engine/serve.log"
    exit "${PIPESTATUS[0]}"
fi
python3 ci/vllm-lab/engine_run.py all "$out/engine" "$stash/work" 2>&1 | tee "$out/engine/engine.log"
status=${PIPESTATUS[0]}
for results in "$out"/engine/results-*.json; do
    verdict=${results/results-/verdict-}
    python3 -m fa2patch.lab.engine judge "$results" >"$verdict" || status=1
    echo "[engine] $(basename "$results"): $(python3 -c 'import json,sys; print("pass" if json.load(open(sys.argv[1]))["pass"] else "FAIL")' "$verdict")"
done
exit "$status"
