# SPDX-License-Identifier: BSD-3-Clause
"""pytest set-up for vLLM's FA2 kernel test on the GPU lab. ci/gpu-vllm.sh copies this folder,
tests/vllm/vllm_stubs.py and vLLM's own tests/kernels/attention/test_flash_attn.py into one run folder.

Everything goes through vLLM's real ``vllm/vllm_flash_attn`` package: the extension sits where
vLLM's build installs it and vLLM's interface imports it (``from . import _vllm_fa2_C``);
``torch.ops.load_library`` is disabled, so nothing can load it by hand. What is stubbed, and why,
is in vllm_stubs.py (the platform answers with this GPU's own capability). The session writes a
JSON summary ($FA2PATCH_VLLM_SUMMARY) that ci/gpu-vllm.sh judges.
"""

import json
import os
import sys

import pytest
import torch

import vllm_stubs

VLLM_SRC = os.environ["FA2PATCH_VLLM_SRC"]
EXPECTED = os.path.join(VLLM_SRC, "vllm", "vllm_flash_attn", "_vllm_fa2_C.abi3.so")


def _no_hand_loading(path):
    raise AssertionError(f"torch.ops.load_library({path!r}): the extension must come through vLLM's interface")


torch.ops.load_library = _no_hand_loading
vllm_stubs.install(VLLM_SRC, lambda: torch.cuda.get_device_capability() if torch.cuda.is_available() else None)

COLLECTED, CASES = [], []


def describe(item) -> dict:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return {
        "test": item.originalname,
        "fa_version": params.get("fa_version"),
        "q_dtype": str(params.get("q_dtype")),
        "dtype": str(params.get("dtype")),
    }


def pytest_collection_finish(session):
    COLLECTED.extend(describe(item) for item in session.items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or report.outcome != "passed":
        CASES.append({**describe(item), "outcome": report.outcome, "when": report.when})


def pytest_sessionfinish(session, exitstatus):
    module = sys.modules.get("vllm.vllm_flash_attn._vllm_fa2_C")
    interface = sys.modules.get("vllm.vllm_flash_attn.flash_attn_interface")
    summary = {
        "extension": getattr(module, "__file__", None),
        "expected_extension": EXPECTED,
        "imported_by_vllm_interface": interface is not None and getattr(interface, "_vllm_fa2_C", None) is module,
        "fa2patch_ops": module is not None and hasattr(torch.ops._vllm_fa2_C, "build_info"),
        "force_sm70": os.environ.get("FA2PATCH_FORCE_SM70"),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "collected": COLLECTED,
        "cases": CASES,
    }
    with open(os.environ["FA2PATCH_VLLM_SUMMARY"], "w") as out:
        json.dump(summary, out, indent=1)
