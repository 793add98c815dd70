#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# compute-sanitizer memcheck and racecheck of every SM70 kernel family on small shapes, and of
# the GPU suite's bad inputs marked for it (which must be rejected before any SM70 kernel runs),
# on the lab machine; tests/gpu/sanitize_cases.py lists the cases.
# memcheck runs each case in full (op, reference, checks); racecheck the op alone.
# Run after ci/gpu-lab.sh has built build/sm_90. Writes $OUT/sanitize-<tool>.log per tool and
# $OUT/sanitize-summary.json (per case and tool: family, exit status, verdict).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/lab-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/tools${PYTHONPATH:+:$PYTHONPATH} FA2PATCH_FORCE_SM70=1
so=build/sm_90/_vllm_fa2_C.abi3.so
# family|harness|spec, one case a line: small shapes of every kernel family, and the GPU suite's
# bad inputs that it marks for the sanitizer (tests/gpu/sanitize_cases.py).
# The decisions (which cases, each run's verdict, the summary) are tools/fa2patch/lab/labtools.py's.
lab() { python3 -m fa2patch.lab.labtools "$@"; }
mapfile -t cases < <(python3 tests/gpu/sanitize_cases.py)
[ ${#cases[@]} -gt 0 ] || { echo "[sanitize] tests/gpu/sanitize_cases.py listed no case" >&2; exit 2; }
# SANITIZE_FAMILIES (a Python regular expression) keeps only the cases of families it matches whole.
if [ -n "${SANITIZE_FAMILIES:-}" ]; then
  mapfile -t cases < <(printf '%s\n' "${cases[@]}" | lab sanitize-filter "$SANITIZE_FAMILIES")
fi
results=$out/sanitize-results.jsonl
: >"$results"
run_one() {  # tool index
  local tool=$1 i=$2 harness spec
  IFS='|' read -r _ harness spec <<<"${cases[$2]}"
  local log=$out/sanitize-$tool-$i.log
  # racecheck runs the op alone: on the H200 it fails inside later cuBLAS kernels of the
  # reference ("failed to handle a hardware exception"), which are not under test.
  local op_only=0; [ "$tool" = racecheck ] && op_only=1
  FA2PATCH_OP_ONLY=$op_only compute-sanitizer --tool "$tool" --error-exitcode 9 --kernel-name kns=sm70 \
      python3 "$harness" "$so" "$spec" >"$log" 2>&1
  lab sanitize-record --tool "$tool" --case "${cases[$2]}" --rc $? --log "$log" --out "$results"
}
jobs=${SANITIZE_JOBS:-4}
for tool in memcheck racecheck; do
  for i in "${!cases[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_one "$tool" "$i" &
  done
done
wait
for tool in memcheck racecheck; do cat "$out"/sanitize-$tool-*.log >"$out/sanitize-$tool.log"; rm -f "$out"/sanitize-$tool-*.log; done
lab sanitize-summary "$results" "$out/sanitize-summary.json"
