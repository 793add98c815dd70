# SPDX-License-Identifier: BSD-3-Clause
"""The engine recipe's logic on the CPU (fa2patch.lab.engine; ci/gpu-engine.sh, ci/vllm-lab/engine_run.py):
the stripped wheel survives packing, splitting and assembling byte for byte, a damaged or missing part
is named, and the verdict passes fa2patch's runs only within vLLM's own backends' spread and, for the
V100 backend, only when every qualifying chunk had its own long-prefill call per layer."""

import json
import random
import sys
import zipfile

import pytest

from fa2patch.lab import engine
from helpers import REPO, load_script


def fake_wheel(path, files):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


KEPT = {
    "vllm/__init__.py": b"__version__ = '0.26.0'\n",
    "vllm/_C_stable_libtorch.abi3.so": random.Random(0).randbytes(20000),  # xz cannot shrink it
    "vllm-0.26.0.dist-info/METADATA": b"Name: vllm\n",
}
STRIPPED = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"theirs",
    "vllm/third_party/deep_gemm/include/x.hpp": b"x",
    "vllm/_moe_C_stable_libtorch.abi3.so": b"moe",
}


def test_pack_and_assemble_give_back_every_kept_file_and_none_of_the_stripped(tmp_path):
    import os

    wheel = fake_wheel(tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", KEPT | STRIPPED)
    manifest = engine.pack(wheel, tmp_path / "parts", part_bytes=4096, expected_sha256=None)
    assert len(manifest["parts"]) >= 2 and all(p["bytes"] <= 4096 for p in manifest["parts"])
    assert sum(manifest["left_out"].values()) == len(STRIPPED)
    assert manifest["wheel_sha256"] == engine.sha256(wheel.read_bytes())
    site = tmp_path / "site"
    engine.assemble(tmp_path / "parts", site)
    found = {str(p.relative_to(site)): p.read_bytes() for p in site.rglob("*") if p.is_file()}
    assert found == {k.replace("/", os.sep): v for k, v in KEPT.items()}


def test_a_missing_or_damaged_part_is_named(tmp_path):
    wheel = fake_wheel(tmp_path / "w.whl", KEPT)
    manifest = engine.pack(wheel, tmp_path / "parts", part_bytes=2048, expected_sha256=None)
    first = tmp_path / "parts" / manifest["parts"][0]["name"]
    data = first.read_bytes()
    first.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(SystemExit, match=f"{first.name}: sha256 .* expected {manifest['parts'][0]['sha256']}"):
        engine.assemble(tmp_path / "parts", tmp_path / "site")
    first.unlink()
    with pytest.raises(SystemExit, match=f"{first.name}: missing"):
        engine.assemble(tmp_path / "parts", tmp_path / "site")


def test_a_wheel_other_than_the_pinned_one_is_refused_naming_both_digests(tmp_path):
    wheel = fake_wheel(tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", KEPT)
    actual = engine.sha256(wheel.read_bytes())
    with pytest.raises(SystemExit, match=f"(?s){wheel}: sha256 mismatch.*{engine.WHEEL_SHA256}.*{actual}"):
        engine.pack(wheel, tmp_path / "parts", part_bytes=4096)
    assert not (tmp_path / "parts").exists()


def test_the_real_strip_list_keeps_what_the_engine_imports():
    assert engine.stripped("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")
    assert engine.stripped("vllm/third_party/fmha_sm100/cutlass/a.hpp")
    for kept in (
        "vllm/_C_stable_libtorch.abi3.so",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/vllm_flash_attn/flash_attn_interface.py",
        "vllm/v1/attention/backends/flash_attn.py",
    ):
        assert engine.stripped(kept) is None


def run(tokens, logprobs, **extra):
    return {"tokens": tokens, "prompt_logprobs": logprobs, **extra}


def stats(calls, enabled=True):
    return {
        "long_prefill": {"enabled": enabled, "min_seqlen_q": 1024, "min_seqlen_k": 16384, "max_group": 16},
        "devices": {"0": {"routes": {"sm70-gqa-prefill": calls, "sm70-dense": 10}}},
    }


GQA256 = {"num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 256}


def results(ours, heads=GQA256):
    refs = {
        "fa3": run([[1, 2], [3, 4]], [[-1.0, -2.0], [-3.0]]),
        "triton": run([[1, 2], [3, 5]], [[-1.004, -2.0], [-3.0]]),  # spread 0.004; they disagree on prompt 2
    }
    return {"runs": refs | ours, "references": ["fa3", "triton"], "layers": 2, "heads": heads}


def test_the_verdict_is_the_references_spread():
    ok = engine.judge(results({"ours": run([[1, 2], [3, 9]], [[-1.002, -2.0045], [-3.0]])}))
    assert ok["pass"] and ok["reference_spread"] == pytest.approx(0.004)
    # 0.0055 from fa3 is beyond 0.004 + 1e-3; a token where the references agree differs.
    far = engine.judge(results({"ours": run([[1, 2], [3, 4]], [[-1.0, -2.0055], [-3.0]])}))
    assert not far["pass"] and not far["runs"]["ours"]["within_spread"]
    tokens = engine.judge(results({"ours": run([[1, 7], [3, 4]], [[-1.0, -2.0], [-3.0]])}))
    assert not tokens["pass"] and not tokens["runs"]["ours"]["tokens_agree"]


def test_the_v100_backend_must_give_every_qualifying_chunk_its_own_call_per_layer():
    batches = [
        {"rows": [1, 1, 4096], "keys": [500, 20000, 20480], "segments": ["exact", "long_prefill"]},
        {"rows": [4096], "keys": [4096], "segments": ["exact"]},
    ]
    good = run([[1, 2], [3, 4]], [[-1.0, -2.0], [-3.0]], route_stats=stats(2), segments=batches)
    verdict = engine.judge(results({"backend": good}))
    assert verdict["pass"] and verdict["runs"]["backend"]["qualifying_chunks"] == 1
    short = {**good, "route_stats": stats(1)}  # one layer's call missing
    assert not engine.judge(results({"backend": short}))["pass"]
    missed = {**good, "segments": [{**batches[0], "segments": ["exact"]}]}  # a qualifying chunk not split off
    assert not engine.judge(results({"backend": missed}))["pass"]
    plain = run([[1, 2], [3, 4]], [[-1.0, -2.0], [-3.0]], route_stats=stats(0))  # one call per batch: counted only
    assert engine.judge(results({"plain": plain}))["runs"]["plain"] == {
        "max_logprob_gap": pytest.approx(0.004),
        "within_spread": True,
        "tokens_agree": True,
        "long_prefill_calls": 0,
        "pass": True,
    }


def test_on_a_model_the_long_prefill_route_cannot_serve_the_v100_backend_must_not_split():
    """32/8 heads of 128 (the lab's gqa128): no segment planned, no long-prefill call; a split planned
    for such a model is a failure even where every chunk ends on the exact route."""
    gqa128 = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    logprobs = [[-1.0, -2.0], [-3.0]]
    quiet = run([[1, 2], [3, 4]], logprobs, route_stats=stats(0), segments=[])
    verdict = engine.judge(results({"backend": quiet}, gqa128))
    assert verdict["pass"] and verdict["runs"]["backend"]["qualifying_chunks"] == 0
    split = [{"rows": [1, 4096], "keys": [500, 20480], "segments": ["exact", "long_prefill"]}]
    assert not engine.judge(results({"backend": {**quiet, "segments": split}}, gqa128))["pass"]
    # 17 query heads per KV head is beyond the route's max_group of 16: the same.
    wide = {"num_attention_heads": 17, "num_key_value_heads": 1, "head_dim": 256}
    assert engine.judge(results({"backend": quiet}, wide))["pass"]
    assert not engine.judge(results({"backend": {**quiet, "segments": split}}, wide))["pass"]


def test_a_results_file_without_the_models_heads_is_refused_by_name(tmp_path, capsys):
    path = tmp_path / "results-gqa256.json"
    old = results({"ours": run([[1, 2], [3, 4]], [[-1.0, -2.0], [-3.0]])})
    del old["heads"]
    path.write_text(json.dumps(old))
    assert engine.main(["judge", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "missing heads" in err and "num_key_value_heads" in err


def load_engine_run():
    return load_script(REPO / "ci" / "vllm-lab" / "engine_run.py", "engine_run")


def test_the_engine_run_is_the_issues_workload_and_logs_the_backends_split():
    """Eight requests of 100..24,000 tokens in chunks of 4,096; both references; fa2patch eager and with
    graphs, with and without the V100 backend; the segment log is what fa2patch_vllm.segments.plan
    decided, batch by batch."""
    run_module = load_engine_run()
    lengths = [len(p) for p in run_module.prompts()]
    assert len(lengths) == 8 and min(lengths) == 100 and max(lengths) == 24000 and run_module.CHUNK == 4096
    assert run_module.prompts() == run_module.prompts()  # seeded: every run sees the same prompts
    assert set(run_module.REFERENCES) <= set(run_module.RUNS)
    ours = {v[2:] for k, v in run_module.RUNS.items() if k.startswith("fa2patch")}
    assert ours == {(False, False), (True, False), (False, True), (True, True)}
    sys.path.insert(0, str(REPO / "packaging"))
    from fa2patch_vllm import segments

    log = []
    original = segments.plan
    try:
        run_module.record_segments(log)
        segments.plan([0, 1, 4097], [20000, 20480], segments.Thresholds(1024, 16384))
    finally:
        segments.plan = original
    assert log == [{"rows": [1, 4096], "keys": [20000, 20480], "segments": ["exact", "long_prefill"]}]
    json.dumps(log)


def test_a_part_of_the_runs_is_chosen_by_name_and_a_wrong_name_is_refused(monkeypatch):
    run_module = load_engine_run()
    monkeypatch.setenv("ENGINE_RUNS", "fa3,triton,fa2patch-backend-eager")
    assert run_module.selected("ENGINE_RUNS", run_module.RUNS) == ["fa3", "triton", "fa2patch-backend-eager"]
    monkeypatch.delenv("ENGINE_RUNS")
    assert run_module.selected("ENGINE_RUNS", run_module.RUNS) == list(run_module.RUNS)
    monkeypatch.setenv("ENGINE_MODELS", "gqa256,llama")
    with pytest.raises(SystemExit, match="ENGINE_MODELS: unknown \\['llama'\\]"):
        run_module.selected("ENGINE_MODELS", run_module.MODELS)
