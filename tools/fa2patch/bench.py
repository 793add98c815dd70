"""bench: time two routes of the extension on a GPU over a shape sweep, with numerics.

Each (route, shape) runs in its own subprocess with the route's environment (the lab switch is
read once per process). Timing: CUDA events around each call after warm-up; median, min, max.
Numerics: the last output against a chunked FP32 reference, judged against both bench's looser
envelope and the numerics contract (both in ``fa2patch.numerics``).
On a GPU other than a V100 the timings of SM70 code do not represent V100 (docs/DESIGN.md §5).
"""

import itertools
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from . import numerics
from .calibration import range_text, separated
from .errors import EnvironmentProblem, NothingToLaunch
from .smoke import GPU_PROBE, _python_json, _route, require_build_info

DEFAULT_SHAPES = "q=8000,kv=40000:128000:8000,hq=6,hkv=1,d=256,causal=1,scale=0.0625"


@dataclass(frozen=True)
class Shape:
    q: int
    kv: int
    hq: int
    hkv: int
    d: int
    causal: bool
    scale: float
    b: int = 1      # sequences of this shape in the batch

    @property
    def label(self) -> str:
        return (f"{f'B={self.b} ' if self.b > 1 else ''}Q={self.q} KV={self.kv} Hq={self.hq} Hkv={self.hkv} "
                f"D={self.d}{' causal' if self.causal else ''}")


def parse_shapes(text: str) -> list[Shape]:
    """``key=value`` pairs joined by commas, ';' between groups; a value ``a:b:step`` sweeps
    a..b inclusive. Keys: q, kv, hq, hkv, d, causal (0/1), scale (default d**-0.5), b (batch:
    sequences of that shape, default 1)."""
    shapes = []
    for group in filter(None, (g.strip() for g in text.split(";"))):
        fields = {}
        for item in group.split(","):
            key, sep, value = item.strip().partition("=")
            if not sep or key not in ("q", "kv", "hq", "hkv", "d", "causal", "scale", "b"):
                raise EnvironmentProblem(f"--shapes: expected key=value with key in q, kv, hq, hkv, d, "
                                         f"causal, scale, b; got {item!r}")
            fields[key] = value
        missing = {"q", "kv", "hq", "hkv", "d"} - set(fields)
        if missing:
            raise EnvironmentProblem(f"--shapes: {group!r} lacks {', '.join(sorted(missing))}")
        sweeps = {k: _values(k, v) for k, v in fields.items() if k not in ("causal", "scale")}
        scale = float(fields["scale"]) if "scale" in fields else None
        for b, q, kv, hq, hkv, d in itertools.product(sweeps.get("b", [1]), sweeps["q"], sweeps["kv"], sweeps["hq"],
                                                      sweeps["hkv"], sweeps["d"]):
            if hq % hkv:
                raise EnvironmentProblem(f"--shapes: hq={hq} is not a multiple of hkv={hkv}")
            shapes.append(Shape(q, kv, hq, hkv, d, fields.get("causal", "1") == "1",
                                scale if scale is not None else d ** -0.5, b))
    if not shapes:
        raise EnvironmentProblem("--shapes: no shape given")
    return shapes


def _values(key: str, value: str) -> list[int]:
    m = re.fullmatch(r"(\d+)(?::(\d+):(\d+))?", value)
    if not m or (m.group(3) and int(m.group(3)) <= 0):
        raise EnvironmentProblem(f"--shapes: {key}={value!r} is not N or START:END:STEP")
    if not m.group(2):
        return [int(m.group(1))]
    return list(range(int(m.group(1)), int(m.group(2)) + 1, int(m.group(3))))


def attended_pairs(q: int, kv: int, causal: bool) -> int:
    """Query/key pairs that attention uses: bottom-right causal keeps key j for row i when
    j <= i + kv - q."""
    if not causal:
        return q * kv
    return sum(max(0, min(kv, i + kv - q + 1)) for i in range(q)) if q > kv else q * (kv - q) + q * (q + 1) // 2


def useful_flops(shape: Shape) -> float:
    """2 FLOPs per multiply-add, two GEMMs (Q K^T and P V), attended pairs only."""
    return 4.0 * shape.b * shape.hq * shape.d * attended_pairs(shape.q, shape.kv, shape.causal)


def judge(numbers: dict) -> dict:
    """The envelope and the contract verdicts for one comparison (``reference.compare`` keys)."""
    return {
        "envelope_ok": numerics.within_envelope(numbers["max_abs"], numbers["rel_l2"], numbers["finite"]),
        "contract_ok": numerics.meets_contract(numbers["max_abs"], numbers["bar"], numbers["rel_l2"],
                                               numbers["finite"]),
    }


def gpu_or_nothing() -> dict:
    """This machine's GPU (smoke's probe); NothingToLaunch without one."""
    gpu = _python_json(GPU_PROBE)
    if "error" in gpu or not gpu.get("cuda"):
        raise NothingToLaunch("nothing timed: torch sees no CUDA GPU on this machine")
    return gpu


def bench(gpu: dict, artifact: Path, manifest_sha256: str, routes: list[str] | None, shapes: list[Shape],
          warmup: int, reps: int, progress=lambda items: items) -> dict:
    """``routes``: one or two route names; None: sm70-dense and the first other route."""
    info = require_build_info(artifact)
    known = {r["name"]: r for r in map(_route, info.get("routes", []))}
    routes = routes or ["sm70-dense"] + [n for n in known if n != "sm70-dense"][:1]
    unknown = [r for r in routes if r not in known]
    if unknown:
        raise EnvironmentProblem(f"{artifact}: no route {', '.join(unknown)}; it registers "
                                 f"{', '.join(known) or 'none'}")
    if any(s.b != 1 for s in shapes):
        raise EnvironmentProblem("--shapes: b (batch) is for `report` only; bench times one sequence per shape")
    idle, max_clock, driver = (_smi("clocks.sm,clocks.max.sm,driver_version").split(",") + ["", ""])[:3]
    results = []
    for shape, route in progress([(s, r) for s in shapes for r in routes]):
        r = _python_json("from fa2patch.bench import worker; worker()", str(artifact),
                         json.dumps({**asdict(shape), "warmup": warmup, "reps": reps, "op": known[route]["op"]}),
                         env=known[route].get("env"))
        if "error" not in r:
            r.update(judge(r["numerics"]))
            r["tflops"] = useful_flops(shape) / (r["median_ms"] * 1e-3) / 1e12
        results.append({"route": route, "shape": asdict(shape), "label": shape.label, **r})
    return {"gpu": gpu["name"], "capability": gpu["capability"], "sm_clock_idle": idle.strip(),
            "sm_clock_max": max_clock.strip(), "driver": driver.strip(), "manifest_sha256": manifest_sha256, "routes": routes,
            "is_v100": gpu["capability"] == "sm_70", "results": results}


def _smi(fields: str) -> str:
    """First GPU's nvidia-smi values (CSV, no units header); empty without nvidia-smi."""
    try:
        proc = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True)
    except FileNotFoundError:
        return ""
    return (proc.stdout.strip().splitlines() or [""])[0]


def worker() -> None:
    """Subprocess side: time one shape through the route's op and compare the output. varlen_fwd
    takes vLLM's 22 arguments; gqa_prefill_fwd (one causal sequence) a workspace allocated once,
    as a persistent one would be."""
    import torch

    from .reference import attention_ref_chunked, compare

    artifact, spec = sys.argv[1], json.loads(sys.argv[2])
    torch.ops.load_library(artifact)
    ops = torch.ops._vllm_fa2_C
    name = spec.get("op", "varlen_fwd")
    op = getattr(ops, name)
    if name != "varlen_fwd" and not spec["causal"]:
        raise ValueError(f"{name} computes causal attention only; the shape is not causal")
    torch.manual_seed(0)
    q = torch.randn(spec["q"], spec["hq"], spec["d"], dtype=torch.float16, device="cuda")
    k = torch.randn(spec["kv"], spec["hkv"], spec["d"], dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    cu_q = torch.tensor([0, spec["q"]], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, spec["kv"]], dtype=torch.int32, device="cuda")

    if name == "varlen_fwd":
        def call():
            op(q, k, v, out, cu_q, cu_k, None, None, None, None, spec["q"], spec["kv"], 0.0, spec["scale"],
               False, spec["causal"], -1, -1, 0.0, False, 0, None)
    else:
        ws = torch.empty(ops.gqa_prefill_workspace_bytes(spec["q"], spec["kv"], spec["hq"], spec["hkv"]),
                         dtype=torch.uint8, device="cuda")

        def call():
            op(q, k, v, out, None, spec["kv"], spec["scale"], ws)

    for _ in range(spec["warmup"]):
        call()
    times = []
    for _ in range(spec["reps"]):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    clock = _smi("clocks.sm")  # right after the timed calls: the clock they ran at, near enough
    times.sort()
    ref, _ = attention_ref_chunked(q, k, v, spec["scale"], spec["causal"], max_elems=1 << 28)
    ref16, _ = attention_ref_chunked(q, k, v, spec["scale"], spec["causal"], compute_dtype=torch.float16,
                                     max_elems=1 << 28)
    numerics = compare(out, ref, ref16)
    numerics["mean_abs"] = (out.float() - ref).abs().mean().item()
    print(json.dumps({"median_ms": times[len(times) // 2], "min_ms": times[0], "max_ms": times[-1],
                      "sm_clock_after": clock.strip(), "numerics": numerics}))


WARNING = ("WARNING: this GPU is not a V100 (sm_70): timings of SM70 code here do not represent "
           "V100 (the H200 emulates Volta's mma.m8n8k4).")


def render(result: dict) -> str:
    """The A/B table: per shape, median ms of each route with its range over the repetitions
    (min-max), speedup and latency reduction of B over A and whether the two ranges separate
    (the rule `report` compares routes by: calibration.separated), useful causal TFLOP/s, and the
    numerics verdicts (envelope / contract)."""
    routes = result["routes"]
    loaded = sorted({r["sm_clock_after"] for r in result["results"] if r.get("sm_clock_after")})
    lines = [f"GPU {result['gpu']} ({result['capability']}), SM clock {result['sm_clock_idle']} idle, "
             f"{result['sm_clock_max']} max, {' / '.join(loaded) or 'unknown'} right after the timed calls; "
             f"driver {result['driver']}, build manifest sha256 {result['manifest_sha256'][:16]}"]
    if not result["is_v100"]:
        lines.append(WARNING)
    by_shape: dict[str, dict] = {}
    for r in result["results"]:
        by_shape.setdefault(r["label"], {})[r["route"]] = r
    header = ["shape"] + [f"{x} ms, median (min-max)" for x in routes]
    if len(routes) == 2:
        header += ["speedup", "latency -", "ranges"]
    header += [f"{x} TFLOP/s" for x in routes] + [f"{x} env/contract" for x in routes]
    rows = []
    for label, per in by_shape.items():
        cells = [label]
        got = [per.get(x, {}) for x in routes]
        ms = [r.get("median_ms") for r in got]
        cells += [(range_text(r["median_ms"], r.get("min_ms", r["median_ms"]), r.get("max_ms", r["median_ms"]), 2)
                   if r.get("median_ms") else "error") for r in got]
        if len(routes) == 2:
            ok = all(ms)
            spans = [{"calibrated_ms_low": r.get("min_ms", r.get("median_ms")),
                      "calibrated_ms_high": r.get("max_ms", r.get("median_ms"))} for r in got]
            cells += [f"{ms[0] / ms[1]:.2f}x" if ok else "-", f"{1 - ms[1] / ms[0]:.0%}" if ok else "-",
                      ("separated" if separated(*spans) else "not separated") if ok else "-"]
        cells += [f"{per[x]['tflops']:.1f}" if "tflops" in per.get(x, {}) else "-" for x in routes]
        cells += [("ok" if per[x]["envelope_ok"] else "FAIL") + "/" + ("ok" if per[x]["contract_ok"] else "FAIL")
                  if "envelope_ok" in per.get(x, {}) else per.get(x, {}).get("error", "-")[:40] for x in routes]
        rows.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    for r in [header, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)
