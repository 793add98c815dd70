# SPDX-License-Identifier: BSD-3-Clause
"""vLLM's real engine on the GPU lab with fa2patch's extension (issues 23 and 25; ci/gpu-engine.sh).

    python3 ci/vllm-lab/engine_run.py all OUT WORK     every model and run, each run in a process of its own
    python3 ci/vllm-lab/engine_run.py one WORK MODEL RUN

WORK holds the models, each run's JSON and log; OUT gets results-MODEL.json per model (what
comes back from a device call: few files). ENGINE_MODELS and ENGINE_RUNS (comma-separated names)
choose a part of the set, e.g. one model per device call.
ENGINE_CAPTURE_SIZES=default leaves the CUDA graph capture sizes to vLLM (else batches of 1-8);
ENGINE_PROFILE=1 records the attention kernels launched during the requests (graph replays included).

Random-weight Qwen3-style models built here with transformers (nothing downloaded): "gqa256" (6
query heads, 1 KV head of 256: the long-prefill route's shape) and "gqa128" (32/8 heads of 128).
Eight concurrent requests of 100 to 24,000 token ids, chunked prefill in steps of 4,096 tokens,
16 greedy tokens and the prompt's logprobs. Runs: vLLM's own FA3 and TRITON_ATTN (the references),
and fa2patch's extension as vLLM's FLASH_ATTN with FA version 2 under the lab's SM70 forcing
(FA2PATCH_FORCE_SM70=1: the SM70 kernels on this GPU), eager and with CUDA graphs (full graphs
for uniform decode batches, as vLLM captures FA2), once as vLLM's backend makes its calls (one per
batch) and once with fa2patch's V100 backend (fa2patch_vllm.backend: each long prefill chunk of a
batch in a call of its own). The V100 backend is registered here by the plugin's own
register_v100_backend(), since the plugin's entry point acts on capability 7.0 only. Per run:
tokens, prompt logprobs, route_stats() and, for the V100 backend, every batch's segments.
``fa2patch.lab.engine judge`` decides.
"""

import contextlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

MODELS = {
    "gqa256": {"num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 256, "hidden_size": 1536},
    "gqa128": {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 2048},
}
PROMPT_LENGTHS = (100, 1000, 3000, 6000, 10000, 14000, 19000, 24000)
CHUNK = 4096
LAYERS = 2
NEW_TOKENS = 16
RUNS = {  # label: (attention backend, FA version, CUDA graphs, fa2patch's V100 backend)
    "fa3": ("FLASH_ATTN", 3, True, False),
    "triton": ("TRITON_ATTN", None, True, False),
    "fa2patch-eager": ("FLASH_ATTN", 2, False, False),
    "fa2patch-graphs": ("FLASH_ATTN", 2, True, False),
    "fa2patch-backend-eager": ("FLASH_ATTN", 2, False, True),
    "fa2patch-backend-graphs": ("FLASH_ATTN", 2, True, True),
}
REFERENCES = ("fa3", "triton")


def build_model(name: str, where: Path) -> Path:
    """The model's folder (config and random FP16 weights, seeded), made once."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = where / name
    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=8192,
        intermediate_size=4096,
        num_hidden_layers=LAYERS,
        max_position_embeddings=32768,
        torch_dtype="float16",
        **MODELS[name],
    )
    Qwen3ForCausalLM(config).to(torch.float16).save_pretrained(folder, safe_serialization=True)
    return folder


def prompts() -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [[rng.randrange(1, 8192) for _ in range(n)] for n in PROMPT_LENGTHS]


def record_segments(log: list) -> None:
    """Every batch the V100 backend's builder splits: its requests' query rows and keys, and the
    segments' kinds (fa2patch_vllm.segments.plan, wrapped)."""
    from fa2patch_vllm import segments

    plan = segments.plan

    def logged(query_start, seq_lens, limits):
        out = plan(query_start, seq_lens, limits)
        rows = [b - a for a, b in itertools.pairwise(query_start)]
        log.append({"rows": rows, "keys": list(seq_lens), "segments": [s.kind for s in out]})
        return out

    segments.plan = logged


def capture_sizes() -> dict:
    """ENGINE_CAPTURE_SIZES=default: vLLM's own capture sizes (issue 37's engine check); otherwise the
    recipe's batches of 1-8."""
    return {} if os.environ.get("ENGINE_CAPTURE_SIZES") == "default" else {"cudagraph_capture_sizes": [1, 2, 4, 8]}


@contextlib.contextmanager
def kernel_census():
    """ENGINE_PROFILE=1: torch.profiler around the requests; yields a dict filled with the attention
    kernels' launch counts by name (CUPTI reports the kernels of CUDA graph replays too), so a run
    shows which kernel its decode steps replayed. Unset: an empty dict, no profiler."""
    counts: dict = {}
    if os.environ.get("ENGINE_PROFILE") != "1":
        yield counts
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield counts
    words = ("flash", "sm70", "attn", "attention", "decode")  # attention: TRITON_ATTN's kernel_unified_attention
    for event in prof.events():
        name = event.name[:400]  # long enough to keep template arguments apart
        if event.device_type.name == "CUDA" and any(k in name.lower() for k in words):
            counts[name] = counts.get(name, 0) + 1


def one(out: Path, model: str, label: str) -> dict:
    import torch
    from vllm import LLM, SamplingParams

    backend, version, graphs, v100 = RUNS[label]
    segment_log: list = []
    if v100:
        from fa2patch_vllm.plugin import register_v100_backend

        assert register_v100_backend(), "the V100 backend was not registered"
        record_segments(segment_log)
    attention = {"backend": backend} | ({"flash_attn_version": version} if version else {})
    llm = LLM(
        model=str(build_model(model, out / "models")),
        skip_tokenizer_init=True,
        dtype="float16",
        seed=0,
        max_model_len=32768,
        max_num_batched_tokens=CHUNK,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.5,
        enforce_eager=not graphs,
        compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"} | capture_sizes(),
        attention_config=attention,
    )
    started = json.loads(torch.ops._vllm_fa2_C.route_stats()) if version == 2 else None
    params = SamplingParams(
        temperature=0.0, max_tokens=NEW_TOKENS, prompt_logprobs=0, ignore_eos=True, detokenize=False
    )
    with kernel_census() as kernels:
        results = llm.generate([{"prompt_token_ids": p} for p in prompts()], params)
    record = {
        "backend": backend,
        "flash_attn_version": version,
        "cuda_graphs": graphs,
        "v100_backend": v100,
        "tokens": [list(r.outputs[0].token_ids) for r in results],
        "prompt_logprobs": [
            [entry[tok].logprob for tok, entry in zip(r.prompt_token_ids[1:], r.prompt_logprobs[1:], strict=True)]
            for r in results
        ],
    }
    if version == 2:
        record["extension"] = torch.ops._vllm_fa2_C.extension_path()
        record["route_stats"] = json.loads(torch.ops._vllm_fa2_C.route_stats())
        record["route_stats_after_start"] = started  # start-up: the profile, warm-up and capture runs' calls
    if kernels:
        record["kernels"] = kernels
    if v100:
        record["segments"] = segment_log
    return record


def selected(variable: str, known: dict) -> list[str]:
    """The names in $variable (comma-separated; unset: all of ``known``), each checked."""
    names = [n for n in os.environ.get(variable, ",".join(known)).split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"{variable}: unknown {unknown}; known: {', '.join(known)}")
    return names


def run_all(out: Path, work: Path) -> int:
    """Each model's runs, each in a process of its own (its log's tail printed if it fails);
    results-MODEL.json per model in ``out``."""
    status = 0
    for model in selected("ENGINE_MODELS", MODELS):
        build_model(model, work / "models")
        runs = {}
        for label in selected("ENGINE_RUNS", RUNS):
            path = work / f"run-{model}-{label}.json"
            env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
            if label.startswith("fa2patch"):
                env["FA2PATCH_FORCE_SM70"] = "1"
            log = work / f"run-{model}-{label}.log"
            with log.open("w") as f:
                rc = subprocess.call(
                    [sys.executable, __file__, "one", str(work), model, label], env=env, stdout=f, stderr=f
                )
            print(f"[engine] {model} {label}: exit {rc}", flush=True)
            if rc == 0 and path.is_file():
                runs[label] = json.loads(path.read_text())
            else:
                status = 1
                print("".join(log.read_text().splitlines(keepends=True)[-40:]), flush=True)
        heads = {k: MODELS[model][k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}
        results = {"runs": runs, "references": list(REFERENCES), "layers": LAYERS, "heads": heads}
        (out / f"results-{model}.json").write_text(json.dumps(results) + "\n")
    return status


if __name__ == "__main__":
    if sys.argv[1] == "all":
        out, work = Path(sys.argv[2]), Path(sys.argv[3])
        out.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        sys.exit(run_all(out, work))
    work, model, label = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    (work / f"run-{model}-{label}.json").write_text(json.dumps(one(work, model, label)) + "\n")
