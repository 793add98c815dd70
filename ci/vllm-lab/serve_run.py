# SPDX-License-Identifier: BSD-3-Clause
"""vLLM's OpenAI server on the GPU lab under a soak (issue 40 items 1-2; ci/gpu-engine.sh with ENGINE_SERVE=1).

    python3 ci/vllm-lab/serve_run.py OUT WORK

NOT YET RUN ON THE LAB: written without device time; the first run will show what it lacks.

Per backend of SERVE_BACKENDS (comma-separated: fa2patch, fa3, triton; default all three) and the model
SERVE_MODEL (engine_run's gqa256 or gqa128; a word-level tokenizer of its 8,192 ids, built here, so
nothing is downloaded): ``vllm serve`` on 127.0.0.1 (vLLM's default CUDA graph capture sizes, full decode
graphs, prefix caching and chunked prefill of 4,096; SERVE_GPU_BLOCKS blocks of 16 tokens, default
6,000, so that the scheduler preempts; SERVE_FAULT=workspace_cap caps the long-prefill workspace at 1
MiB, a fault every qualifying chunk must survive on the exact route, counted as that fallback),
fa2patch's V100 backend registered in every server process by
a sitecustomize on PYTHONPATH (the plugin's entry point acts on 7.0 only) with the SM70 kernels forced
and ``route_stats()`` logged every 10 s; then fa2patch.lab.serve_load: the probes, SERVE_SECONDS
(default 360) of the mixed load at concurrency 32, the probes again; the device memory used (NVML,
every second) throughout. The server is stopped, its log read for error lines and the last
``route_stats`` line, and ``serve_load.judge`` decides. OUT gets serve-MODEL-BACKEND.json (the record and
the verdict); WORK the models and the server logs.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_run

from fa2patch.lab import serve_load

PORT = 8123
VOCAB = 8192
BACKENDS = {  # name: (attention config, fa2patch's V100 backend and SM70 kernels)
    "fa2patch": ({"backend": "FLASH_ATTN", "flash_attn_version": 2}, True),
    "fa3": ({"backend": "FLASH_ATTN", "flash_attn_version": 3}, False),
    "triton": ({"backend": "TRITON_ATTN"}, False),
}
# Every server process: the V100 backend registered, and route_stats() logged once the extension is
# loaded there (before it, and in processes that never load it, the line says so and carries no JSON).
SITECUSTOMIZE = """\
import os
if os.environ.get("FA2PATCH_LAB_V100_BACKEND") == "1":
    import torch
    from fa2patch_vllm.plugin import register_v100_backend, start_route_stats_log

    def read():
        ops = torch.ops._vllm_fa2_C
        return ops.route_stats() if hasattr(ops, "route_stats") else "(extension not loaded in this process)"

    register_v100_backend()
    start_route_stats_log(read)
"""
ROUTE_STATS = re.compile(r"fa2patch-vllm: route_stats (\{.*\})\s*$")
ERROR_LINE = re.compile(r"^(ERROR|CRITICAL)\b|\b(ERROR|CRITICAL) \d\d-\d\d ")


def tokenizer(folder: Path) -> None:
    """A word-level tokenizer whose token i is "t{i}", saved beside the model (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if (folder / "tokenizer.json").is_file():
        return
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1").save_pretrained(folder)


def sample_memory(stop: threading.Event, samples: list, start: float) -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    while not stop.wait(1.0):
        samples.append((time.monotonic() - start, pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20))


def wait_healthy(proc, log: Path, seconds: float = 900.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit(f"the server was not healthy after {seconds} s:\n{log.read_text()[-4000:]}")


def stop_server(proc) -> None:
    """SIGINT to the server's process group (Ctrl-C), SIGKILL after 120 s; a group already gone is fine."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(120)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def serve(out: Path, work: Path, model_name: str, name: str) -> dict:
    attention, v100 = BACKENDS[name]
    model = engine_run.build_model(model_name, work / "models")
    tokenizer(model)
    site = work / "sitecustomize"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": f"{site}:{os.environ.get('PYTHONPATH', '')}", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    if v100:
        env |= {"FA2PATCH_FORCE_SM70": "1", "FA2PATCH_LAB_V100_BACKEND": "1", "FA2PATCH_VLLM_ROUTE_STATS_SECONDS": "10"}
    fault = os.environ.get("SERVE_FAULT", "") if v100 else ""
    if fault == "workspace_cap":  # the route refuses every chunk's workspace: each takes the exact route
        env["FA2PATCH_PREFILL_WORKSPACE_CAP_MIB"] = "1"
    elif fault:
        raise SystemExit(f"SERVE_FAULT: expected workspace_cap or nothing, actual {fault!r}")
    blocks = os.environ.get("SERVE_GPU_BLOCKS", "6000")
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
           "--port", str(PORT), "--served-model-name", "m", "--dtype", "float16", "--max-model-len", "32768",
           "--max-num-batched-tokens", "4096", "--num-gpu-blocks-override", blocks, "--gpu-memory-utilization", "0.5",
           "--seed", "0", "--attention-config", json.dumps(attention),
           "--compilation-config", json.dumps({"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"})]  # fmt: skip
    log = work / f"server-{model_name}-{name}.log"
    samples: list = []
    stop, start = threading.Event(), time.monotonic()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(proc, log)
            warmup_s = time.monotonic() - start
            threading.Thread(target=sample_memory, args=(stop, samples, start), daemon=True).start()
            probes = serve_load.probe_prompts(VOCAB)
            before = [serve_load.probe("127.0.0.1", PORT, "m", p, "before") for p in probes]
            requests = serve_load.mixed_workload(0, int(os.environ.get("SERVE_COUNT", "400")), VOCAB)
            seconds = float(os.environ.get("SERVE_SECONDS", "360"))
            load = serve_load.run_load("127.0.0.1", PORT, "m", requests, 32, seconds)
            after = [serve_load.probe("127.0.0.1", PORT, "m", p, "after") for p in probes]
            time.sleep(12)  # one more route_stats line after the load
        finally:
            stop.set()
            stop_server(proc)
    lines = log.read_text(errors="replace").splitlines()
    stats = [m.group(1) for line in lines if (m := ROUTE_STATS.search(line))]
    record = {
        "backend": name,
        "model": model_name,
        "load": load["summary"],
        "probes_before": before,
        "probes_after": after,
        "memory": samples,
        "warmup_s": warmup_s + 30.0,  # the first requests' allocations (the long-prefill workspace) settle
        "server_errors": [line for line in lines if ERROR_LINE.search(line)][:50],
        "route_stats": json.loads(stats[-1]) if stats else None,
        "expect_route_stats": v100,
        "expect_long_prefill": v100 and engine_run.MODELS[model_name]["head_dim"] == 256,
        "expected_fallbacks": [fault] if fault and engine_run.MODELS[model_name]["head_dim"] == 256 else [],
    }
    record["verdict"] = serve_load.judge(record)
    (out / f"serve-{model_name}-{name}.json").write_text(json.dumps(record) + "\n")
    return record


def main(out: Path, work: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    model = os.environ.get("SERVE_MODEL", "gqa256")
    status = 0
    for name in engine_run.selected("SERVE_BACKENDS", BACKENDS):
        verdict = serve(out, work, model, name)["verdict"]
        print(f"[serve] {model} {name}: {'pass' if verdict['pass'] else 'FAIL'} {verdict['reasons']}", flush=True)
        status |= not verdict["pass"]
    return status


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
