# SPDX-License-Identifier: BSD-3-Clause
"""`report --anchors`: users' bench files as calibration anchors (user_anchors.py), on the CPU with
synthetic kernel rows: the fit recovers known parameters from anchors that are the model's own
times at them, a residual checked by hand, the measured clock, and the refusals."""

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
from test_report_model import synthetic

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.routes import EXACT
from fa2patch.common.shapes import Shape
from fa2patch.model import calibration as c, user_anchors as u
from fa2patch.model.report import route_launches
from fa2patch.model.v100model import Calibration, Card, LoopMix, estimate_route, load_v100

ARTIFACT = Path("/nowhere/_vllm_fa2_C.abi3.so")
V100 = load_v100()
LATENCY = V100["dependent_ldg_l2_hit_cycles"]
TRUE = Calibration(1.3, 20000)


def kernel_rows():
    """One sm70-dense kernel for d <= 64: 8 warps (two per scheduler), one CTA per SM, an
    iteration of 600 instructions (1,200 issue cycles for two warps), no code outside the loop
    recorded (one load round before the first iteration)."""
    mix = {**vars(LoopMix()), "instructions": 600}
    geo = {
        "kernel": "flash_fwd_sm70_kernel<64>",
        "threads": 256,
        "dynamic_smem": 1,
        "route": EXACT,
        "head_dim": 64,
        "rows_per_cta": 64,
        "keys_per_iteration": 32,
        "warps": 8,
    }
    return [
        {
            "kernel": "k64",
            "geometry": geo,
            "occupancy": {"blocks_per_sm": 1},
            "hot_loops": [{"mix": {"hmma": 1}, "model_mix": mix, "cycles": LoopMix(**mix).pipes(2, V100)}],
        }
    ]


ROWS = kernel_rows()


def launches_for(shape, route, card):
    return route_launches(shape, ROWS, route, card, ARTIFACT)


def case(shape: Shape, ms: float | None, clock: float | None = 1350.0, **extra) -> dict:
    out = {"route": EXACT, "shape": asdict(shape), "label": shape.label, **extra}
    if ms is not None:
        out.update(median_ms=ms, min_ms=ms, max_ms=ms)
    if clock is not None:
        out["clocks"] = {"samples": 40, "sm_clock_mhz": {"min": clock - 30, "median": clock, "max": clock + 15}}
    return out


def bench_file(tmp_path, cases, capability="sm_70", sms=80, name="bench.json") -> Path:
    path = tmp_path / name
    path.write_text(
        json.dumps(
            {
                "gpu": "Tesla V100-SXM2-32GB",
                "capability": capability,
                "sms": sms,
                "manifest_sha256": "ab" * 32,
                "results": cases,
            }
        )
    )
    return path


SHAPES = [
    Shape(1024, 1024, 6, 1, 64, True, 0.125),
    Shape(4096, 4096, 6, 1, 64, True, 0.125),
    Shape(512, 16384, 6, 1, 64, True, 0.125),
    Shape(8192, 8192, 2, 1, 64, True, 0.125),
    Shape(320, 192, 1, 1, 64, False, 0.125),
]


def true_ms(shape: Shape, sms: int = 80, clock: float = 1350.0, cal: Calibration = TRUE) -> float:
    """The model's own time at ``cal`` by estimate_route (not the fit's route_timer), at the clock."""
    return estimate_route(launches_for(shape, EXACT, Card(sms, clock)), Card(sms, clock), V100, cal, clock)["ms"]


def data_at(cal: Calibration) -> dict:
    anchors, kernels = synthetic(cal)
    return {"kernel": list(kernels.values()), "anchor": anchors, "targets": {"residual": 0.1, "loo": 0.15}}


def test_the_fit_recovers_known_parameters_from_user_anchors(tmp_path):
    """Published and user anchors that are the model's own times at (1.3, 20,000): the fit
    recovers both parameters and every residual is zero; each user anchor is listed with its file,
    shape, route and the clock it ran at."""
    clocks = [1350.0, 1530.0, 1267.0, 1400.0, 1312.0]
    path = bench_file(tmp_path, [case(s, true_ms(s, clock=k), k) for s, k in zip(SHAPES, clocks, strict=True)])
    user, skipped = u.load([path], launches_for)
    assert skipped == [] and [a["clock_mhz"] for a in user] == clocks
    cal = c.calibrate(V100, data_at(TRUE), user)
    assert cal["parameters"]["cycle_factor"] == pytest.approx(1.3, rel=1e-3)
    assert cal["parameters"]["cta_cycles"] == pytest.approx(20000, rel=1e-2)
    rows = [a for a in cal["anchors"] if a["kind"] == "user"]
    assert [(a["file"], a["label"], a["route"], a["clock_mhz"]) for a in rows] == [
        (str(path), s.label, EXACT, k) for s, k in zip(SHAPES, clocks, strict=True)
    ]
    assert all(abs(a["residual"]) < 2e-3 and abs(a["loo_residual"]) < 2e-3 for a in rows)


def test_a_user_anchors_residual_by_hand(tmp_path):
    """One CTA (Q=64, 4 key blocks, non-causal, one head) measured 0.02 ms at 1,000 MHz: the
    model's time is (f x (L + 4 x 1,200) + c) cycles at 1 GHz for the fitted f and c, and the
    residual measured / that - 1."""
    shape = Shape(64, 128, 1, 1, 64, False, 0.125)
    path = bench_file(tmp_path, [case(shape, 0.02, 1000.0)])
    user, _ = u.load([path], launches_for)
    cal = c.calibrate(V100, data_at(TRUE), user)
    p = cal["parameters"]
    (row,) = [a for a in cal["anchors"] if a["kind"] == "user"]
    by_hand = (p["cycle_factor"] * (LATENCY + 4 * 1200) + p["cta_cycles"]) / 1e6
    assert row["calibrated"] == pytest.approx(by_hand) and row["residual"] == pytest.approx(0.02 / by_hand - 1)
    # Without it the published anchors still say (1.3, 20,000): its leave-one-out residual.
    assert row["loo_residual"] == pytest.approx(0.02 / ((1.3 * (LATENCY + 4 * 1200) + 20000) / 1e6) - 1, rel=1e-2)


def test_one_user_anchor_off_moves_the_fit_a_little_and_says_so(tmp_path):
    shapes = SHAPES[:4]
    times = [true_ms(s) for s in shapes]
    times[1] *= 1.2
    path = bench_file(tmp_path, [case(s, t) for s, t in zip(shapes, times, strict=True)])
    user, skipped = u.load([path], launches_for)
    # The exact route's range: the synthetic split-D class's, and with --anchors its users' anchors'.
    data = data_at(TRUE) | {"route_class": {EXACT: {"classes": ["split-D fused FA2 (1Cat-vLLM)"]}}}
    before = c.calibrate(V100, data)
    after = c.calibrate(V100, data, user)
    fit = u.movement(before, after, [path], skipped)
    assert fit["before"]["anchors"] == 5 and fit["after"]["anchors"] == 9
    assert fit["before"]["parameters"]["cycle_factor"] == pytest.approx(1.3, rel=1e-3)
    off = fit["user_anchors"][1]
    assert off["loo_residual"] == pytest.approx(0.2, abs=0.02) and 0 < off["residual"] < off["loo_residual"]
    assert fit["after"]["loo_range"][1] == pytest.approx(off["loo_residual"])
    users = [a["loko_residual"] for a in after["anchors"] if a["class"] == f"fa2patch {EXACT}"]
    assert len(users) == 4 and fit["after"]["route_ranges"][EXACT][1] == pytest.approx(
        max(users + [a["loo_residual"] for a in after["anchors"]])
    )
    text = "\n".join(u.render_calibration({"calibration": after, "anchor_fit": fit}))
    assert "5 -> 9 anchors" in text and "cycle factor 1.300 ->" in text
    lo, hi = fit["after"]["route_ranges"][EXACT]
    assert f"{EXACT} " in text and f"-> {lo:+.1%} .. {hi:+.1%}" in text


def test_the_clock_is_the_nvml_median_else_nvidia_smi_else_the_case_is_left_out(tmp_path):
    shape = SHAPES[0]
    path = bench_file(
        tmp_path,
        [
            case(shape, 1.0, 1350.0),
            case(shape, 1.0, None, sm_clock_after="1297 MHz"),
            case(shape, 1.0, None),
            case(shape, None, error="Traceback ...\nRuntimeError: CUDA out of memory"),
            {**case(shape, 1.0), "route": "sm70-other"},
        ],
    )
    user, skipped = u.load([path], launches_for)
    assert [(a["clock_mhz"], a["clock_source"]) for a in user] == [
        (1350.0, "NVML median during the timed calls"),
        (1297.0, "nvidia-smi right after the timed calls"),
    ]
    assert [s["reason"].split(":")[0] for s in skipped] == ["no clock", "no time (RuntimeError", str(ARTIFACT)]
    assert "no model of route 'sm70-other'" in skipped[2]["reason"]
    # The anchor runs at its measured clock whatever its duty: half the clock, twice the time.
    (fast,), _ = u.anchors_from(path, {"sms": 80, "results": [case(shape, 1.0, 1400.0)]}, launches_for)
    (slow,), _ = u.anchors_from(path, {"sms": 80, "results": [case(shape, 1.0, 700.0)]}, launches_for)
    t = [c.anchor_timer(a, {}, V100)(TRUE) for a in (fast, slow)]
    assert t[1] == pytest.approx(2 * t[0]) and t[0] == pytest.approx(true_ms(shape, clock=1400.0))


def test_files_from_other_gpus_or_without_an_sm_count_are_refused(tmp_path):
    h200 = bench_file(tmp_path, [case(SHAPES[0], 1.0)], capability="sm_90", name="h200.json")
    with pytest.raises(
        EnvironmentProblem,
        match=r"h200.json: expected a bench file from an sm_70 card .* actual "
        r"'sm_90' \(Tesla V100-SXM2-32GB\)",
    ):
        u.load([h200], launches_for)
    with pytest.raises(EnvironmentProblem, match="records no SM count"):
        u.load([bench_file(tmp_path, [], sms=None, name="nosms.json")], launches_for)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(EnvironmentProblem, match="cannot read it as JSON"):
        u.load([bad], launches_for)
    assert math.isfinite(true_ms(SHAPES[0]))
