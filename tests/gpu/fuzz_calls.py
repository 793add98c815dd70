# SPDX-License-Identifier: BSD-3-Clause
"""Fuzz ``_vllm_fa2_C.varlen_fwd`` through vLLM's interface (issue 40 item 5a), in one process.

    python tests/gpu/fuzz_calls.py <artifact.so | reference-op> --count N [--seed S] [--check-every K]
                                   [--json-file F]

Generates N random calls in sm70_cases.py's spec language (which builds the tensors and holds the FP32
reference): valid ones over batches, lengths (0 rows and 0 keys included), head counts and groups,
head dims 32-256, paged caches of 16-64 tokens or contiguous K/V, causal, windows, softcap, ALiBi,
strided views, vLLM's padded block tables and uninitialised ``cu_seqlens_k``, the decode kernel's
switch and split-KV counts; and invalid ones: a block-table entry, a ``cu_seqlens`` or ``seqused_k``
that lies, a misaligned q or k. An invalid call must end in a typed error with a message (IndexError,
ValueError, RuntimeError, TypeError, NotImplementedError: what a torch op raises) without writing into
``out`` or past it; a valid call in an output within the numerics contract -- checked against the FP32
reference for every K-th valid call, and for the others finite, inside ``out`` and leaving its guard
rows untouched (a valid call refused is a failure: every spec generated is one the op serves). After every call the
CUDA context must still work. An invalid call that returns normally is a failure too. Exit 1 on any
failure; the summary (and each failure's spec, to rerun with sm70_cases.py) is printed as JSON.
``reference-op`` runs the same loop through sm70_cases' exact CPU stand-in (the harness's own test).
Run under ``compute-sanitizer --tool memcheck`` with a smaller N for the sanitized sample.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sm70_cases

HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)
TYPED = ("IndexError", "ValueError", "RuntimeError", "TypeError", "NotImplementedError")
INVALID = ("bad_block_table", "bad_cu_seqlens_q", "bad_cu_seqlens_k", "bad_seqused_k", "misaligned")


def valid_spec(rng: random.Random, seed: int) -> dict:
    """One random valid call."""
    hkv = rng.choice((1, 1, 2, 4, 8))
    hq = hkv * rng.choice((1, 2, 4, 6, 8))
    decode = rng.random() < 0.4  # one query row per sequence: the decode kernel's calls
    seqlens = [
        [1 if decode else rng.choice((0, 1, 2, rng.randint(3, 160))), rng.choice((0, 1, rng.randint(2, 1200)))]
        for _ in range(rng.randint(1, 6))
    ]
    if not any(q for q, _ in seqlens):
        seqlens[0][0] = 1
    spec = {"seqlens": seqlens, "hq": hq, "hkv": hkv, "d": rng.choice(HEAD_DIMS), "seed": seed}
    spec["causal"] = rng.random() < 0.6
    spec["page_size"] = rng.choice((None, 16, 16, 32, 64))
    if spec["page_size"]:
        spec["cu_seqlens_k"] = rng.choice(("cumulative", "zeros", "garbage"))
        spec["extra_blocks"] = rng.choice((0, 0, 3))
    if rng.random() < 0.15:
        spec["window"] = [rng.randint(0, 300), rng.choice((-1, 0, rng.randint(1, 50)))]
    if rng.random() < 0.1:
        spec["softcap"] = rng.choice((10.0, 30.0))
    elif rng.random() < 0.1:
        spec["alibi"] = True
    spec["strided"] = rng.random() < 0.2
    spec["decode_kernel"] = rng.choice((None, None, True, False))
    spec["prefill_splits"] = rng.choice((0, 1, 1, 2, 3))
    return spec


def invalid_spec(rng: random.Random, seed: int) -> dict:
    """A valid call with one input that lies (sm70_cases' expect_error keys)."""
    spec = valid_spec(rng, seed)
    spec["expect_error"] = True
    b = rng.randrange(len(spec["seqlens"]))
    n = len(spec["seqlens"]) + 1
    kinds = [k for k in INVALID if spec["page_size"] or k not in ("bad_block_table", "bad_seqused_k")]
    # The op checks alignment where an SM70 kernel runs: not for a call without keys (FA2 fills out
    # with zeros), and not on q where FA2's decode swap copies it; so misalign k, and q only with rows.
    if not any(k for _, k in spec["seqlens"]):
        kinds.remove("misaligned")
    if spec["page_size"]:
        kinds.remove("bad_cu_seqlens_k")  # not read for a paged cache (vLLM leaves it uninitialised)
        if spec["seqlens"][b][1] == 0:
            kinds.remove("bad_block_table")  # a sequence without keys reads no block
    kind = rng.choice(kinds)
    if kind == "bad_block_table":
        spec[kind] = [b, rng.randrange(-(-spec["seqlens"][b][1] // spec["page_size"])), rng.choice((-1, "num_blocks"))]
    elif kind == "bad_cu_seqlens_q":
        spec[kind] = [rng.choice((-1, 5)) if i == 0 else 10**6 for i in range(n)]  # negative or past q's rows
    elif kind == "bad_cu_seqlens_k":
        spec[kind] = [0] * (n - 1) + [10**6]  # past k's rows
    elif kind == "bad_seqused_k":
        spec[kind] = [rng.choice((-5, 10**6)) for _ in range(n - 1)]
    else:
        spec[kind] = rng.choice(("q", "k")) if any(q > 1 for q, _ in spec["seqlens"]) else "k"
    return spec


def generate(seed: int, count: int, invalid_share: float = 0.3) -> list[dict]:
    """``count`` specs, a share of them invalid, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [
        (invalid_spec if rng.random() < invalid_share else valid_spec)(rng, seed * 1_000_003 + i) for i in range(count)
    ]


def outcome(op, raw: dict, device, check: bool) -> dict:
    """One call's verdict: ``ok`` and why not."""
    import torch

    spec = sm70_cases._spec(raw)
    sm70_cases.switch_decode_kernel(spec)
    if device == "cuda" and hasattr(torch.ops._vllm_fa2_C, "_routing_prefill_splits_for_testing"):
        torch.ops._vllm_fa2_C._routing_prefill_splits_for_testing(int(spec["prefill_splits"]))
    inputs = sm70_cases.build_inputs(spec, device)
    if spec["expect_error"]:
        r = sm70_cases.run_error(op, spec, inputs)
        typed = r["raised"] in TYPED and bool(r["message"])
        why = None if typed else f"raised {r['raised']!r} ({r['message']!r}) where a typed error was due"
        if typed and not (r.get("out_untouched", True) and r.get("guard_ok", True) is not False):
            why = "raised, but wrote into out or past it"
        return {"kind": "invalid", "raised": r["raised"], "device_ok": r.get("device_ok", False), "why": why}
    if check:
        r = sm70_cases.run_numerics(op, spec, inputs)
        if r.get("raised"):
            return {"kind": "refused", "raised": r["raised"], "device_ok": device_ok(device),
                    "why": f"a valid call refused: {r['raised']}: {r.get('message')!r}"}  # fmt: skip
        return {"kind": "checked", "device_ok": device_ok(device), "why": None if r["ok"] else f"numerics {r}"}
    buf, out = sm70_cases.new_out(inputs, spec["hq"], spec["d"])
    r = sm70_cases.error_of(lambda: sm70_cases.call_op(op, spec, inputs, out), out.device)
    if r["raised"]:
        return {"kind": "refused", "raised": r["raised"], "device_ok": r["device_ok"],
                "why": f"a valid call refused: {r['raised']}: {r['message']!r}"}  # fmt: skip
    g = sm70_cases.GUARD_ROWS
    clean = bool(torch.isfinite(out).all()) and bool(
        torch.isnan(buf[:g]).all() and torch.isnan(buf[g + len(out) :]).all()
    )
    return {
        "kind": "run",
        "device_ok": r["device_ok"],
        "why": None if clean else "non-finite output or a guard row written",
    }


def device_ok(device) -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        return torch.ones(4, device=device).sum().item() == 4.0
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", help="the extension, or reference-op (the harness's CPU stand-in)")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-every", type=int, default=5, help="the FP32 reference for every K-th valid call")
    parser.add_argument("--json-file")
    args = parser.parse_args(argv)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    if args.artifact == "reference-op":
        op, device = sm70_cases._reference_op, "cpu"
        torch.cuda.synchronize = lambda *a, **k: None
    else:
        torch.ops.load_library(args.artifact)
        op, device = torch.ops._vllm_fa2_C.varlen_fwd, "cuda"
    t0, counts, failures, valid_seen = time.perf_counter(), {}, [], 0
    for spec in generate(args.seed, args.count):
        check = not spec.get("expect_error") and valid_seen % args.check_every == 0
        valid_seen += not spec.get("expect_error")
        r = outcome(op, spec, device, check)
        counts[r["kind"]] = counts.get(r["kind"], 0) + 1
        if r["why"] or (device == "cuda" and not r["device_ok"]):
            failures.append({"spec": spec, **r})
            if device == "cuda" and not r["device_ok"]:
                break  # a sticky CUDA error: nothing after it would mean anything
    summary = {"calls": sum(counts.values()), "by_kind": counts, "failures": len(failures),
               "first_failures": failures[:20], "seconds": round(time.perf_counter() - t0, 1),
               "seed": args.seed, "check_every": args.check_every}  # fmt: skip
    text = json.dumps(summary, indent=1)
    print(text)
    if args.json_file:
        Path(args.json_file).write_text(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sm70_cases.run_script(lambda argv: main(argv[1:]))
