# SPDX-License-Identifier: BSD-3-Clause
"""The served soak's recipe (ci/vllm-lab/serve_run.py), its pure parts: it finds the plugin's
route_stats lines and vLLM's error lines in a server log, and its sitecustomize is Python."""

import json
import logging
import sys
import time

import pytest

from helpers import REPO, load_script


@pytest.fixture(scope="module")
def serve_run():
    return load_script(REPO / "ci" / "vllm-lab" / "serve_run.py", "serve_run")


def test_it_reads_the_route_stats_line_the_plugin_writes(serve_run, caplog, monkeypatch):
    sys.path.insert(0, str(REPO / "packaging"))
    from fa2patch_vllm import plugin

    stats = {"devices": {"0": {"routes": {"sm70-decode": 3}, "fallbacks": {}}}}
    monkeypatch.setenv("FA2PATCH_VLLM_ROUTE_STATS_SECONDS", "0.01")
    with caplog.at_level(logging.INFO):
        stop = plugin.start_route_stats_log(lambda: json.dumps(stats))
        for _ in range(500):  # the thread's first line, within 5 s
            lines = [r.getMessage() for r in caplog.records if "route_stats {" in r.getMessage()]
            if lines:
                break
            time.sleep(0.01)
        stop.set()
    line = "(EngineCore_DP0 pid=7) INFO 12-07 10:00:01 [plugin.py:230] " + lines[0]  # vLLM's prefix
    assert json.loads(serve_run.ROUTE_STATS.search(line).group(1)) == stats
    assert not serve_run.ROUTE_STATS.search("fa2patch-vllm: route_stats (extension not loaded in this process)")


def test_it_finds_vllms_error_lines_only(serve_run):
    assert serve_run.ERROR_LINE.search("(APIServer pid=1) ERROR 12-07 10:00:00 [serving.py:9] boom")
    assert serve_run.ERROR_LINE.search("CRITICAL 12-07 10:00:00 [core.py:1] engine died")
    assert not serve_run.ERROR_LINE.search("(APIServer pid=1) INFO 12-07 10:00:00 [x.py:1] no ERROR 12 here")
    assert not serve_run.ERROR_LINE.search("WARNING 12-07 10:00:00 [x.py:1] an error was retried")


def test_the_sitecustomize_compiles(serve_run):
    compile(serve_run.SITECUSTOMIZE, "sitecustomize.py", "exec")
    assert set(serve_run.BACKENDS) == {"fa2patch", "fa3", "triton"}
