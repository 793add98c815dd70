"""The op surface of patch 0001 on a real GPU: typed errors, no crash, nothing written.

While the build has no SM70 kernels (build_info().sm70_kernels is false), every route must
refuse loudly. These tests follow build_info so they stay true once kernels exist."""

import json
import subprocess
import sys

import pytest

FORCE = {"FA2PATCH_FORCE_SM70": "1"}


@pytest.fixture(scope="module")
def build_info(gpu_build):
    out = subprocess.run([sys.executable, "-c", "import sys, torch; torch.ops.load_library(sys.argv[1]);"
                          " print(torch.ops._vllm_fa2_C.build_info())", str(gpu_build)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_build_info_describes_the_build(build_info):
    assert build_info["library"] == "_vllm_fa2_C" and build_info["fa2_version"] == "2.8.3"


def test_forced_sm70_route_without_kernels_raises_not_implemented(call_op, build_info):
    if build_info["sm70_kernels"]:
        pytest.skip("this build has SM70 kernels: the numerics suite covers the route")
    r = call_op(env=FORCE)
    assert r["raised"] == "NotImplementedError" and "no SM70 kernels" in r["message"]
    assert r["out_untouched"]


def test_bf16_on_the_sm70_route_is_a_type_error(call_op):
    r = call_op(env=FORCE, dtype="bfloat16")
    assert r["raised"] == "TypeError" and "bf16" in r["message"] and r["out_untouched"]


def test_invalid_lab_switch_value_is_an_error(call_op):
    r = call_op(env={"FA2PATCH_FORCE_SM70": "yes"})
    assert r["raised"] == "RuntimeError" and "FA2PATCH_FORCE_SM70" in r["message"]


def test_page_size_16_is_accepted_on_the_sm70_route_and_8_is_not(call_op, build_info):
    r16 = call_op(env=FORCE, page=16, shape=[8, 40, 2, 1, 64])
    if not build_info["sm70_kernels"]:
        assert r16["raised"] == "NotImplementedError" and "no SM70 kernels" in r16["message"]
    r8 = call_op(env=FORCE, page=8, shape=[8, 40, 2, 1, 64])
    assert r8["raised"] == "RuntimeError" and "multiple of 16" in r8["message"] and r8["out_untouched"]


def test_dropout_and_generator_are_refused(call_op):
    r = call_op(env=FORCE, p_dropout=0.1)
    assert r["raised"] == "NotImplementedError" and "dropout" in r["message"]
    r = call_op(env=FORCE, gen=True)
    assert r["raised"] in ("ValueError", "RuntimeError") and "gen" in r["message"]


def test_unforced_route_without_sm80_kernels_is_refused(call_op, build_info):
    import torch

    if torch.cuda.get_device_capability(0) == (7, 0) or build_info["sm80_kernels"]:
        pytest.skip("needs a GPU newer than V100 and a build without SM80 kernels")
    r = call_op()
    assert r["raised"] == "NotImplementedError" and "no SM80 kernels" in r["message"]


def test_smoke_says_why_nothing_was_launched(gpu_build, build_info):
    if build_info["routes"]:
        pytest.skip("this build registers routes: smoke launches them")
    arch = gpu_build.parent.name
    proc = subprocess.run([sys.executable, "-m", "fa2patch", "smoke", "--arch", arch],
                          capture_output=True, text=True)
    assert proc.returncode == 3 and "registers no routes" in proc.stderr
