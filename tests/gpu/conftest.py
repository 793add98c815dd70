# SPDX-License-Identifier: BSD-3-Clause
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _gpu_arch():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


@pytest.fixture(scope="session")
def gpu_build() -> Path:
    """The extension built for this GPU's architecture (ci/gpu-lab.sh builds it)."""
    arch = _gpu_arch()
    if arch is None:
        pytest.skip("no CUDA GPU visible to torch: GPU tests run on the lab machine (ci/gpu-lab.sh)")
    root = Path(os.environ.get("FA2PATCH_ROOT") or REPO)
    manifest = root / "build" / arch / "manifest.json"
    if not manifest.is_file():
        message = f"{manifest}: no build for this GPU ({arch}); run ci/gpu-lab.sh"
        if os.environ.get("FA2PATCH_REQUIRE_GPU_BUILD") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return root / "build" / arch / json.loads(manifest.read_text())["artifact"]["file"]


@pytest.fixture(scope="session")
def build_info(gpu_build) -> dict:
    """The GPU build's build_info(), read as fa2patch reads it (a subprocess loads the library)."""
    from fa2patch.compile.extension import load_build_info

    info = load_build_info(gpu_build)
    assert "error" not in info, f"loading {gpu_build} failed:\n{info.get('error')}"
    return info


CALL = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
kw = json.loads(sys.argv[2])
dtype = getattr(torch, kw.get("dtype", "float16"))
sq, sk, hq, hk, d = kw.get("shape", [8, 8, 2, 1, 64])
q = torch.randn(sq, hq, d, dtype=dtype, device="cuda")
page = kw.get("page")
if page:
    nblocks = (sk + page - 1) // page
    k = torch.randn(nblocks, page, hk, d, dtype=dtype, device="cuda")
    table = torch.arange(nblocks, dtype=torch.int32, device="cuda").view(1, -1)
else:
    k = torch.randn(sk, hk, d, dtype=dtype, device="cuda")
    table = None
v = torch.randn_like(k)
cu_q = torch.tensor([0, sq], dtype=torch.int32, device="cuda")
cu_k = torch.tensor([0, sk], dtype=torch.int32, device="cuda")
out = torch.full_like(q, 7.0)
gen = torch.zeros(2, dtype=torch.int64, device="cuda") if kw.get("gen") else None
try:
    torch.ops._vllm_fa2_C.varlen_fwd(q, k, v, out, cu_q, cu_k, None, None, table, None, sq, sk,
                                     kw.get("p_dropout", 0.0), d ** -0.5, False, True, -1, -1, 0.0,
                                     False, 0, gen)
    torch.cuda.synchronize()
    result = {"raised": None}
except Exception as exc:
    result = {"raised": type(exc).__name__, "message": str(exc).splitlines()[0]}
result["out_untouched"] = bool((out == 7.0).all())
result["out_finite"] = bool(torch.isfinite(out).all())
torch.cuda.synchronize()  # the process and the device are still usable after the error
print(json.dumps(result))
"""


@pytest.fixture
def call_op(gpu_build):
    def run(env=None, **kw):
        proc = subprocess.run(
            [sys.executable, "-c", CALL, str(gpu_build), json.dumps(kw)],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run


# --- Slow cases and the numerics summary (tests/gpu/test_sm70_numerics.py) -----------------


def slow_enabled() -> bool:
    """Cases marked `slow` (the reference workload endpoints, KV 256K) run with FA2PATCH_SLOW=1."""
    return os.environ.get("FA2PATCH_SLOW") == "1"


def pytest_collection_modifyitems(config, items):
    if slow_enabled():
        return
    skip = pytest.mark.skip(reason="slow GPU case: set FA2PATCH_SLOW=1 to run it")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


def _json_number(x):
    """JSON has no inf/nan: write them as strings so any JSON reader accepts the summary."""
    if isinstance(x, float) and x != x:
        return "nan"
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return x


def _rank(x):
    """Order of badness of a metric value: NaN is worse than any number, inf included."""
    return (1, 0.0) if x != x else (0, x)


class NumericsSummary:
    """Every case result of the numerics suite, grouped per family with the worst metrics."""

    METRICS = ("max_abs", "rel_l2", "ratio", "lse_max_err")
    FLAGS = ("ok", "finite", "deterministic")

    def __init__(self):
        self.rows = []

    def record(self, family: str, case: str, result: dict) -> None:
        row = {"family": family, "case": case}
        for key in (
            *self.METRICS,
            "bar",
            "rel_l2_worst_seq",
            *self.FLAGS,
            "raised",
            "message",
            "error",
            "device_ok",
            "out_untouched",
            "seconds",
            "seconds_op",
        ):
            if result.get(key) is not None or (key == "raised" and key in result):
                row[key] = result[key]
        row["ok"] = bool(result.get("ok"))
        self.rows.append(row)

    def as_json(self) -> dict:
        families = {}
        for row in self.rows:
            fam = families.setdefault(
                row["family"], {"cases": 0, "ok": True, "failed": [], "worst": {}, "worst_case": {}, "results": []}
            )
            fam["cases"] += 1
            fam["results"].append({k: _json_number(v) for k, v in row.items() if k != "family"})
            if not row["ok"]:
                fam["ok"] = False
                fam["failed"].append(row["case"])
            for m in self.METRICS:
                number = isinstance(row.get(m), (int, float))
                if number and (m not in fam["worst"] or _rank(row[m]) > _rank(fam["worst"][m])):
                    fam["worst"][m] = row[m]
                    fam["worst_case"][m] = row["case"]
            for flag in ("finite", "deterministic"):
                if flag in row:
                    fam["worst"][flag] = fam["worst"].get(flag, True) and bool(row[flag])
        for fam in families.values():
            fam["worst"] = {k: _json_number(v) for k, v in fam["worst"].items()}
        return {
            "cases": len(self.rows),
            "ok": all(r["ok"] for r in self.rows) if self.rows else None,
            "failed": [f"{r['family']}/{r['case']}" for r in self.rows if not r["ok"]],
            "families": families,
        }


_NUMERICS_SUMMARY = NumericsSummary()


@pytest.fixture(scope="session")
def numerics_summary() -> NumericsSummary:
    """Collects case results; written to $FA2PATCH_GPU_SUMMARY (a path) at the end of the session."""
    return _NUMERICS_SUMMARY


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("FA2PATCH_GPU_SUMMARY")
    if not path:
        return
    summary = _NUMERICS_SUMMARY.as_json()
    if not summary["cases"]:
        summary["note"] = "no numerics case ran (no GPU, no build, a build without SM70 kernels, or deselected)"
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
