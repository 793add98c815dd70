# SPDX-License-Identifier: BSD-3-Clause
"""The served workload's client side (issue 40 items 1-2): a mixed load against an OpenAI-compatible
server (vLLM's ``vllm serve``), greedy probes before and after it, and the soak's verdict.

Standard library only (``http.client``, threads), so the lab needs nothing carried for it and the CPU
tests run it against a stand-in server. Requests go to ``/v1/completions`` with the prompt as token ids
(no tokenizer on the client's side), greedy, ``ignore_eos``, streamed; a request marked to disconnect
closes its connection after that many streamed chunks (a client going away mid-stream).

    python3 -m fa2patch.lab.serve_load --port 8000 --model MODEL --count 400 --concurrency 32 \\
        --seconds 360 --json-file load.json

What it does not do: start the server, sample device memory or read the server's log (the recipe that
runs it does; ``judge`` takes what they recorded).
"""

import argparse
import http.client
import itertools
import json
import math
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

MEMORY_DRIFT_MIB = 64  # issue 40: device memory after warm-up within +-64 MiB for the whole soak


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_tokens: int
    disconnect_after: int | None = None  # close the stream after this many chunks


def log_uniform(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def mixed_workload(
    seed: int,
    count: int,
    vocab: int,
    prompt_range: tuple[int, int] = (10, 30_000),
    output_range: tuple[int, int] = (1, 512),
    shared_share: float = 0.3,
    disconnect_share: float = 0.1,
) -> list[Request]:
    """``count`` requests, reproducible from ``seed``: prompt lengths log-uniform over ``prompt_range``
    (some long enough for the long-prefill route), a ``shared_share`` of them extending one of three
    long shared prefixes (prefix caching then leaves a short chunk over a long cached history), outputs
    log-uniform over ``output_range``, a ``disconnect_share`` closing mid-stream."""
    rng = random.Random(seed)
    low, high = prompt_range
    prefixes = [[rng.randrange(1, vocab) for _ in range(rng.randint(high // 3, high * 2 // 3))] for _ in range(3)]
    out = []
    for _ in range(count):
        if rng.random() < shared_share:
            prefix = rng.choice(prefixes)
            prompt = prefix + [rng.randrange(1, vocab) for _ in range(rng.randint(low, min(2_000, high - len(prefix))))]
        else:
            prompt = [rng.randrange(1, vocab) for _ in range(log_uniform(rng, low, high))]
        tokens = log_uniform(rng, *output_range)
        cut = rng.randint(1, max(1, min(tokens, 32))) if rng.random() < disconnect_share else None
        out.append(Request(prompt, tokens, cut))
    return out


def probe_prompts(vocab: int, lengths: tuple[int, ...] = (64, 2_048, 12_000, 20_000)) -> list[Request]:
    """Fixed greedy probes (16 tokens each), sent before and after the load: their answers must not change."""
    rng = random.Random(12345)
    return [Request([rng.randrange(1, vocab) for _ in range(n)], 16) for n in lengths]


def _post(host: str, port: int, body: dict, timeout: float):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def stream(host: str, port: int, model: str, req: Request, timeout: float = 600.0) -> dict:
    """One streamed request: status ``completed`` (finish_reason "length", then [DONE]), ``disconnected``
    (as asked) or ``failed`` (with why), the streamed chunks, the time to the first and the mean time
    between them (per chunk: vLLM puts several tokens in one chunk when a client lags)."""
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0.0,
            "stream": True, "ignore_eos": True}  # fmt: skip
    start = time.perf_counter()
    result: dict = {"prompt_tokens": len(req.prompt), "max_tokens": req.max_tokens, "chunks": 0}
    conn = None
    try:
        conn, resp = _post(host, port, body, timeout)
        if resp.status != 200:
            return {**result, "status": "failed", "why": f"HTTP {resp.status}: {resp.read()[:300]!r}"}
        times, finish, done = [], None, False
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return {**result, "status": "failed", "why": f"error in stream: {chunk['error']}"}
            times.append(time.perf_counter() - start)
            finish = (chunk.get("choices") or [{}])[0].get("finish_reason") or finish
            result["chunks"] = len(times)
            if req.disconnect_after is not None and len(times) >= req.disconnect_after:
                conn.close()
                return {**result, "status": "disconnected", "ttft_s": times[0]}
        # ignore_eos and max_tokens: a whole answer ends with finish_reason "length", then [DONE].
        if not (times and done and finish == "length"):
            why = f"the stream ended after {len(times)} chunks, [DONE] {done}, finish_reason {finish!r}"
            return {**result, "status": "failed", "why": why}
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return {**result, "status": "completed", "ttft_s": times[0], "tpot_s": statistics.fmean(gaps) if gaps else None}
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {**result, "status": "failed", "why": f"{type(exc).__name__}: {exc}"}
    finally:
        if conn is not None:
            conn.close()


def probe(host: str, port: int, model: str, req: Request, salt: str, timeout: float = 600.0) -> dict:
    """A greedy, unstreamed probe: its text (or why it failed). ``salt`` (vLLM's cache_salt) keeps each
    phase's probes off the prefix cache the other phase filled, so both compute the same way."""
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0.0,
            "ignore_eos": True, "cache_salt": salt}  # fmt: skip
    try:
        conn, resp = _post(host, port, body, timeout)
        try:
            payload = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            return {"ok": False, "why": f"HTTP {resp.status}: {payload[:300]!r}"}
        return {"ok": True, "text": json.loads(payload)["choices"][0]["text"]}
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as exc:
        return {"ok": False, "why": f"{type(exc).__name__}: {exc}"}


def run_load(host: str, port: int, model: str, requests: list[Request], concurrency: int, seconds: float) -> dict:
    """The requests through ``concurrency`` clients, new ones started until ``seconds`` have passed;
    each request's result and the summary."""
    deadline = time.monotonic() + seconds
    lock, results = threading.Lock(), []

    def client(req: Request) -> None:
        if time.monotonic() >= deadline:
            return
        r = stream(host, port, model, req)
        with lock:
            results.append(r)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(client, requests))
    return {"results": results, "summary": summarize(results, time.perf_counter() - start)}


def _quantile(xs: list[float], q: float) -> float | None:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) >= 2 else (xs[0] if xs else None)


def summarize(results: list[dict], wall_s: float) -> dict:
    by = {s: sum(r["status"] == s for r in results) for s in ("completed", "disconnected", "failed")}
    ttft = [r["ttft_s"] for r in results if r.get("ttft_s") is not None]
    tpot = [r["tpot_s"] for r in results if r.get("tpot_s") is not None]
    return {
        "sent": len(results),
        **by,
        "wall_s": wall_s,
        "chunks_per_s": sum(r["chunks"] for r in results) / wall_s if wall_s > 0 else None,
        "ttft_p50_s": _quantile(ttft, 50),
        "ttft_p99_s": _quantile(ttft, 99),
        "tpot_p50_s": _quantile(tpot, 50),
        "tpot_p99_s": _quantile(tpot, 99),
        "failures": [r["why"] for r in results if r["status"] == "failed"][:20],
    }


def memory_drift_mib(samples: list[tuple[float, float]], warmup_s: float) -> float | None:
    """The largest distance (MiB) of the used device memory, sampled as (seconds, MiB), from its first
    sample after ``warmup_s``; None without such samples."""
    after = [mib for t, mib in samples if t >= warmup_s]
    return max(abs(m - after[0]) for m in after) if after else None


def judge(record: dict) -> dict:
    """The soak's targets (issue 40) on what a run recorded: ``load`` (run_load's summary),
    ``probes_before``/``probes_after`` (probe results), ``memory`` ((seconds, MiB) samples) with
    ``warmup_s``, ``server_errors`` (the server log's error lines), ``route_stats`` (the extension's last
    JSON, or None for a run on another backend; ``expect_route_stats``: it must be there),
    ``expect_long_prefill`` (some prompt qualifies and the model's heads are the route's) and
    ``expected_fallbacks`` (the fallback reasons a run's injected fault must cause, and no others)."""
    reasons = []
    load = record["load"]
    if load["failed"]:
        reasons.append(f"{load['failed']} failed requests: {load['failures'][:3]}")
    if record["server_errors"]:
        reasons.append(f"{len(record['server_errors'])} error lines in the server log: {record['server_errors'][:3]}")
    drift = memory_drift_mib(record["memory"], record["warmup_s"])
    if drift is None or drift > MEMORY_DRIFT_MIB:
        reasons.append(f"device memory after warm-up moved {drift} MiB (at most {MEMORY_DRIFT_MIB})")
    before, after = record["probes_before"], record["probes_after"]
    if not all(p["ok"] for p in before + after):
        reasons.append("a probe failed: " + "; ".join(p["why"] for p in before + after if not p["ok"]))
    elif [p["text"] for p in before] != [p["text"] for p in after]:
        reasons.append("probe answers changed over the soak")
    stats = record.get("route_stats")
    if stats is None and record.get("expect_route_stats"):
        reasons.append("no route_stats line in the server log: fa2patch's backend may not have been in use")
    if stats is not None:
        device: dict = next(iter(stats["devices"].values()), {})
        fallbacks, expected = device.get("fallbacks", {}), set(record.get("expected_fallbacks", ()))
        if set(fallbacks) - expected:
            reasons.append(f"route fallbacks: {fallbacks}")
        missing = sorted(expected - set(fallbacks))
        if missing:
            reasons.append(f"the injected fault caused no {missing} fallback")
        elif (
            not expected and record.get("expect_long_prefill") and not device.get("routes", {}).get("sm70-gqa-prefill")
        ):
            reasons.append("no call took the long-prefill route")
    return {"pass": not reasons, "reasons": reasons, "memory_drift_mib": drift}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--count", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=360.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-file", required=True)
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        parser.error(f"--host: expected this machine (127.0.0.1), actual {args.host!r}")
    probes = probe_prompts(args.vocab)
    before = [probe(args.host, args.port, args.model, p, "before") for p in probes]
    requests = mixed_workload(args.seed, args.count, args.vocab)
    load = run_load(args.host, args.port, args.model, requests, args.concurrency, args.seconds)
    after = [probe(args.host, args.port, args.model, p, "after") for p in probes]
    doc = {"requests": [asdict(r) | {"prompt": len(r.prompt)} for r in requests], "load": load["summary"],
           "results": load["results"], "probes_before": before, "probes_after": after}  # fmt: skip
    with open(args.json_file, "w") as f:
        json.dump(doc, f)
    print(json.dumps(load["summary"], indent=1))
    return 0 if not load["summary"]["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
