# SPDX-License-Identifier: BSD-3-Clause
"""`fa2patch report --plot`: the pictures show report's JSON numbers and nothing else (read back from
the matplotlib artists, not from pixels), routing's rule as the pictures colour it matches the patch's
constants, and the guide's committed pictures (docs/figures/) are what the plot draws from their data
and, on the real build, what report says today."""

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from fa2patch.common import routes
from fa2patch.model import exact_route
from helpers import REPO

mpl = pytest.importorskip("matplotlib")
from fa2patch.model import report_plot as rp  # noqa: E402

FIGURES = REPO / "docs" / "figures"
PINNED = re.search(r'"matplotlib==([^"]+)"', (REPO / "pyproject.toml").read_text())[1]


def row(label, route, ms, *, low=None, high=None, floor=1.0, **extra):
    return {
        "label": label,
        "route": route,
        "calibrated_ms": ms,
        "calibrated_ms_low": low if low is not None else ms * 0.9,
        "calibrated_ms_high": high if high is not None else ms * 1.3,
        "floor_ms": floor,
        "plan": extra.pop("plan", {}),
        **extra,
    }


def kernel(d, rows_per_cta=64, keys=32, blocks_per_sm=1):
    geometry = {"route": routes.EXACT, "head_dim": d, "rows_per_cta": rows_per_cta, "keys_per_iteration": keys}
    return {
        "kernel": f"flash_fwd_sm70_kernel<{d}>",
        "geometry": geometry,
        "occupancy": {"blocks_per_sm": blocks_per_sm},
    }


def fake_report() -> dict:
    """A report --json object: a 6/1 x 256 grid over Q x KV (decode row included) and a 32/8 x 128
    decode sweep, every number distinct."""
    preds = []
    n = 0
    for q in (1, 256, 1024):
        for kv in (4096, 16384, 65536):
            label = f"Q={q} KV={kv} Hq=6 Hkv=1 D=256 causal"
            n += 1
            preds.append(row(label, routes.EXACT, 10.0 + n, floor=1.0 + n / 100))
            if q == 1:
                verdict = "faster" if kv < 65536 else "not separated"
                preds.append(row(label, routes.DECODE, 5.0 + n, builtin_rule=kv < 65536, vs_dense_verdict=verdict))
                continue
            preds.append(row(label, routes.GQA, 7.0 + n, vs_dense_verdict="faster" if q >= 1024 else "slower"))
            for s in (2, 3):
                verdict = "faster" if s == 2 else "not separated"
                preds.append(row(label, routes.SPLITKV, 8.0 + n + s / 10, plan={"splits": s}, vs_dense_verdict=verdict))
    for kv in (1024, 2048, 4096):
        label = f"B=64 Q=1 KV={kv} Hq=32 Hkv=8 D=128 causal"
        preds.append(row(label, routes.EXACT, kv / 1000, floor=0.01))
        preds.append(row(label, routes.DECODE, kv / 1700, floor=0.01, builtin_rule=True, vs_dense_verdict="faster"))
    return {
        "ok": True,
        "artifact": {"file": "_vllm_fa2_C.abi3.so", "sha256": "0" * 64},
        "card": {"sms": 72, "clock_mhz": 1530.0, "dram_gbs": 900},
        "kernels": [kernel(128), kernel(256)],
        "predictions": preds,
    }


def containers(ax):
    """{label: (xs, ys, lows, highs)} of an axes' error bars."""
    out = {}
    for c in ax.containers:
        line, _caps, (bars,) = c.lines[0], c.lines[1], c.lines[2]
        xs, ys = (list(map(float, v)) for v in line.get_data())
        segs = bars.get_segments()
        out[c.get_label()] = (xs, ys, [float(s[0][1]) for s in segs], [float(s[1][1]) for s in segs])
    return out


def test_plotted_values_equal_the_report_json():
    report = fake_report()
    by = {(p["label"], rp.series_name(p)): p for p in report["predictions"]}
    data = rp.picture_data(report)
    figures = rp.draw(data)
    assert set(figures) == {"routes", "routing", "decode"}

    # Per prefill configuration and Q: each route's calibrated time and range, and the floor.
    axes = [ax for ax in figures["routes"].axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["Q=256 Hq=6 Hkv=1 D=256", "Q=1024 Hq=6 Hkv=1 D=256"]
    for ax, q in zip(axes, (256, 1024), strict=True):
        labels = {kv: f"Q={q} KV={kv} Hq=6 Hkv=1 D=256 causal" for kv in (4096, 16384, 65536)}
        got = containers(ax)
        assert set(got) == {routes.EXACT, routes.GQA, f"{routes.SPLITKV} x2", f"{routes.SPLITKV} x3"}
        for name, (xs, ys, lows, highs) in got.items():
            assert xs == [4096, 16384, 65536]
            want = [by[(labels[kv], name)] for kv in xs]
            assert ys == [p["calibrated_ms"] for p in want]
            assert lows == pytest.approx([p["calibrated_ms_low"] for p in want], rel=1e-12)
            assert highs == pytest.approx([p["calibrated_ms_high"] for p in want], rel=1e-12)
        (floor,) = [line for line in ax.get_lines() if line.get_label() == "floor"]
        assert list(floor.get_ydata()) == [by[(labels[kv], routes.EXACT)]["floor_ms"] for kv in (4096, 16384, 65536)]

    # The routing map: every cell once, coloured by the rule's route, x where the ranges do not separate.
    (ax,) = figures["routing"].axes
    cells = {p.get_gid()[len("cell-") :]: p for p in ax.patches if (p.get_gid() or "").startswith("cell-")}
    marks = {m.get_gid()[len("not-separated-") :] for m in ax.get_lines() if (m.get_gid() or "").startswith("not-")}
    expected = {
        # Q=1: the decode kernel where its rule (builtin_rule) takes the call; beyond, the exact route,
        # whose runner-up (the decode kernel) does not separate from it.
        "Q=1 KV=4096": (routes.DECODE, True),
        "Q=1 KV=16384": (routes.DECODE, True),
        "Q=1 KV=65536": (routes.EXACT, False),
        # Q=256: split-KV by the built-in rule (72 slots, 24 CTAs: x3 fills a wave; x2 at 4096 keys).
        "Q=256 KV=4096": (f"{routes.SPLITKV} x3", False),
        "Q=256 KV=16384": (f"{routes.SPLITKV} x3", False),
        "Q=256 KV=65536": (f"{routes.SPLITKV} x3", False),
        # Q=1024: the long-prefill route from 16,384 keys; below, the exact route (96 CTAs: no split).
        "Q=1024 KV=4096": (routes.EXACT, True),
        "Q=1024 KV=16384": (routes.GQA, True),
        "Q=1024 KV=65536": (routes.GQA, True),
    }
    assert set(cells) == {f"{k} Hq=6 Hkv=1 D=256 causal" for k in expected}
    for short, (name, separated) in expected.items():
        label = f"{short} Hq=6 Hkv=1 D=256 causal"
        colour = rp.COLOURS.get(name, rp.COLOURS[name.split(" ")[0]])
        assert mpl.colors.to_hex(cells[label].get_facecolor()) == colour, short
        assert (label not in marks) == separated, short
    q, kv = (int(x) for x in re.match(r"Q=(\d+) KV=(\d+)", "Q=1024 KV=65536").groups())
    cell = cells["Q=1024 KV=65536 Hq=6 Hkv=1 D=256 causal"]
    grid = data["routing"]
    assert (cell.get_x() + 0.5, cell.get_y() + 0.5) == (grid["kv"].index(kv), grid["q"].index(q))

    # Decode: time and range per route, K/V bytes over the calibrated time, the DRAM peak.
    time_axes = [ax for ax in figures["decode"].axes if ax.get_title().startswith("Decode")]
    assert [ax.get_title() for ax in time_axes] == [
        "Decode, B=1 Hq=6 Hkv=1 D=256",
        "Decode, B=64 Hq=32 Hkv=8 D=128",
    ]
    ax_t = time_axes[1]
    ax_b = next(a for a in figures["decode"].axes if a.get_ylabel().startswith("K/V") and a.get_position().x0 > 0.4)
    for name, (xs, ys, lows, highs) in containers(ax_t).items():
        want = [by[(f"B=64 Q=1 KV={kv} Hq=32 Hkv=8 D=128 causal", name)] for kv in (1024, 2048, 4096)]
        assert xs == [1024, 2048, 4096] and ys == [p["calibrated_ms"] for p in want]
        assert lows == pytest.approx([p["calibrated_ms_low"] for p in want], rel=1e-12)
        assert highs == pytest.approx([p["calibrated_ms_high"] for p in want], rel=1e-12)
        (bw,) = [line for line in ax_b.get_lines() if line.get_label() == name]
        kv_bytes = [2 * 2 * 64 * kv * 8 * 128 for kv in xs]
        gbs = [b / (p["calibrated_ms"] * 1e-3) / 1e9 for b, p in zip(kv_bytes, want, strict=True)]
        assert list(bw.get_ydata()) == pytest.approx(gbs, rel=1e-12)
    (peak,) = [line for line in ax_b.get_lines() if line.get_label() == "DRAM peak"]
    assert set(peak.get_ydata()) == {report["card"]["dram_gbs"]}


def test_rule_constants_are_the_patch_series():
    """The rule the routing map colours by: routing.cpp's constants, as patch 0004 writes them."""
    (patch,) = (REPO / "patches").glob("0004-*.patch")
    text = patch.read_text()

    def const(name):
        return re.search(rf"^\+\s*constexpr [\w:]+ {name}(?:\[\])? = ([^;]+);", text, flags=re.M)[1]

    assert float(const("kSplitMinGain")) == exact_route.SPLIT_MIN_GAIN
    assert int(const("kSplitCtaFixedBlocks")) == exact_route.SPLIT_CTA_FIXED_BLOCKS
    assert tuple(int(x) for x in const("kSplitCandidates").strip("{} ").split(",")) == exact_route.SPLIT_CANDIDATES
    assert int(const("kMinSeqlenQ")) == rp.LONG_PREFILL_MIN_Q
    assert int(const("kMinSeqlenK")) == rp.LONG_PREFILL_MIN_KV


def test_split_rule_by_hand():
    """The built-in split rule the routing map colours by (exact_route.prefill_splits, through the kernel
    row's geometry), worked by hand on 80 slots (F = 32 key blocks per CTA)."""
    k = kernel(256)
    # 6 heads x 16 query blocks = 96 CTAs (2 waves) over 512 key blocks: unsplit 2 x (32 + 512) = 1,088;
    # s=2: 3 x (32 + 256) = 864 (1.259, below 1.26); s=3: 4 x (32 + 171) = 812 (1.340); s=4: 5 x 160 = 800 (1.36)
    assert rp.builtin_splits({"b": 1, "causal": True, "q": 1024, "kv": 16384, "hq": 6}, k, 80) == 4
    assert exact_route.prefill_splits(96, 512, 80) == 4
    # 2,048 CTAs (26 waves) over 512 blocks: s=2 is 52 waves x 288 against 26 x 544: no gain
    assert rp.builtin_splits({"b": 1, "causal": True, "q": 4096, "kv": 16384, "hq": 32}, k, 80) == 1
    # one CTA, 1 key block: every s costs 1 x (32 + 1), gain 1: unsplit; a batch or one query row never splits
    assert exact_route.prefill_splits(1, 1, 80) == 1
    assert rp.builtin_splits({"b": 2, "causal": True, "q": 1024, "kv": 16384, "hq": 6}, k, 80) == 1
    assert rp.builtin_splits({"b": 1, "causal": True, "q": 1, "kv": 16384, "hq": 6}, k, 80) == 1


def test_plot_needs_matplotlib_only_when_plotting(monkeypatch):
    from fa2patch.common.errors import EnvironmentProblem

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(EnvironmentProblem, match=r"fa2patch\[plot\]"):
        rp.draw(rp.picture_data(fake_report()))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plot", "x.txt", "--shapes", "q=1,kv=64,hq=1,hkv=1,d=64"], "expected a .svg or .png"),
        (["--plot", "x.svg"], "needs --shapes"),
    ],
)
def test_plot_usage_errors(tmp_path, args, message):
    env = {**os.environ, "FA2PATCH_ROOT": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "fa2patch", "report", *args], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_committed_figures_are_drawn_from_their_data(tmp_path):
    """docs/figures/: each SVG is what the plot draws from v100-data.json (same bytes, under the pinned
    matplotlib), and the data are report's numbers for docs/figures/shapes.txt on 72 SMs."""
    if version("matplotlib") != PINNED:
        pytest.skip(f"matplotlib {version('matplotlib')}, the figures are drawn with the pinned {PINNED}")
    data = json.loads((FIGURES / "v100-data.json").read_text())
    written = rp.write_data(data, tmp_path / "v100.svg")
    assert [p.name for p in written] == [f"v100-{n}.svg" for n in rp.PICTURES] + ["v100-data.json"]
    for p in written:
        assert p.read_bytes() == (FIGURES / p.name).read_bytes(), f"{p.name}: regenerate (docs/figures/README.md)"


@pytest.mark.toolchain
def test_committed_figures_match_report_on_the_real_build(built_sm70, real_project, tmp_path):
    """The guide's pictures say what `report --json` says on this series' build today: the command of
    docs/figures/README.md, run on the real build, gives the committed numbers."""
    shapes = (FIGURES / "shapes.txt").read_text().strip()
    out = tmp_path / "v100.svg"
    proc = real_project.run(
        "report", "--arch", "sm_70", "--sms", "72", "--json", "--shapes", shapes, "--plot", str(out)
    )
    report = json.loads(proc.stdout)
    assert report["plots"] == [str(tmp_path / f"v100-{n}.svg") for n in rp.PICTURES] + [
        str(tmp_path / "v100-data.json")
    ]
    fresh = json.loads((tmp_path / "v100-data.json").read_text())
    assert fresh == json.loads(json.dumps(rp.picture_data(report)))  # the file is the JSON's numbers
    committed = json.loads((FIGURES / "v100-data.json").read_text())
    fresh.pop("artifact"), committed.pop("artifact")  # the build's own file hash
    fresh, committed = _flat(fresh), _flat(committed)
    assert fresh.keys() == committed.keys(), "regenerate docs/figures (its README)"
    numbers = [k for k, v in committed.items() if isinstance(v, float)]
    assert [fresh[k] for k in numbers] == pytest.approx([committed[k] for k in numbers], rel=1e-9)
    assert {k: v for k, v in fresh.items() if k not in numbers} == {
        k: v for k, v in committed.items() if k not in numbers
    }


def _flat(value, path="") -> dict:
    """Nested JSON as {path: leaf}, for approximate comparison of its numbers."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{path}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{path}/{i}").items()}
    return {path: value}


def test_figure_paths(tmp_path):
    assert rp.paths(Path("a/b.png")) == {
        "routes": Path("a/b-routes.png"),
        "routing": Path("a/b-routing.png"),
        "decode": Path("a/b-decode.png"),
        "data": Path("a/b-data.json"),
    }
