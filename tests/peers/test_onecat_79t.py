# SPDX-License-Identifier: BSD-3-Clause
"""Issue 27's peer, 1Cat-vLLM #628's long prefill (fa2patch.peers.onecat_79t): its call rebuilt from the
recipe, its records against their tiles, its cuBLAS GEMMs against the cuBLAS anchor, and its
calibrated estimate against the times #628 publishes (never fitted)."""

import json

import pytest

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.routes import GQA
from fa2patch.common.shapes import Shape
from fa2patch.model.calibration import anchor_timer, calibrate
from fa2patch.model.v100model import Calibration, Card, estimate_route, load_data, load_v100, peak_tflops
from fa2patch.peers import onecat_79t as peer

DATA = load_data(peer.DATA)
V100 = load_v100()


def shape(q=8000, kv=128000, hq=6, hkv=1, d=256, b=1, causal=True, decode=0):
    return Shape(q, kv, hq, hkv, d, causal, d**-0.5, b, decode)


def test_the_call_at_the_headline_shape_is_the_recipes():
    """prefill.cu with PREFIX_TORCH_BLOCK_N=24576, 320-token tail tiles and fine PV groups of 4 tiles, at
    Q=8000, KV=128,000: 5 prefix blocks (4 x 24,576 + 21,696), 25 tail tiles, 325 (query tile, key
    tile) pairs for the batched QK, PV rounds of 25, 21, 17, 13, 9, 5 and 1 tasks (91), 15 row tiles of
    128 each (1,365 CTAs); the source's own constants (kTailTasks, kFinePVTasks, the grids)."""
    launches, plan = peer.peer_launches(shape())
    assert plan["prefix_blocks"] == [24576] * 4 + [21696]
    assert (plan["tail_tiles"], plan["tail_pairs"], plan["tail_rounds"]) == (25, 325, [25, 21, 17, 13, 9, 5, 1])
    assert plan["tail_pv_ctas"] == 1365
    pv = [x for x in launches if x.name == "prefix PV"]
    assert [len(x.iterations) for x in pv] == [375] * 5  # 48,000 rows / 128, one 256-wide tile of D
    assert [x.iterations[0] for x in pv] == [768] * 4 + [678]  # keys / 32


def test_the_tail_tasks_cover_the_causal_triangle_once():
    for tiles in (1, 4, 5, 25, 26):
        rounds = peer.tail_tasks(tiles, 4)
        assert sum(map(sum, rounds)) == tiles * (tiles + 1) // 2
        assert all(1 <= n <= 4 for r in rounds for n in r)


@pytest.mark.parametrize("kernel", DATA["kernel"], ids=lambda k: k["name"])
def test_a_pv_record_issues_the_mmas_of_its_tile(kernel):
    """Per warp and k-step, the tile's FMAs (tile_m x tile_n x tile_k over the warps) in mma.m8n8k4 of
    fma_per_mma884 FMAs, 4 HMMA.884.F32 steps each: FP32 accumulation, no F16 steps."""
    fmas = kernel["tile_m"] * kernel["tile_n"] * kernel["tile_k"] / kernel["warps"]
    assert kernel["loop"]["hmma_f32_steps"] == 4 * fmas / V100["fma_per_mma884"]
    assert kernel["loop"].get("hmma_f16_steps", 0) == 0


def test_its_cublas_gemm_runs_at_the_cublas_anchors_rate():
    """The QK GEMMs are modelled as the cuBLAS rate anchor premises a well-tiled GEMM: once calibrated,
    a large one runs at the rate the calibration gives that anchor."""
    cal = calibrate(V100)
    anchor = next(a for a in load_data("anchors.toml")["anchor"] if a["workload"]["kind"] == "tensor-peak")
    card = Card(anchor["card"]["sms"], anchor["card"]["clock_mhz"])
    m = n = k = 8192
    gemm = peer.cublas_gemm("gemm", DATA["qk"], m, n, k, 1, 0.0, V100)
    est = estimate_route([gemm], card, V100, Calibration(**cal["parameters"]))
    rate = 2 * m * n * k / (est["ms"] * 1e-3) / 1e12
    assert rate == pytest.approx(anchor_timer(anchor, {}, V100)(Calibration(**cal["parameters"])), rel=0.01)
    assert rate < peak_tflops(card, card.clock_mhz, V100)


@pytest.mark.parametrize("kv", [128000, 256000])
def test_the_published_times_fall_in_the_estimates_range(kv):
    """#628's VALIDATION.md (anchors.toml [[unused]], never fitted) at Q=8000: 79.9700 ms (KV=128,000)
    and 164.3465 ms (KV=256,000), a 72-SM V100 at the 1530 MHz the long-prefill anchors assume: each
    inside the peer's calibrated range (the routes' own range rule)."""
    e = peer.peer_estimate(shape(kv=kv), Card(72, 1530.0))
    assert e["published_ms"] == {128000: 79.97, 256000: 164.3465}[kv]
    assert e["calibrated_ms_low"] <= e["published_ms"] <= e["calibrated_ms_high"]
    assert e["bound_ms"] < e["model_ms"]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (shape(q=8192, kv=262144), "Q=8192"),
        (shape(hq=8), "Hq/Hkv=8/1"),
        (shape(hq=12, hkv=2), "Hq/Hkv=12/2"),  # two KV heads: the recipe runs one
        (shape(d=128), "D=128"),
        (shape(causal=False), "not causal"),
        (shape(b=2), "B=2"),
        (shape(decode=4), "4 decode rows"),
    ],
)
def test_a_shape_the_recipe_has_no_kernel_for_is_refused(bad, says):
    with pytest.raises(EnvironmentProblem, match="1cat-79t") as err:
        peer.peer_launches(bad)
    assert says in str(err.value)


def test_report_section_states_each_routes_verdict():
    """Beside each route: its range and whether the ranges separate, in words."""
    e = {
        "label": "L",
        "card": {"sms": 72, "clock_mhz": 1530.0},
        "published_ms": None,
        "calibrated_ms": 80.0,
        "calibrated_ms_low": 75.0,
        "calibrated_ms_high": 110.0,
    }

    def route(ms, lo, hi, splits=1):
        return {"label": "L", "route": GQA, "plan": {"splits": splits}, "calibrated_ms": ms} | {
            "calibrated_ms_low": lo,
            "calibrated_ms_high": hi,
        }

    text = peer.render([e], [route(60.0, 55.0, 70.0), route(79.0, 74.0, 100.0, 3), route(200.0, 190.0, 250.0)])
    assert "sm70-gqa-prefill 60.00 (55.00-70.00): route faster" in text
    assert "x3 79.00 (74.00-100.00): not separated" in text
    assert "200.00 (190.00-250.00): peer faster" in text


def test_report_runs_the_peer_on_its_own_calibration(built_sm70, real_project):
    """`report --peer 1cat-79t` on the real build: the peer is estimated with report's calibration and
    range rule (its range that of its kernel classes, the routes' theirs), beside them; a shape
    it has no kernel for fails the command, naming the shape and why."""
    shapes = "q=8000,kv=128000,hq=6,hkv=1,d=256,causal=1"
    args = ("report", "--arch", "sm_70", "--sms", "72", "--splits", "", "--peer", "1cat-79t", "--shapes", shapes)
    out = json.loads(real_project.run(*args, "--json").stdout)
    (e,) = out["peer"]
    assert e["peer"] == "1cat-79t" and e["published_ms"] == 79.97
    route = next(p for p in out["predictions"] if p["route"] == GQA)
    for est, name in ((e, "1cat-79t"), (route, GQA)):
        lo, hi = out["calibration"]["route_ranges"][name]  # each with its kernel class's range
        assert est["calibrated_ms_low"] == pytest.approx(est["calibrated_ms"] * (1 + lo))
        assert est["calibrated_ms_high"] == pytest.approx(est["calibrated_ms"] * (1 + hi))
    text = real_project.run(*args).stdout
    assert "Peer 1cat-79t" in text and "sm70-gqa-prefill" in text.split("Peer 1cat-79t")[1]
    bad = real_project.run(*args[:-1], "q=8192,kv=262144,hq=6,hkv=1,d=256,causal=1", check_rc=2)
    assert "1cat-79t" in bad.stderr and "Q=8192" in bad.stderr
