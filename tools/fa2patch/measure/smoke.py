# SPDX-License-Identifier: BSD-3-Clause
"""smoke: launch each route the build registers on small problems, against an FP32 reference.

The extension's ``build_info()`` JSON lists its routes, each either a name (an SM70 route:
called through ``varlen_fwd`` with the lab switch FA2PATCH_FORCE_SM70=1, so it runs on any
GPU) or an object ``{"name": ..., "op": ..., "env": {VAR: value}}`` naming the operator and
the environment that selects it. Each route runs in its own subprocess with that environment.
"""

import json
import sys
from pathlib import Path

from fa2patch.common.errors import NothingToLaunch
from fa2patch.common.routes import DECODE
from fa2patch.compile.extension import (
    load_build_info,
    load_manifest,
    manifest_path,
    pin_route,
    probe_gpu,
    python_json,
    route_entry,
    varlen_fwd,
)

# (batch of (seqlen_q, seqlen_k), heads_q, heads_kv, head_dim, causal)
# Routes whose op is varlen_fwd run these; the long-prefill op (one sequence, causal, head dim 256)
# runs PREFILL_PROBLEMS, the decode kernel DECODE_PROBLEMS.
PROBLEMS = [
    ([(1, 1), (17, 33), (64, 64)], 4, 2, 64, True),
    ([(5, 300), (128, 128)], 6, 1, 128, False),
    ([(3, 40)], 2, 1, 256, True),
]
# The decode kernel's route (varlen_fwd with its switch): calls it takes, of one query row per
# sequence (groups of 6, 4 and 16 rows: one CTA, one CTA, two row blocks) and of a few (speculative
# decoding's verification: 3 x 2 rows per KV head).
DECODE_PROBLEMS = [
    ([(1, 1), (1, 77), (1, 300)], 6, 1, 256, True),
    ([(1, 1000), (1, 17)], 8, 2, 128, True),
    ([(1, 40)], 16, 1, 64, False),
    ([(3, 50), (1, 9)], 4, 2, 128, True),
]
PREFILL_PROBLEMS = [
    ([(1, 1)], 6, 1, 256, True),
    ([(130, 300)], 6, 1, 256, True),
    ([(64, 9000)], 8, 2, 256, True),
]


def smoke(build_dirs: list[Path]) -> list[dict]:
    gpu = probe_gpu()
    if "error" in gpu or not gpu.get("cuda"):
        raise NothingToLaunch(
            "nothing launched: torch sees no CUDA GPU on this machine "
            f"(torch.cuda.is_available() is False){gpu.get('error', '')}"
        )
    built = []
    for d in build_dirs:
        if manifest_path(d).is_file():
            manifest, artifact = load_manifest(d)
            built.append((manifest["arch"], artifact))
    runnable = [(a, art) for a, art in built if a == gpu["capability"]]
    if not runnable:
        raise NothingToLaunch(
            f"nothing launched: the GPU is {gpu['name']} ({gpu['capability']}), the builds are for "
            f"{', '.join(a for a, _ in built) or 'nothing (run fa2patch build)'}"
        )
    results = []
    for arch, artifact in runnable:
        info = load_build_info(artifact)
        if "error" in info:
            results.append({"arch": arch, "route": "load", "ok": False, "detail": info["error"]})
            continue
        if not info.get("routes"):
            raise NothingToLaunch(
                f"nothing launched: {artifact} registers no routes "
                "(build_info().routes is empty: no kernels in this patch series yet)"
            )
        for route in map(route_entry, info["routes"]):
            r = python_json(
                "from fa2patch.measure.smoke import probe_route; probe_route()",
                str(artifact),
                json.dumps(route),
                env=route.get("env"),
            )
            results.append(
                {"arch": arch, "route": route["name"], **r, "ok": "error" not in r and all(c["ok"] for c in r["cases"])}
            )
    return results


def probe_route() -> None:
    """Subprocess side: run PROBLEMS through one route's operator and print the comparison."""
    import torch

    from fa2patch.measure.reference import attention_ref, compare

    artifact, route = sys.argv[1], json.loads(sys.argv[2])
    torch.ops.load_library(artifact)
    op = getattr(torch.ops._vllm_fa2_C, route["op"])
    pin_route(torch.ops._vllm_fa2_C, route)
    prefill = route["op"] == "gqa_prefill_fwd"
    torch.manual_seed(0)
    cases = []
    problems = PREFILL_PROBLEMS if prefill else DECODE_PROBLEMS if route["name"] == DECODE else PROBLEMS
    for seqs, hq, hk, d, causal in problems:
        cu_q = torch.tensor(
            [0] + [sum(s[0] for s in seqs[: i + 1]) for i in range(len(seqs))], dtype=torch.int32, device="cuda"
        )
        cu_k = torch.tensor(
            [0] + [sum(s[1] for s in seqs[: i + 1]) for i in range(len(seqs))], dtype=torch.int32, device="cuda"
        )
        q = torch.randn(int(cu_q[-1]), hq, d, dtype=torch.float16, device="cuda")
        k = torch.randn(int(cu_k[-1]), hk, d, dtype=torch.float16, device="cuda")
        v = torch.randn_like(k)
        out = torch.full_like(q, float("nan"))
        scale = d**-0.5
        if prefill:
            op(q, k, v, out, None, k.shape[0], scale, None)
        else:
            varlen_fwd(op, q, k, v, out, cu_q, cu_k, max(s[0] for s in seqs), max(s[1] for s in seqs), scale, causal)
        torch.cuda.synchronize()
        for i, (sq, sk) in enumerate(seqs):
            sl_q, sl_k = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
            ref, _ = attention_ref(q[sl_q], k[sl_k], v[sl_k], scale, causal)
            ref16, _ = attention_ref(q[sl_q], k[sl_k], v[sl_k], scale, causal, compute_dtype=torch.float16)
            cases.append(
                {"shape": f"sq={sq} sk={sk} hq={hq} hk={hk} d={d} causal={causal}", **compare(out[sl_q], ref, ref16)}
            )
    print(json.dumps({"cases": cases}))
