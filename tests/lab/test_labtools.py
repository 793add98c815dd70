# SPDX-License-Identifier: BSD-3-Clause
"""fa2patch.lab.labtools, the GPU lab scripts' logic, on the CPU: each decision against cases built here."""

import json
import subprocess
import sys
import threading

import pytest

from fa2patch.lab import labtools
from helpers import REPO, load_script


def run(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "fa2patch.lab.labtools", *args], input=stdin, capture_output=True, text=True, cwd=REPO
    )


def test_sdist_name_is_the_locked_baseline_archive():
    # The pinned baseline (docs/DESIGN.md §3), written down here.
    assert labtools.sdist_name(REPO) == "flash_attn-2.8.3.tar.gz"
    assert run("sdist-name").stdout == "flash_attn-2.8.3.tar.gz\n"


def test_sdist_name_of_a_broken_lock_is_an_environment_error(tmp_path):
    (tmp_path / "baseline.lock").write_text("format = 99\n")
    proc = run("sdist-name", "--root", str(tmp_path))
    assert proc.returncode in (1, 2) and "[lab] error" in proc.stderr and not proc.stdout


def test_merge_sanitizer_adds_the_verdict_per_family_and_keeps_the_rest():
    summary = {"families": {"gqa": {"max_abs": 1e-4}}, "cases": [1, 2]}
    sanitize = {
        "clean": False,
        "families": {"gqa": {"runs": 2, "clean": True}, "kvcache": {"runs": 2, "clean": False}},
        "runs": [],
    }
    merged = labtools.merge_sanitizer(summary, sanitize)
    assert merged == {**summary, "sanitizer": {"clean": False, "families": {"gqa": "clean", "kvcache": "dirty"}}}


CASES = [
    'gqa|tests/gpu/sm70_cases.py|{"d": 64}',
    'head_dims|tests/gpu/sm70_cases.py|{"d": 96}',
    'long_prefill|tests/gpu/long_prefill_cases.py|{"hq": 6}',
    'bad_input|tests/gpu/kvcache_cases.py|{"x": 1}',
]


@pytest.mark.parametrize(
    "regex, families",
    [
        ("long_prefill", ["long_prefill"]),
        ("gqa|head_dims", ["gqa", "head_dims"]),
        ("head", []),  # a whole match: not a prefix
        (".*_.*", ["head_dims", "long_prefill", "bad_input"]),
    ],
)
def test_filter_cases_keeps_families_the_regex_matches_whole(regex, families):
    kept = labtools.filter_cases(CASES, regex)
    assert [c.split("|")[0] for c in kept] == families
    assert run("sanitize-filter", regex, stdin="\n".join(CASES) + "\n").stdout.splitlines() == kept


MEMCHECK_CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
MEMCHECK_DIRTY = (
    "========= Invalid __global__ read of size 4 bytes\n"
    '========= Saved host backtrace "x"\n========= ERROR SUMMARY: 3 errors\n'
)


@pytest.mark.parametrize(
    "rc, log, verdict, summary",
    [
        (0, MEMCHECK_CLEAN, "clean", " ERROR SUMMARY: 0 errors"),
        (9, MEMCHECK_DIRTY, "dirty", " ERROR SUMMARY: 3 errors"),
        (1, "Traceback ...\n", "dirty", ""),
        (
            0,
            "========= Internal Sanitizer Error: x\n========= RACECHECK SUMMARY: 0 hazards\n",
            "sanitizer-internal-error",
            " RACECHECK SUMMARY: 0 hazards",
        ),
    ],
)
def test_sanitize_record_reads_the_verdict_from_status_and_log(rc, log, verdict, summary):
    record = labtools.sanitize_record("memcheck", 'gqa|tests/gpu/sm70_cases.py|{"seqlens": [[1, 2]], "d": 64}', rc, log)
    assert record == {
        "tool": "memcheck",
        "family": "gqa",
        "harness": "sm70_cases.py",
        "spec": {"seqlens": [[1, 2]], "d": 64},
        "rc": rc,
        "verdict": verdict,
        "summary": summary,
    }


def test_sanitize_records_from_parallel_runs_stay_whole_lines(tmp_path):
    out = tmp_path / "results.jsonl"
    big = {"spec": "x" * 3000}

    def writer(i):
        for j in range(50):
            labtools.append_line(out, {"i": i, "j": j, **big})

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["i"], r["j"]) for r in rows) == [(i, j) for i in range(4) for j in range(50)]


def test_sanitize_summary_per_family_and_overall():
    rows = [
        {"family": "gqa", "verdict": "clean"},
        {"family": "gqa", "verdict": "clean"},
        {"family": "kvcache", "verdict": "clean"},
        {"family": "kvcache", "verdict": "sanitizer-internal-error"},
    ]
    summary = labtools.sanitize_summary(rows)
    assert summary["families"] == {"gqa": {"runs": 2, "clean": True}, "kvcache": {"runs": 2, "clean": False}}
    assert summary["clean"] is False and summary["runs"] == rows
    assert labtools.sanitize_summary(rows[:3])["clean"] is True
    assert labtools.sanitize_summary([])["clean"] is False  # no run proves nothing


def test_sanitize_summary_command_exit_status_and_lines(tmp_path):
    results, out = tmp_path / "results.jsonl", tmp_path / "summary.json"
    rows = [{"family": "gqa", "verdict": "clean"}, {"family": "window", "verdict": "dirty"}]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run("sanitize-summary", str(results), str(out))
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "[sanitize] {'gqa': True, 'window': False}",
        "[sanitize] clean runs: 1",
        "[sanitize] runs: 2",
    ]
    assert json.loads(out.read_text())["families"]["window"] == {"runs": 1, "clean": False}
    results.write_text(json.dumps(rows[0]) + "\n")
    assert run("sanitize-summary", str(results), str(out)).returncode == 0
    results.write_text("")
    assert run("sanitize-summary", str(results), str(out)).returncode == 1


TEST_TEXT = "import torch\n\nDTYPES = [torch.bfloat16]\nQDTYPES = [None]\n"


def test_fp16_only_edits_the_one_dtypes_line(tmp_path):
    assert labtools.fp16_only(TEST_TEXT, "t.py") == "import torch\n\nDTYPES = [torch.float16]\nQDTYPES = [None]\n"
    for changed in (TEST_TEXT.replace("bfloat16", "float16"), TEST_TEXT + "DTYPES = [torch.bfloat16]\n"):
        with pytest.raises(ValueError, match="vLLM's test changed"):
            labtools.fp16_only(changed, "t.py")
    src, dest = tmp_path / "test_flash_attn.py", tmp_path / "out.py"
    src.write_text(TEST_TEXT.replace("bfloat16", "half"))
    proc = run("vllm-fp16-test", str(src), str(dest))
    assert proc.returncode == 2 and "found 0" in proc.stderr and not dest.exists()


def vllm_rows(fa2: int, views: int, outcome="passed", dtype="torch.float16", backend: int = 6) -> list[dict]:
    """Rows as ci/vllm-lab/conftest.py describes them, with distractors that must not count."""
    rows = [
        {
            "test": labtools.BACKEND_TESTS[i % 2],
            "fa_version": None,
            "q_dtype": "None",
            "dtype": "None",
            "outcome": outcome,
        }
        for i in range(backend)
    ]
    rows += [
        {"test": "test_varlen_with_paged_kv", "fa_version": 2, "q_dtype": "None", "dtype": dtype, "outcome": outcome}
        for _ in range(fa2)
    ]
    rows += [
        {"test": "test_vllm_kv_cache_views", "fa_version": None, "q_dtype": "None", "dtype": "None", "outcome": outcome}
        for _ in range(views)
    ]
    rows += [
        {"test": "test_varlen_with_paged_kv", "fa_version": 3, "q_dtype": "None", "dtype": dtype, "outcome": "skipped"},
        {
            "test": "test_varlen_with_paged_kv",
            "fa_version": 2,
            "q_dtype": "torch.float8_e4m3fn",
            "dtype": dtype,
            "outcome": "skipped",
        },
        {
            "test": "test_flash_attn_with_paged_kv",
            "fa_version": 2,
            "q_dtype": "None",
            "dtype": dtype,
            "outcome": "skipped",
        },
    ]
    return rows


def vllm_summary(rows, **over) -> dict:
    ext = "/tmp/v/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
    return {
        "extension": ext,
        "expected_extension": ext,
        "imported_by_vllm_interface": True,
        "fa2patch_ops": True,
        "force_sm70": "1",
        "collected": rows,
        "cases": rows,
        **over,
    }


# vLLM's FA2 fp16 cases and our KV-view cases, as docs/lab/2026-12-01-series-0001-0004/README.md reports them;
# the per-request backend's cases (ci/vllm-lab/test_per_request_backend.py: 3 + 3 parameters).
FA2, VIEWS, BACKEND = 160, 36, 6


def test_collect_verdict_wants_every_case_and_the_extension_through_vllm():
    ok, line = labtools.collect_verdict(vllm_summary(vllm_rows(FA2, VIEWS)))
    assert ok and (
        f"collected {FA2 + VIEWS + BACKEND + 3}: {FA2} vLLM FA2 fp16 cases, {VIEWS} KV-view cases, "
        f"{BACKEND} per-request backend cases" in line
    )
    assert not labtools.collect_verdict(vllm_summary(vllm_rows(FA2, VIEWS, backend=BACKEND - 1)))[0]
    assert not labtools.collect_verdict(vllm_summary(vllm_rows(FA2 - 1, VIEWS)))[0]
    assert not labtools.collect_verdict(vllm_summary(vllm_rows(FA2, VIEWS + 1)))[0]
    assert not labtools.collect_verdict(vllm_summary(vllm_rows(FA2, VIEWS, dtype="torch.bfloat16")))[0]
    assert not labtools.collect_verdict(vllm_summary(vllm_rows(FA2, VIEWS), extension="/elsewhere/_vllm_fa2_C.so"))[0]
    assert not labtools.collect_verdict(vllm_summary(vllm_rows(FA2, VIEWS), imported_by_vllm_interface=False))[0]
    assert not labtools.collect_verdict(vllm_summary(vllm_rows(FA2, VIEWS), fa2patch_ops=False))[0]


def test_run_verdict_names_each_check():
    verdict = labtools.run_verdict(vllm_summary(vllm_rows(FA2, VIEWS)), 0)
    assert all(verdict.values()) and len(verdict) == 7
    assert f"per-request backend cases: {BACKEND} passed (got {BACKEND} of {BACKEND})" in verdict
    assert f"vLLM FA2 fp16 cases: {FA2} passed (got {FA2} of {FA2})" in verdict
    failed = vllm_rows(FA2, VIEWS)
    failed[BACKEND + 3]["outcome"] = "failed"  # an FA2 case (the backend's rows come first)
    verdict = labtools.run_verdict(vllm_summary(failed), 1)
    assert [k for k, v in verdict.items() if not v] == [
        f"vLLM FA2 fp16 cases: {FA2} passed (got {FA2 - 1} of {FA2})",
        "no failure anywhere",
    ]
    verdict = labtools.run_verdict(vllm_summary(vllm_rows(FA2, VIEWS), force_sm70=None), 0)
    assert [k for k, v in verdict.items() if not v] == ["SM70 kernels forced"]
    assert not all(labtools.run_verdict(vllm_summary(vllm_rows(FA2, VIEWS)), 5).values())


def test_vllm_verdict_command_writes_the_verdict_into_the_summary(tmp_path):
    path = tmp_path / "vllm-summary.json"
    path.write_text(json.dumps(vllm_summary(vllm_rows(FA2, VIEWS - 2))))
    proc = run("vllm-verdict", str(path), "--pytest-rc", "0")
    assert proc.returncode == 1
    assert f"[vllm] FAIL KV-cache view cases: {VIEWS} passed (got {VIEWS - 2} of {VIEWS - 2})" in proc.stdout
    written = json.loads(path.read_text())
    assert written["ok"] is False and sum(not v for v in written["verdict"].values()) == 1
    path.write_text(json.dumps(vllm_summary(vllm_rows(FA2, VIEWS))))
    assert run("vllm-verdict", str(path), "--collected").returncode == 0


def _gpu_conftest():
    """tests/gpu/conftest.py, the module that writes each session's summary (imported by path)."""
    return load_script(REPO / "tests" / "gpu" / "conftest.py", "gpu_conftest_for_labtools")


def test_session_groups_run_every_gpu_test_file_once(tmp_path):
    for name in ("test_sm70_numerics.py", "test_routing_gpu.py", "test_a_gpu.py", "test_b_gpu.py", "cases.py"):
        (tmp_path / name).write_text("")
    groups = labtools.session_groups(tmp_path)
    assert [[f.name for f in g] for g in groups] == [
        ["test_sm70_numerics.py"],
        ["test_routing_gpu.py"],
        ["test_a_gpu.py", "test_b_gpu.py"],
    ]
    real = labtools.session_groups(REPO / "tests/gpu")
    files = [f for g in real for f in g]
    assert sorted(files) == sorted((REPO / "tests/gpu").glob("test_*.py")) and len(files) == len(set(files))
    assert run("test-groups", str(REPO / "tests/gpu")).stdout.splitlines() == [" ".join(map(str, g)) for g in real]


def test_merged_summaries_equal_one_sessions_summary(tmp_path):
    # Rows recorded by two sessions, merged, against the same rows recorded by one session (conftest's own
    # summary): a family split over both sessions keeps all its cases and its worst metrics.
    conftest = _gpu_conftest()
    rows = [
        ("dense", "a", {"ok": True, "max_abs": 1e-3, "rel_l2": 1e-4, "finite": True, "deterministic": True}),
        ("dense", "b", {"ok": False, "max_abs": float("nan"), "rel_l2": 2e-4, "finite": False}),
        ("prefill", "c", {"ok": True, "max_abs": 2e-3, "lse_max_err": float("inf")}),
        ("dense", "d", {"ok": True, "max_abs": 5e-3, "rel_l2": 3e-4, "deterministic": False}),
        ("prefill", "e", {"ok": True, "max_abs": 1e-3, "lse_max_err": 1e-5}),
    ]
    one, first, second = conftest.NumericsSummary(), conftest.NumericsSummary(), conftest.NumericsSummary()
    for i, (family, case, result) in enumerate(rows):
        one.record(family, case, result)
        (first if i % 2 else second).record(family, case, result)
    whole = json.loads(json.dumps(one.as_json()))
    parts = [json.loads(json.dumps(s.as_json())) for s in (first, second)]
    merged = labtools.merge_summaries(parts)
    for fam in (*merged["families"].values(), *whole["families"].values()):
        fam["results"].sort(key=lambda r: r["case"])
        fam["failed"].sort()
    assert merged == whole
    assert merged["families"]["dense"]["worst_case"]["max_abs"] == "b"  # NaN is the worst value
    empty = labtools.merge_summaries([json.loads(json.dumps(conftest.NumericsSummary().as_json()))])
    assert empty["cases"] == 0 and empty["ok"] is None and "note" in empty


def test_merge_summaries_command_refuses_a_missing_session(tmp_path):
    part = tmp_path / "a.json"
    part.write_text(json.dumps({"cases": 0, "ok": None, "failed": [], "families": {}}))
    proc = run("merge-summaries", str(tmp_path / "out.json"), str(part), str(tmp_path / "b.json"))
    assert proc.returncode == 1 and "b.json" in proc.stderr and not (tmp_path / "out.json").exists()
    assert run("merge-summaries", str(tmp_path / "out.json"), str(part)).returncode == 0


def test_shell_words_keeps_a_quoted_pytest_expression_one_argument(capsys):
    """gpu-lab.sh passes LAB_PYTEST_ARGS through shell-words: a -k expression with spaces, quoted,
    reaches pytest as one argument (split on spaces it became file names: lab run of 2026-12-01)."""
    assert labtools.main(["shell-words", "-k 'head_dim or d32' -m slow"]) == 0
    assert capsys.readouterr().out.splitlines() == ["-k", "head_dim or d32", "-m", "slow"]
    assert labtools.main(["shell-words", ""]) == 0 and capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="No closing quotation"):
        labtools.main(["shell-words", "-k 'unclosed"])
