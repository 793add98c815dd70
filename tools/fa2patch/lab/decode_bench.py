# SPDX-License-Identifier: BSD-3-Clause
"""The lab's decode benchmark (issue 37): the decode kernel, the exact route, torch's own SDPA and
two DRAM streams, side by side on one GPU, in one process.

Decode reads the KV cache once and runs on CUDA cores (no ``mma.m8n8k4``, which Hopper emulates),
so the lab times it as what it is. Method, per call: the call captured in a CUDA graph; before every
replay a 256 MiB memset (the L2 flushed) and a sleep kernel that holds the stream (the replay is
queued before it starts, so no host time is in the window); CUDA events around the replay; the
median of ``reps`` replays. GB/s counts the K+V bytes of the call (the copy: read + write).

Rows: the decode kernel (``FA2PATCH_SM70_DECODE=1``) and the exact kernel (``=0``) on vLLM's paged
cache (pages shuffled), torch SDPA's fastest backend with ``enable_gqa`` on contiguous K/V, a device
copy and a read-only stream (``torch.sum``) of the same bytes. Each of our calls is checked against an
FP32 reference and must be counted by ``route_stats()`` under the route it claims.

Graph replay at other lengths: one call captured with ``max_seqlen_k`` = the capture length (the
routing decision is made there, as under vLLM's full CUDA graphs), replayed after writing shorter
lengths into ``seqused_k``; each replay is checked against the reference and timed beside an eager
call at that length (the same method, without the graph).

Run on the lab after ``ci/gpu-lab.sh`` built ``build/sm_90``:
``python3 -m fa2patch.lab.decode_bench --artifact build/sm_90/_vllm_fa2_C.abi3.so --json-file OUT.json``.
The pure parts (the shapes, bandwidth, the fixed-cost fit) are tested on the CPU
(tests/lab/test_decode_bench.py).
"""

import argparse
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass

FLUSH_BYTES = 256 << 20
SLEEP_CYCLES = 2_000_000  # about 1 ms at Hopper's clock: longer than any host launch below


@dataclass(frozen=True)
class DecodeShape:
    hq: int
    hkv: int
    d: int
    b: int
    kv: int
    page: int

    @property
    def kv_bytes(self) -> int:
        """K and V of the call, fp16: what a decode step must read."""
        return 2 * self.b * self.kv * self.hkv * self.d * 2

    @property
    def label(self) -> str:
        return f"{self.hq}/{self.hkv} x {self.d}, B={self.b}, {self.kv} keys, page {self.page}"


# The table and a sweep of lengths for the fixed-cost fit (6/1 x 256, one sequence).
SINGLE = tuple(DecodeShape(6, 1, 256, 1, kv, 784) for kv in (1024, 4096, 8192, 16384, 32768, 65536, 131072, 262080))
BATCHED = (
    DecodeShape(32, 8, 128, 64, 4096, 16),
    DecodeShape(32, 8, 128, 64, 32768, 16),
    DecodeShape(32, 8, 128, 8, 32768, 16),
    DecodeShape(12, 2, 256, 4, 65536, 16),
)
REPLAY_CAPTURE_KV = 40960
REPLAY_KV = (1024, 8192, 40960)


def gbs(nbytes: float, us: float) -> float:
    """GB/s (1e9 bytes per second) of ``nbytes`` moved in ``us`` microseconds."""
    return nbytes / us / 1e3


def fixed_cost_fit(points: list[tuple[int, float]]) -> dict:
    """Least-squares line through (bytes, microseconds): the fixed cost (intercept, us) and the
    marginal rate (1 / slope, GB/s)."""
    if len(points) < 2:
        raise ValueError(f"a line needs two points; got {len(points)}")
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    slope, intercept = statistics.linear_regression(xs, ys)
    return {"fixed_us": intercept, "marginal_gbs": gbs(1.0, slope) if slope > 0 else float("inf")}


def replay_within(graph_us: float, eager_us: float, tolerance: float = 0.10) -> bool:
    """The issue's bar for a graph replayed at another length: within ``tolerance`` of eager."""
    return graph_us <= eager_us * (1 + tolerance)


# ---- GPU side ---------------------------------------------------------------------------------


class Timer:
    """Times callables by the method in the module docstring."""

    def __init__(self, torch, reps: int):
        self.torch, self.reps = torch, reps
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def _timed(self, run) -> float:
        torch = self.torch
        times = []
        for _ in range(self.reps):
            self.flush.zero_()
            torch.cuda._sleep(SLEEP_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in times)

    def graph(self, fn) -> float:
        return self._timed(self.capture(fn).replay)

    def eager(self, fn) -> float:
        fn()
        return self._timed(fn)

    def capture(self, fn):
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up outside the graph (allocator, lazy module load)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph


class Case:
    """One decode shape's tensors: vLLM's paged cache (pages shuffled), the queries and the output."""

    def __init__(self, torch, ops, s: DecodeShape):
        from fa2patch.measure.bench import paged_cache

        self.torch, self.ops, self.s = torch, ops, s
        torch.manual_seed(0)
        self.k, self.v, self.table, self._keys_of = paged_cache(torch, s.b, s.kv, s.hkv, s.d, s.page)
        self.q = torch.randn(s.b, s.hq, s.d, device="cuda", dtype=torch.float16)
        self.out = torch.empty_like(self.q)
        self.cu_q = torch.arange(s.b + 1, device="cuda", dtype=torch.int32)
        self.cu_k = torch.arange(s.b + 1, device="cuda", dtype=torch.int32) * s.kv
        self.seqused = torch.full((s.b,), s.kv, device="cuda", dtype=torch.int32)

    def call(self):
        from fa2patch.compile.extension import varlen_fwd

        varlen_fwd(
            self.ops.varlen_fwd, self.q, self.k, self.v, self.out, self.cu_q, self.cu_k, 1, self.s.kv,
            self.s.d**-0.5, True, self.seqused, self.table,
        )  # fmt: skip

    def keys(self, i: int, n: int):
        k, v = self._keys_of(i)
        return k[:n], v[:n]

    def check(self, n: int, sample: int = 4) -> dict:
        """The output of sequences 0 .. sample-1 at ``n`` keys against the FP32 reference."""
        from fa2patch.measure.reference import attention_ref, compare

        torch = self.torch
        outs, refs, refs16 = [], [], []
        for i in range(min(sample, self.s.b)):
            k, v = self.keys(i, n)
            q = self.q[i : i + 1]
            refs.append(attention_ref(q, k, v, self.s.d**-0.5, True)[0])
            refs16.append(attention_ref(q, k, v, self.s.d**-0.5, True, compute_dtype=torch.float16)[0])
            outs.append(self.out[i : i + 1])
        return compare(torch.cat(outs), torch.cat(refs), torch.cat(refs16))


def routes(ops, torch) -> dict:
    stats = json.loads(ops.route_stats())["devices"][str(torch.cuda.current_device())]["routes"]
    return dict(stats)


def ours(timer: Timer, case: Case, decode: str, graph: bool = True) -> dict:
    """The call on our route with FA2PATCH_SM70_DECODE=decode; its time, numerics and route."""
    torch, ops = case.torch, case.ops
    os.environ["FA2PATCH_SM70_DECODE"] = decode
    before = routes(ops, torch)
    case.out.fill_(float("nan"))
    us = timer.graph(case.call) if graph else timer.eager(case.call)
    after = routes(ops, torch)
    counted = sorted(r for r, n in after.items() if n != before.get(r, 0))
    return {"us": us, "gbs": gbs(case.s.kv_bytes, us), "routes": counted, "numerics": case.check(case.s.kv)}


def sdpa_best(timer: Timer, torch, s: DecodeShape) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(s.b, s.hq, 1, s.d, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(s.b, s.hkv, s.kv, s.d, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn_like(k)
    best: dict = {}
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):

        def fn(backend=backend):
            with sdpa_kernel([backend]):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        try:
            us = timer.graph(fn)
        except RuntimeError as e:  # a backend that does not take the shape
            best.setdefault("refused", {})[backend.name] = str(e).splitlines()[0][:160]
            continue
        if "us" not in best or us < best["us"]:
            best.update(us=us, backend=backend.name)
    best["gbs"] = gbs(s.kv_bytes, best["us"]) if "us" in best else None
    return best


def streams(timer: Timer, torch, nbytes: int) -> dict:
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.float16).normal_()
    dst = torch.empty_like(src)
    copy_us = timer.graph(lambda: dst.copy_(src))
    read_us = timer.graph(lambda: torch.sum(src, dtype=torch.float32))
    return {"copy_gbs": gbs(2 * nbytes, copy_us), "read_gbs": gbs(nbytes, read_us), "read_us": read_us}


def replay_at_lengths(timer: Timer, torch, ops) -> list[dict]:
    """One call captured at REPLAY_CAPTURE_KV keys under the built-in rule, replayed at each of
    REPLAY_KV, against an eager call at that length (the issue's bar) and against a graph captured at
    that length (what the longer capture costs: an eager call carries its host-side checks, and at
    the longer lengths the rule's eager choice is the exact kernel)."""
    os.environ.pop("FA2PATCH_SM70_DECODE", None)  # the built-in rule, as vLLM runs it
    s = DecodeShape(6, 1, 256, 1, REPLAY_CAPTURE_KV, 784)
    case = Case(torch, ops, s)
    before = routes(ops, torch)
    graph = timer.capture(case.call)
    captured = sorted(r for r, n in routes(ops, torch).items() if n != before.get(r, 0))
    rows = []
    for n in REPLAY_KV:
        case.seqused.fill_(n)
        case.out.fill_(float("nan"))
        graph_us = timer._timed(graph.replay)
        numerics = case.check(n)
        eager_case = Case(torch, ops, DecodeShape(6, 1, 256, 1, n, 784))
        before = routes(ops, torch)
        eager_us = timer.eager(eager_case.call)
        eager_routes = sorted(r for r, m in routes(ops, torch).items() if m != before.get(r, 0))
        at_length_us = timer.graph(eager_case.call)
        rows.append(
            {
                "kv": n,
                "graph_us": graph_us,
                "graph_routes_at_capture": captured,
                "eager_us": eager_us,
                "eager_routes": eager_routes,
                "within_10pct": replay_within(graph_us, eager_us),
                "captured_at_length_us": at_length_us,
                "within_10pct_of_capture_at_length": replay_within(graph_us, at_length_us),
                "numerics": numerics,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", required=True)
    parser.add_argument("--json-file", required=True)
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--skip-exact", action="store_true", help="leave out the exact route's rows")
    args = parser.parse_args(argv)
    os.environ.setdefault("FA2PATCH_FORCE_SM70", "1")
    import torch

    torch.ops.load_library(args.artifact)
    ops = torch.ops._vllm_fa2_C
    timer = Timer(torch, args.reps)
    result: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps, "rows": []}
    for s in SINGLE + BATCHED:
        case = Case(torch, ops, s)
        row: dict = {"shape": asdict(s), "label": s.label, "kv_bytes": s.kv_bytes}
        row["decode"] = ours(timer, case, "1")
        if not args.skip_exact:
            row["exact"] = ours(timer, case, "0")
        del case
        row["sdpa"] = sdpa_best(timer, torch, s)
        row.update(streams(timer, torch, s.kv_bytes))
        torch.cuda.empty_cache()
        result["rows"].append(row)
        d = row["decode"]
        print(
            f"{s.label:48s} decode {d['us']:9.1f} us {d['gbs']:7.0f} GB/s {d['routes']} rel_l2 "
            f"{d['numerics']['rel_l2']:.1e} | exact {row.get('exact', {}).get('us', float('nan')):9.1f} us | "
            f"sdpa {row['sdpa'].get('us', float('nan')):9.1f} us ({row['sdpa'].get('backend')}) | "
            f"copy {row['copy_gbs']:5.0f} read {row['read_gbs']:5.0f} GB/s",
            flush=True,
        )
    single = [r for r in result["rows"] if r["shape"]["b"] == 1]
    result["fit_decode"] = fixed_cost_fit([(r["kv_bytes"], r["decode"]["us"]) for r in single])
    result["fit_sdpa"] = fixed_cost_fit([(r["kv_bytes"], r["sdpa"]["us"]) for r in single])
    print(f"fit decode: {result['fit_decode']}  sdpa: {result['fit_sdpa']}")
    result["replay"] = replay_at_lengths(timer, torch, ops)
    for r in result["replay"]:
        print(
            f"replay at {r['kv']:6d} keys (captured at {REPLAY_CAPTURE_KV}, {r['graph_routes_at_capture']}): "
            f"graph {r['graph_us']:.1f} us, eager {r['eager_us']:.1f} us {r['eager_routes']} "
            f"within 10%: {r['within_10pct']}; captured at this length {r['captured_at_length_us']:.1f} us, "
            f"within 10%: {r['within_10pct_of_capture_at_length']}; "
            f"rel_l2 {r['numerics']['rel_l2']:.1e} ok {r['numerics']['ok']}"
        )
    with open(args.json_file, "w") as f:
        json.dump(result, f, indent=1)
    bad = [r["label"] for r in result["rows"] if not r["decode"]["numerics"]["ok"]]
    bad += [f"replay {r['kv']}" for r in result["replay"] if not r["numerics"]["ok"]]
    if bad:
        print(f"numerics outside the contract: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
