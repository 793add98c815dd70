# SPDX-License-Identifier: BSD-3-Clause
"""Patch 0004's settings, read by the built extension without a GPU: route_stats() reports the
long-prefill range and switches in force; the rollback variable accepts unset/"0"/"1" only and the
workspace cap a positive number of MiB, and anything else is a ValueError naming the variable."""

import json
import os
import subprocess
import sys

import pytest

ENV = "VLLM_FLASH_V100_PREFILL_D256_GQA_ARCH_128K_EXPERIMENTAL"
CAP = "FA2PATCH_PREFILL_WORKSPACE_CAP_MIB"
PROBE = r"""
import json, sys, torch
torch.ops.load_library(sys.argv[1])
try:
    print(json.dumps({"stats": json.loads(torch.ops._vllm_fa2_C.route_stats())}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "message": str(exc).splitlines()[0]}))
"""


def probe(built, **env):
    clean = {k: v for k, v in os.environ.items() if k not in (ENV, CAP)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(built / "_vllm_fa2_C.abi3.so")],
        capture_output=True,
        text=True,
        env={**clean, **env, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_defaults_are_on_with_the_documented_range_and_cap(built_sm70):
    stats = probe(built_sm70)["stats"]
    # Written down from routing.h / README before running: Q >= 1024, KV >= 16384, G <= 16, 4 GiB.
    assert stats["long_prefill"] == {
        "enabled": True,
        "min_seqlen_q": 1024,
        "min_seqlen_k": 16384,
        "max_group": 16,
        "workspace_cap_bytes": 4096 << 20,
    }
    assert stats["devices"] == {}  # no GPU visible: no per-device counters


@pytest.mark.parametrize("value,enabled", [("0", False), ("1", True)])
def test_the_rollback_switch(built_sm70, value, enabled):
    assert probe(built_sm70, **{ENV: value})["stats"]["long_prefill"]["enabled"] is enabled


@pytest.mark.parametrize("value", ["", "2", "true", "off", " 1"])
def test_other_rollback_values_are_a_value_error(built_sm70, value):
    r = probe(built_sm70, **{ENV: value})
    assert r["raised"] == "ValueError" and ENV in r["message"] and f'"{value}"' in r["message"], r


def test_the_workspace_cap_setting(built_sm70):
    assert probe(built_sm70, **{CAP: "1536"})["stats"]["long_prefill"]["workspace_cap_bytes"] == 1536 * 2**20
    for bad in ("0", "-5", "1.5", "lots", ""):
        r = probe(built_sm70, **{CAP: bad})
        assert r["raised"] == "ValueError" and CAP in r["message"], (bad, r)
