#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck of the SM70 kernels on small shapes (lab machine).
# Run after ci/gpu-lab.sh has built build/sm_90 (or let it build: SANITIZE_BUILD=1).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/lab-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/tools${PYTHONPATH:+:$PYTHONPATH} FA2PATCH_FORCE_SM70=1
so=build/sm_90/_vllm_fa2_C.abi3.so
cases=(
  '{"seqlens": [[1, 1], [37, 90], [0, 5], [5, 0]], "hq": 4, "hkv": 2, "d": 64, "causal": true}'
  '{"seqlens": [[1, 40], [3, 77]], "hq": 8, "hkv": 1, "d": 128, "page_size": 16, "window": [16, 0]}'
  '{"seqlens": [[70, 70]], "hq": 6, "hkv": 1, "d": 256, "causal": true, "softcap": 30.0, "alibi": true}'
)
status=0
for tool in memcheck racecheck; do
  for spec in "${cases[@]}"; do
    log="$out/sanitize-$tool.log"
    echo "[sanitize] $tool $spec" | tee -a "$log"
    compute-sanitizer --tool "$tool" --error-exitcode 9 --kernel-name kns=flash_fwd_sm70 \
        python3 tests/gpu/sm70_cases.py "$so" "$spec" >>"$log" 2>&1
    rc=$?; tail -2 "$log"; [ $rc = 0 ] || status=1
  done
done
echo "[sanitize] status $status"
exit $status
