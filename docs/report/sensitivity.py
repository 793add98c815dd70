# SPDX-License-Identifier: BSD-3-Clause
"""Sensitivity of the anchors' fit and of a few estimates to model parameters (docs/report-model.md,
"What the anchors do and do not pin"). Needs the sm_70 build (build/sm_70) and the anchors' SASS in
the scratch folder ($FA2PATCH_SCRATCH, else work/scratch). One JSON line per variant:

    PYTHONPATH=tools python docs/report/sensitivity.py > sensitivity.jsonl
"""

import copy
import json
import sys
from pathlib import Path

from fa2patch.common import routes
from fa2patch.common.project import scratch_dir
from fa2patch.common.shapes import parse_shapes
from fa2patch.compile import sass
from fa2patch.compile.extension import launches_of
from fa2patch.model import calibration as c, gqa_route, phases, report, sass_mix, v100model as m
from fa2patch.model.calibration import kernel_sass

ART = Path("build/sm_70/_vllm_fa2_C.abi3.so")
SCRATCH = scratch_dir(Path.cwd())  # $FA2PATCH_SCRATCH, else work/scratch
SCR = {  # the anchor kernels compiled from open source: (their SASS, the part of the function name)
    k["name"]: kernel_sass(k, SCRATCH) for k in m.load_data("anchors.toml")["kernel"] if "sass" in k["mix_source"]
}
FUNCS = {k: next(f for f in sass.parse_sass(p.read_text()) if part in f.name) for k, (p, part) in SCR.items()}
SHAPES = parse_shapes(
    "q=8192,kv=8192,hq=6,hkv=1,d=256;q=8000,kv=128000,hq=6,hkv=1,d=256,scale=0.0625;"
    "q=1,kv=32768,hq=32,hkv=8,d=128;q=1,kv=32768,hq=32,hkv=8,d=128,b=64"
)
base = m.load_v100()
info, PLANS = gqa_route.read_plans(ART, SHAPES)
geometry = report.route_geometry(info, ART) + report.route_geometry(info, ART, routes.GQA)


def run(name, v100, data_edit=None, cal_override=None):
    report.load_v100 = lambda: v100  # kernel_rows reads the parameters here
    rows = report.kernel_rows(ART, "sm_70", launches_of(info), geometry)
    data = copy.deepcopy(m.load_data("anchors.toml"))
    for k in data["kernel"]:
        if k["name"] in FUNCS:
            rec = sass_mix.sass_record(FUNCS[k["name"]], k["warps"], v100)
            k["loop"] = {
                **k["loop"],
                "critical_cycles": rec["loop"]["critical_cycles"],
                "critical_warps": rec["loop"]["critical_warps"],
            }
            k["outside"] = rec["outside"]
    if data_edit:
        data_edit(data)
    cal = c.calibrate(v100, data)
    if cal_override:
        cal = {**cal, "parameters": {**cal["parameters"], **cal_override}}
    out = {
        "variant": name,
        "parameters": {k: round(v, 3) for k, v in cal["parameters"].items()},
        "residuals": [round(a["residual"], 3) for a in cal["anchors"]],
        "loo": [round(a["loo_residual"], 3) for a in cal["anchors"]],
        "estimates": [],
    }
    for card in (m.Card(72, 1530),):
        for s in SHAPES:
            for p in report.predict_routes(s, rows, card, v100, cal, ART, (), PLANS):
                out["estimates"].append(
                    (
                        s.label,
                        p["route"],
                        round(p["calibrated_ms"], 3),
                        round(p["calibrated_ms_low"], 3),
                        round(p["calibrated_ms_high"], 3),
                        round(p["clock_mhz"]),
                    )
                )
    print(json.dumps(out), flush=True)


variants = {
    "as shipped": {},
    "L=400": {"dependent_ldg_l2_hit_cycles": 400},
    "L=600": {"dependent_ldg_l2_hit_cycles": 600},
    "no dependent-HMMA wait": {"dependent_mma884_cycles": base["four_chain_mma884_issue_cycles"] / 4},
    "tensor at peak (8 cycles per mma)": {"four_chain_mma884_issue_cycles": 8.0},
    "clock fixed at the power cap": {"duty_at_boost": 0.0, "duty_at_power_cap": 1e-9},
    "clock at boost up to duty 0.9": {"duty_at_boost": 0.9, "duty_at_power_cap": 0.9004},
}
orig_timing = phases.timing


def shfl_as_issue(ins, v100):
    if phases.base(ins.op) == "SHFL":
        return phases.Timing(None, 0, v100["alu_latency_cycles"])
    return orig_timing(ins, v100)


which = sys.argv[1:] or list(variants)
for name in which:
    run(name, {**base, **variants[name]})
if not sys.argv[1:]:
    run("no fused-CTA cost (cta_cycles = 0, others as fitted)", base, cal_override={"cta_cycles": 0.0})
    phases.timing = shfl_as_issue
    run(
        "SHFL as an issue slot only (no shared-memory pass, ALU latency)",
        base,
        data_edit=lambda d: [k["loop"].update(shuffles=0, shfl=0) for k in d["kernel"] if "loop" in k],
    )
    phases.timing = orig_timing
