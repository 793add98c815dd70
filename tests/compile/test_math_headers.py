# SPDX-License-Identifier: BSD-3-Clause
"""`build --python`: the CUDA math libraries' headers (the clang route) come from the target torch's
own environment at the versions that torch pins, never from fa2patch's; a pinned library that is
missing there or installed in another version is an error naming both versions. The facts are
those torch_query.py reports for a real environment (this one: torch's Requires-Dist)."""

import importlib.metadata
import json
import subprocess
import sys

import pytest

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.compile import builder, toolchain


def facts(libs):
    return {"version": "2.10.0+cu128", "cuda_libraries": libs}


def lib(dist="nvidia-cusparse-cu12", pin="12.5.8.93", installed="12.5.8.93", include="/env/nvidia/cusparse/include"):
    return {"dist": dist, "pin": pin, "installed": installed, "include": include}


def test_the_headers_of_every_pinned_library_come_from_that_environment():
    flags = builder.math_headers(facts([lib(), lib("nvidia-cublas-cu12", "12.8.4.1", "12.8.4.1", "/env/b")]), "/env/py")
    assert flags == ["-isystem", "/env/nvidia/cusparse/include", "-isystem", "/env/b"]


def test_a_missing_library_names_the_pin_and_the_install_command():
    with pytest.raises(EnvironmentProblem) as exc:
        builder.math_headers(facts([lib(installed=None, include=None)]), "/env/py")
    text = str(exc.value)
    assert "torch 2.10.0+cu128 pins nvidia-cusparse-cu12==12.5.8.93, which is not installed there" in text
    assert "install: /env/py -m pip install --no-deps nvidia-cusparse-cu12==12.5.8.93" in text


def test_another_version_names_both():
    with pytest.raises(EnvironmentProblem) as exc:
        builder.math_headers(facts([lib(installed="12.5.4.2")]), "/env/py")
    text = str(exc.value)
    assert "nvidia-cusparse-cu12 mismatch" in text and "expected: 12.5.8.93" in text and "actual:   12.5.4.2" in text


def test_this_environments_torch_reports_its_pins_with_their_headers():
    """torch_query.py on this environment: every math library torch requires with ==, as installed."""
    proc = subprocess.run([sys.executable, str(toolchain.TORCH_QUERY)], capture_output=True, text=True, check=True)
    got = {x["dist"]: x for x in json.loads(proc.stdout.strip().splitlines()[-1])["cuda_libraries"]}
    pins = {}
    for req in importlib.metadata.requires("torch") or []:
        name, _, rest = req.partition("==")
        if name.strip() in {f"nvidia-{m}-cu12" for m in ("cublas", "cusparse", "cusolver", "curand")}:
            pins[name.strip()] = rest.split(";")[0].strip()
    assert {d: x["pin"] for d, x in got.items()} == pins and pins  # the same pins, read independently
    assert all(x["installed"] == x["pin"] and x["include"].endswith("/include") for x in got.values())
