# SPDX-License-Identifier: BSD-3-Clause
"""Run ONE routing scenario of ``_vllm_fa2_C.varlen_fwd`` (patch 0004) and print one JSON line.

    python tests/gpu/routing_cases.py <artifact.so> '<json>'

The JSON holds ``scenario``, ``spec`` (an sm70_cases spec: the inputs and the FP32 reference
come from there) and optionally ``override`` (call arguments that replace the spec's: max_seqlen_q,
max_seqlen_k, scale), ``vllm_cache`` (paged k/v as views of vLLM's KV cache, row stride 2 d),
``sms``: the SM count routing's split-KV rule uses (routing_sms: "no_split", the default,
"split", "device" or a number); ``prefill_splits`` (the router's split-KV test hook, 0: off);
``profile``: {"decisions": [...], "corrupt": null or a name of CORRUPTIONS} -- a routing profile
for this device and this artifact (its sha256), written to a temporary file (corrupted as named),
set in FA2PATCH_ROUTING_PROFILE and installed with fa2patch_vllm.routing_profile.install() (as the
vLLM plugin does; not for the corruption "not_installed") before any op runs; ``decide``: a list of keyword arguments
of _routing_decide_for_testing, whose decisions the "route" and "decide" scenarios report. Run
with FA2PATCH_FORCE_SM70=1 off V100. Scenarios:

  route          one call checked against the FP32 reference; the route counters' change, the
                 decisions asked for (``decide``), route_stats()'s "profile", the lines logged
  decide         only the decisions asked for (no attention runs), route_stats()'s "profile" and
                 the lines logged
  error          one call that must raise a typed error before any launch (out untouched)
  oom            the workspace test hook forces the out-of-memory fallback (two calls, one log line): out and LSE
                 must be bitwise those of the exact route (the env switch at "0"), and differ in route from
                 the same call without the hook
  graph          a CUDA graph captured around varlen_fwd replays with the exact route's result
  decode_split   a decode call with num_splits 0 is bitwise the same call with ``splits`` given
  streams        two threads on two streams, each several calls on its own inputs: every result
                 bitwise equal to the same call made alone
  devices        like streams, one thread per device (needs two GPUs)
  tp_pair        the same shapes on two devices route identically (needs two GPUs)
  corrupt_graph  a captured graph replayed with a corrupted block_table and seqused_k: no
                 out-of-bounds access (compute-sanitizer), finite output, and the next eager call
                 raises IndexError naming the previous call
  split_graph    with ``prefill_splits``: a CUDA graph captured around a split-KV call replays with
                 out and LSE bitwise those of the same call made eagerly
  split_oom      with ``prefill_splits``: the OOM test hook refuses the split buffers (twice, logged
                 once): out and LSE bitwise those of the unsplit exact route (the hook at 1); the
                 same call without the OOM hook splits again
  decode_rule    one call with FA2PATCH_SM70_DECODE unset (routing's built-in rule for the decode
                 kernel): its route counted, the contract against the reference, and its out and
                 LSE bitwise those of the same call with the switch at "1" and at "0"
"""

import hashlib
import json
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "tools"), str(HERE.parents[1] / "packaging")]

import prefill_cases  # noqa: E402
import sm70_cases  # noqa: E402
from fa2patch_vllm import routing_profile  # noqa: E402

ENV = "VLLM_FLASH_V100_PREFILL_D256_GQA_ARCH_128K_EXPERIMENTAL"


def stats(ops, device=0) -> dict:
    return json.loads(ops.route_stats())["devices"][str(device)]


def delta(before: dict, after: dict) -> dict:
    """What the calls between two route_stats() snapshots added, per counter group."""
    return {
        group: {k: v - before[group].get(k, 0) for k, v in after[group].items() if v != before[group].get(k, 0)}
        for group in ("routes", "fallbacks", "exact_reasons")
    }


def call(ops, spec, inputs, out):
    import torch

    ret = sm70_cases.call_op(ops.varlen_fwd, spec, inputs, out)
    torch.cuda.synchronize()
    return ret[1]


def exact_route(ops, spec, inputs):
    """out and LSE of the exact route (the rollback switch), on fresh outputs."""
    previous = os.environ.get(ENV)
    os.environ[ENV] = "0"
    try:
        out = sm70_cases.new_out(inputs, spec["hq"], spec["d"])[1]
        return out, call(ops, spec, inputs, out)
    finally:
        if previous is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = previous


def bitwise(a, b) -> bool:
    import torch

    return a.shape == b.shape and torch.equal(
        a.view(torch.uint8) if a.dtype != torch.float32 else a.view(torch.int32),
        b.view(torch.uint8) if b.dtype != torch.float32 else b.view(torch.int32),
    )


def logged_lines(fn):
    """fn()'s result and the lines it logged. TORCH_WARN reaches Python as a warning, or (outside
    torch's Python warning handler, as for torch.ops calls) c10's default handler writes it to
    stderr: collect both."""
    import torch

    with warnings.catch_warnings(record=True) as logged, tempfile.TemporaryFile("w+") as err:
        warnings.simplefilter("always")
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            result = fn()
            torch.cuda.synchronize()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return result, [str(w.message) for w in logged] + err.read().splitlines()


def decisions(ops, asked) -> list:
    return [json.loads(ops._routing_decide_for_testing(**kw)) for kw in asked]


def two_calls(ops, spec, inputs):
    """The same call twice on fresh outputs; the last out and LSE."""
    for _ in range(2):
        out = sm70_cases.new_out(inputs, spec["hq"], spec["d"])[1]
        lse = call(ops, spec, inputs, out)
    return out, lse


def scenario_route(ops, spec, inputs, asked=()) -> dict:
    before = stats(ops)

    def run():
        decided = decisions(ops, asked)  # first: the profile is read at the first SM70 call
        return decided, sm70_cases.run_numerics(ops.varlen_fwd, spec, inputs)

    (decided, result), lines = logged_lines(run)
    result.update(delta(before, stats(ops)))
    result.update(decided=decided, profile=json.loads(ops.route_stats())["profile"], log_lines=lines)
    return result


def scenario_decide(ops, spec, inputs, asked=()) -> dict:
    decided, lines = logged_lines(lambda: decisions(ops, asked))
    return {"decided": decided, "profile": json.loads(ops.route_stats())["profile"], "log_lines": lines}


def scenario_decode_split(ops, spec, inputs, splits: int) -> dict:
    """A decode call (FA2's seqlen_q/ngroups swap) with num_splits 0, routing's decode split
    (routing::decode_splits), against the same call with ``splits`` given explicitly: bitwise equal
    (the split count decides the partition boundaries); and the contract against the reference."""
    result = sm70_cases.run_numerics(ops.varlen_fwd, spec, inputs)
    auto = two_calls(ops, spec, inputs)
    given = two_calls(ops, {**spec, "num_splits": splits}, inputs)
    return {**result, "identical_to_given": bitwise(auto[0], given[0]) and bitwise(auto[1], given[1])}


def scenario_decode_rule(ops, spec, inputs) -> dict:
    """The call with the decode kernel's switch unset, counted and checked; then the same call with
    the switch at "1" and "0" (identical_to_1, identical_to_0): the rule's choice is one of them,
    kernel and split alike."""
    os.environ.pop(sm70_cases.DECODE_ENV, None)
    before = stats(ops)
    result = sm70_cases.run_numerics(ops.varlen_fwd, spec, inputs)
    result.update(delta(before, stats(ops)))
    rule = two_calls(ops, spec, inputs)
    for value in ("1", "0"):
        os.environ[sm70_cases.DECODE_ENV] = value
        forced = two_calls(ops, spec, inputs)
        result[f"identical_to_{value}"] = bitwise(rule[0], forced[0]) and bitwise(rule[1], forced[1])
    return result


def scenario_split_graph(ops, spec, inputs) -> dict:
    import torch

    eager = sm70_cases.new_out(inputs, spec["hq"], spec["d"])[1]
    eager_lse = call(ops, spec, inputs, eager)
    out = sm70_cases.new_out(inputs, spec["hq"], spec["d"])[1]
    graph = torch.cuda.CUDAGraph()
    before = stats(ops)
    with torch.cuda.graph(graph):
        lse = sm70_cases.call_op(ops.varlen_fwd, spec, inputs, out)[1]
    captured = delta(before, stats(ops))
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return {
        "captured": captured,
        "identical_to_eager": bitwise(out, eager) and bitwise(lse, eager_lse),
        "finite": bool(torch.isfinite(out).all()),
    }


def scenario_split_oom(ops, spec, inputs) -> dict:
    splits = json.loads(ops.route_stats())["split_kv"]["testing_splits"]
    ops._routing_prefill_splits_for_testing(1)  # the unsplit exact route, same call
    ref_out = sm70_cases.new_out(inputs, spec["hq"], spec["d"])[1]
    ref_lse = call(ops, spec, inputs, ref_out)
    ops._routing_prefill_splits_for_testing(splits)
    result, out, lse = forced_oom(ops, spec, inputs, "splitkv_oom")
    return {**result, "identical_to_unsplit": bitwise(out, ref_out) and bitwise(lse, ref_lse)}


def forced_oom(ops, spec, inputs, reason: str) -> tuple[dict, object, object]:
    """Two calls under the out-of-memory test hook (counted twice, logged once), then one without it:
    the counter changes of both, the log lines naming ``reason``, and the hooked calls' out and lse."""
    import torch

    ops._workspace_force_oom_for_testing(True)
    try:
        before = stats(ops)
        (out, lse), lines = logged_lines(lambda: two_calls(ops, spec, inputs))
        counted = delta(before, stats(ops))
    finally:
        ops._workspace_force_oom_for_testing(False)
    before = stats(ops)
    call(ops, spec, inputs, sm70_cases.new_out(inputs, spec["hq"], spec["d"])[1])
    torch.cuda.synchronize()
    result = {
        "oom": counted,
        "without_hook": delta(before, stats(ops)),
        "log_lines": [line for line in lines if reason in line],
    }
    return result, out, lse


# Ways to spoil a routing profile (routing_cases' "profile" key): each returns the file's text.
def _edit(change):
    def corrupt(doc):
        change(doc)
        return json.dumps(doc)

    return corrupt


CORRUPTIONS = {
    "bad_json": lambda doc: json.dumps(doc)[:-1],  # the closing brace cut off
    "wrong_format": _edit(lambda d: d.update(format="fa2patch-routing-profile/2")),
    "unknown_key": _edit(lambda d: d.update(decision=[])),  # a typo beside "decisions"
    "bad_range": _edit(lambda d: d["decisions"][0].update(q=[2048, 1024])),
    "unknown_route": _edit(lambda d: d["decisions"][0].update(route="sm70-fast")),
    "other_device_name": _edit(lambda d: d["device"].update(name=d["device"]["name"] + " (another card)")),
    "other_sm_count": _edit(lambda d: d["device"].update(sms=d["device"]["sms"] + 1)),
    "other_capability": _edit(
        lambda d: d["device"].update(capability=[d["device"]["capability"][0], d["device"]["capability"][1] + 1])
    ),
    "other_sha256": _edit(lambda d: d.update(extension_sha256="0" * 64)),
    "unreadable": None,  # the path names no file
    "directory": None,  # the path names a folder
    "not_installed": None,  # a good file in FA2PATCH_ROUTING_PROFILE that nothing installed
}


def write_profile(artifact: str, profile: dict, folder: Path) -> tuple[str, dict]:
    """A profile for device 0 and this artifact in `folder`, corrupted as profile["corrupt"] says;
    its path and the document before the corruption."""
    import torch

    props = torch.cuda.get_device_properties(0)
    doc = {
        "format": "fa2patch-routing-profile/1",
        "device": {"name": props.name, "sms": props.multi_processor_count, "capability": [props.major, props.minor]},
        "extension_sha256": hashlib.sha256(Path(artifact).read_bytes()).hexdigest(),
        "software": {"torch": torch.__version__, "fa2patch": "test"},
        "clocks_seen": {},
        "measured": [],
        "decisions": profile.get("decisions", []),
    }
    original = json.loads(json.dumps(doc))
    corrupt = profile.get("corrupt")
    if corrupt == "unreadable":
        return str(folder / "missing.json"), original
    if corrupt == "directory":
        return str(folder), original
    path = folder / "profile.json"
    spoil = CORRUPTIONS[corrupt] if corrupt else None
    path.write_text(spoil(doc) if spoil else json.dumps(doc))
    return str(path), original


def scenario_oom(ops, spec, inputs) -> dict:
    ref_out, ref_lse = exact_route(ops, spec, inputs)
    result, out, lse = forced_oom(ops, spec, inputs, "workspace_oom")
    return {**result, "identical_to_exact": bitwise(out, ref_out) and bitwise(lse, ref_lse)}


def scenario_graph(ops, spec, inputs) -> dict:
    import torch

    ref_out, ref_lse = exact_route(ops, spec, inputs)
    out = sm70_cases.new_out(inputs, spec["hq"], spec["d"])[1]
    call(ops, spec, inputs, out)  # eager warm-up (long-prefill route when eligible)
    eager_routes = json.loads(ops.route_stats())
    graph = torch.cuda.CUDAGraph()
    before = stats(ops)
    out.fill_(float("nan"))
    with torch.cuda.graph(graph):
        lse = sm70_cases.call_op(ops.varlen_fwd, spec, inputs, out)[1]
    captured = delta(before, stats(ops))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return {
        "captured": captured,
        "identical_to_exact": bitwise(out, ref_out) and bitwise(lse, ref_lse),
        "eager_devices": list(eager_routes["devices"]),
    }


def concurrent(ops, spec, devices, streams_per_device, calls) -> dict:
    """Threads (one per stream) issuing `calls` calls each on their own inputs; every result is
    compared bitwise with the same call made alone beforehand."""
    import torch

    jobs = []
    for device in devices:
        for s in range(streams_per_device):
            with torch.cuda.device(device):
                inputs = sm70_cases.build_inputs({**spec, "seed": 100 * device + s}, f"cuda:{device}")
                alone = sm70_cases.new_out(inputs, spec["hq"], spec["d"])[1]
                lse = call(ops, spec, inputs, alone)
                jobs.append(
                    {
                        "device": device,
                        "inputs": inputs,
                        "alone": (alone, lse),
                        "stream": torch.cuda.Stream(device=device),
                        "results": [],
                        "error": None,
                    }
                )
    before = {d: stats(ops, d) for d in devices}
    start = threading.Barrier(len(jobs))

    def work(job):
        try:
            with torch.cuda.device(job["device"]), torch.cuda.stream(job["stream"]):
                start.wait()
                for _ in range(calls):
                    out = sm70_cases.new_out(job["inputs"], spec["hq"], spec["d"])[1]
                    lse = sm70_cases.call_op(ops.varlen_fwd, spec, job["inputs"], out)[1]
                    job["results"].append((out, lse))
                job["stream"].synchronize()
        except Exception as exc:  # reported, not lost in the thread
            job["error"] = f"{type(exc).__name__}: {sm70_cases._first_line(exc)}"

    threads = [threading.Thread(target=work, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    return {
        "errors": [j["error"] for j in jobs if j["error"]],
        "identical": all(
            bitwise(o, j["alone"][0]) and bitwise(lse, j["alone"][1]) for j in jobs for o, lse in j["results"]
        )
        and all(len(j["results"]) == calls for j in jobs),
        "routes": {str(d): delta(before[d], stats(ops, d))["routes"] for d in devices},
        "workspace_bytes": {str(d): stats(ops, d)["workspace_bytes"] for d in devices},
    }


def scenario_tp_pair(ops, spec, inputs) -> dict:
    import torch

    routes = {}
    for device in (0, 1):
        with torch.cuda.device(device):
            x = sm70_cases.build_inputs(spec, f"cuda:{device}")
            before = stats(ops, device)
            call(ops, spec, x, sm70_cases.new_out(x, spec["hq"], spec["d"])[1])
            routes[str(device)] = delta(before, stats(ops, device))
    return {"per_device": routes}


def scenario_corrupt_graph(ops, spec, inputs) -> dict:
    import torch

    out = sm70_cases.new_out(inputs, spec["hq"], spec["d"])[1]
    call(ops, spec, inputs, out)  # eager: allocates the device's error flag
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sm70_cases.call_op(ops.varlen_fwd, spec, inputs, out)
    table, used = inputs["block_table"], inputs["seqused_k"]
    table[0, 0] = 1 << 30  # a page id far outside the cache
    table[-1, -1] = -5
    used[-1] = 1 << 24  # keys far beyond the table's pages
    graph.replay()
    torch.cuda.synchronize()
    result = {"replayed_finite": bool(torch.isfinite(out).all())}
    fresh = sm70_cases.build_inputs(spec, "cuda")  # valid inputs: only the flag can raise
    result.update(
        sm70_cases.error_of(lambda: call(ops, spec, fresh, sm70_cases.new_out(fresh, spec["hq"], spec["d"])[1]), "cuda")
    )
    after = sm70_cases.error_of(
        lambda: call(ops, spec, fresh, sm70_cases.new_out(fresh, spec["hq"], spec["d"])[1]), "cuda"
    )
    result["next_call_clean"] = after["raised"] is None
    return result


def routing_sms(mode) -> int:
    """The SM count routing's split-KV rule uses (_routing_sms_for_testing): "no_split" (1: a grid of
    at least as many CTAs as one SM holds runs in whole waves of that SM, and splitting only adds
    waves, so the exact route stays unsplit), "split" (2**20: every grid fits in one wave, so a
    causal sequence over many key blocks splits 4 ways), "device" (0: the device's own), or a
    number."""
    return {"no_split": 1, "split": 1 << 20, "device": 0}.get(mode, mode)


def main(argv) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    raw = json.loads(argv[2])
    scenario = raw["scenario"]
    spec = sm70_cases._spec(raw["spec"])
    sm70_cases.switch_decode_kernel(spec)
    torch.ops.load_library(argv[1])
    ops = torch.ops._vllm_fa2_C
    folder = tempfile.TemporaryDirectory()
    profile = {}
    if "profile" in raw:  # before any op reads the setting (once per process)
        path, profile = write_profile(argv[1], raw["profile"], Path(folder.name))
        os.environ["FA2PATCH_ROUTING_PROFILE"] = path
        if raw["profile"].get("corrupt") != "not_installed":
            routing_profile.install()  # as the vLLM plugin does once the extension is loaded
    ops._routing_sms_for_testing(int(routing_sms(raw.get("sms", "no_split"))))
    ops._routing_prefill_splits_for_testing(int(raw.get("prefill_splits", 0)))
    t0 = time.perf_counter()
    if scenario in ("devices", "tp_pair") and torch.cuda.device_count() < 2:
        result = {"skipped": f"needs two GPUs, {torch.cuda.device_count()} visible"}
    elif scenario == "streams":
        result = concurrent(ops, spec, [0], 2, int(raw.get("calls", 3)))
    elif scenario == "devices":
        result = concurrent(ops, spec, [0, 1], 1, int(raw.get("calls", 3)))
    elif scenario == "tp_pair":
        result = scenario_tp_pair(ops, spec, None)
    else:
        inputs = sm70_cases.build_inputs(spec, "cuda")
        inputs.update(raw.get("override", {}))  # e.g. max_seqlen_q, scale: what the call passes instead
        if raw.get("vllm_cache"):  # k/v as views of vLLM's (num_blocks, hkv, page, 2 d) cache
            prefill_cases.vllm_views(spec, inputs)
        asked = raw.get("decide", [])
        result = {
            "route": lambda o, sp, x: scenario_route(o, sp, x, asked),
            "decide": lambda o, sp, x: scenario_decide(o, sp, x, asked),
            "error": lambda o, sp, x: sm70_cases.run_error(o.varlen_fwd, sp, x),
            "oom": scenario_oom,
            "graph": scenario_graph,
            "split_graph": scenario_split_graph,
            "decode_split": lambda o, sp, x: scenario_decode_split(o, sp, x, int(raw["splits"])),
            "split_oom": scenario_split_oom,
            "corrupt_graph": scenario_corrupt_graph,
            "decode_rule": scenario_decode_rule,
        }[scenario](ops, spec, inputs)
    if profile:
        result["profile_written"] = {
            "device": profile["device"],
            "extension_sha256": profile["extension_sha256"],
            "path": os.environ["FA2PATCH_ROUTING_PROFILE"],
        }
    folder.cleanup()
    result["seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sm70_cases.run_script(main)
