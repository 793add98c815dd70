#!/usr/bin/env bash
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
out=${OUT:-$PWD/lab-out}
archive=${FA2PATCH_VLLM_ARCHIVE:-.lab/vllm-src.tar.gz}

case "${1:-}" in
prepare)
    mkdir -p .lab
    .venv/bin/python - "$archive" <<'PY' || exit 2
import sys, tarfile, tempfile
from pathlib import Path
from fa2patch.package import extract_vllm_sources
from fa2patch.project import Project
with tempfile.TemporaryDirectory() as tmp:
    src = extract_vllm_sources(Project.find(), Path(tmp), ("tests/kernels/attention/test_flash_attn.py",
                               "CMakeLists.txt", "cmake/utils.cmake", "cmake/external_projects/vllm_flash_attn.cmake"))
    with tarfile.open(sys.argv[1], "w:gz") as tar:
        tar.add(src, arcname=src.name)
print(f"[vllm] {sys.argv[1]}: {Path(sys.argv[1]).stat().st_size / 2**20:.1f} MiB ({src.name})")
PY
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 -d .lab numpy || exit 2
    du -sh .lab
    exit 0 ;;
run|collect) mode=$1 ;;
*) echo "usage: bash ci/gpu-vllm.sh prepare|run|collect" >&2; exit 2 ;;
esac

mkdir -p "$out"
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null
rc=$?
[ $rc = 0 ] || [ $rc = 3 ] || { echo "[vllm] $(command -v python3) cannot import torch" >&2; exit 2; }
if [ $rc = 3 ] && [ "$mode" = run ]; then
    echo "[vllm] SKIP: no GPU on this machine (vLLM's kernel test needs one)"; exit 3
fi
[ -f "$archive" ] || { echo "[vllm] $archive missing: run 'bash ci/gpu-vllm.sh prepare' where there is network" >&2; exit 2; }
if [ -n "${FA2PATCH_VLLM_EXTENSION:-}" ]; then
    so=$FA2PATCH_VLLM_EXTENSION
else
    so=build/$(python3 -c 'import torch; print("sm_%d%d" % torch.cuda.get_device_capability())')/_vllm_fa2_C.abi3.so
fi
[ -f "$so" ] || { echo "[vllm] $so missing: build for this GPU first (ci/gpu-lab.sh does)" >&2; exit 2; }

work=$(mktemp -d /tmp/fa2patch-vllm.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar xzf "$archive" -C "$work" || exit 2
src=$(echo "$work"/vllm-*)
cp "$so" "$src/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
run=$work/run
mkdir "$run"
cp ci/vllm-lab/conftest.py ci/vllm-lab/test_kv_cache_views.py tests/vllm_stubs.py "$run/"
python3 - "$src/tests/kernels/attention/test_flash_attn.py" "$run/test_flash_attn.py" <<'PY' || exit 2
import sys
text = open(sys.argv[1]).read()
old, new = "DTYPES = [torch.bfloat16]\n", "DTYPES = [torch.float16]\n"
if text.count(old) != 1:
    sys.exit(f"{sys.argv[1]}: expected one line {old!r}, found {text.count(old)}: vLLM's test changed")
open(sys.argv[2], "w").write(text.replace(old, new))
PY

echo "[vllm] vLLM $(basename "$src"), extension $so -> vllm/vllm_flash_attn/, SM70 kernels forced"
runpytest() {
    (cd "$run" && FA2PATCH_FORCE_SM70=1 FA2PATCH_VLLM_SRC="$src" FA2PATCH_VLLM_SUMMARY="$out/vllm-summary.json" \
        PYTHONPATH="$run${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -p no:cacheprovider "$@" \
        test_flash_attn.py test_kv_cache_views.py)
}
if [ "$mode" = collect ]; then
    runpytest -q --collect-only >"$out/vllm-collect.log" 2>&1 || { tail -20 "$out/vllm-collect.log"; exit 1; }
    python3 - "$out/vllm-summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
fa2 = [c for c in s["collected"] if c["test"] == "test_varlen_with_paged_kv" and c["fa_version"] == 2
       and c["q_dtype"] == "None" and c["dtype"] == "torch.float16"]
views = [c for c in s["collected"] if c["test"] == "test_vllm_kv_cache_views"]
print(f"[vllm] collected {len(s['collected'])}: {len(fa2)} vLLM FA2 fp16 cases, {len(views)} KV-view cases; "
      f"extension {s['extension']}")
sys.exit(0 if (len(fa2), len(views)) == (160, 36) and s["extension"] == s["expected_extension"]
         and s["imported_by_vllm_interface"] and s["fa2patch_ops"] else 1)
PY
    exit $?
fi
runpytest -q -rfE --junitxml "$out/vllm-junit.xml" >"$out/vllm-pytest.log" 2>&1
pytest_rc=$?
tail -5 "$out/vllm-pytest.log"
python3 - "$out/vllm-summary.json" "$pytest_rc" <<'PY'
import json, sys
s, rc = json.load(open(sys.argv[1])), int(sys.argv[2])
cases = s["cases"]
fa2 = [c for c in cases if c["test"] == "test_varlen_with_paged_kv" and c["fa_version"] == 2
       and c["q_dtype"] == "None"]
views = [c for c in cases if c["test"] == "test_vllm_kv_cache_views"]
# vLLM 0.33.0's test: 2 use_out x 2 seq_lens x 2 num_heads x 5 head sizes x 2 windows x 2 num_blocks
# fp16 FA2 cases without a quantized query; ours: 2 x 3 x 3 x 2 KV-view cases.
checks = {
    "vLLM's interface imported the extension from vllm/vllm_flash_attn/":
        s["imported_by_vllm_interface"] and s["extension"] == s["expected_extension"],
    "the operators are fa2patch's (build_info)": s["fa2patch_ops"],
    "SM70 kernels forced": s["force_sm70"] == "1",
    f"vLLM FA2 fp16 cases: 160 passed (got {sum(c['outcome'] == 'passed' for c in fa2)} of {len(fa2)})":
        len(fa2) == 160 and all(c["outcome"] == "passed" for c in fa2) and all(c["dtype"] == "torch.float16" for c in fa2),
    f"KV-cache view cases: 36 passed (got {sum(c['outcome'] == 'passed' for c in views)} of {len(views)})":
        len(views) == 36 and all(c["outcome"] == "passed" for c in views),
    "no failure anywhere": rc == 0 and not [c for c in cases if c["outcome"] == "failed"],
}
s["verdict"] = {k: bool(v) for k, v in checks.items()}
s["ok"] = all(checks.values())
json.dump(s, open(sys.argv[1], "w"), indent=1)
for k, v in checks.items():
    print(f"[vllm] {'ok  ' if v else 'FAIL'} {k}")
sys.exit(0 if s["ok"] else 1)
PY
