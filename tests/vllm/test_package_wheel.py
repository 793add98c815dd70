# SPDX-License-Identifier: BSD-3-Clause
"""The wheels package.py writes, without a build: RECORD, and the licence files in the dist-info's
licenses/ folder, named by METADATA's License-File lines and byte-equal to their sources (fa2patch's
LICENSE and NOTICE; FA2's LICENSE and the licence comment of CUTLASS's cutlass.h from the FA2 tree).
The wheel with a real extension: tests/test_vllm_packaging.py."""

import base64
import hashlib
import shutil
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

from fa2patch.common.errors import EnvironmentProblem
from fa2patch.common.project import Project
from fa2patch.vllm import package
from helpers import REPO


def read_wheel(wheel: Path) -> tuple[str, dict[str, bytes]]:
    """(the dist-info folder, {name: bytes}), with every RECORD line checked against the bytes."""
    with zipfile.ZipFile(wheel) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    (info,) = {n.split("/")[0] for n in entries if n.endswith(".dist-info/RECORD")}
    record = entries[f"{info}/RECORD"].decode().splitlines()
    for line in record:
        name, digest, size = line.rsplit(",", 2)
        if name != f"{info}/RECORD":
            data = entries[name]
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(data)), name
    assert {line.split(",")[0] for line in record} == set(entries)
    return info, entries


def licence_files(info: str, entries: dict[str, bytes]) -> dict[str, bytes]:
    """{License-File value: the bytes of the file it names}; every file under licenses/ is named."""
    meta = HeaderParser().parsestr(entries[f"{info}/METADATA"].decode())
    assert meta["Metadata-Version"] == "2.4" and meta["License-Expression"] == "BSD-3-Clause"
    named = meta.get_all("License-File") or []
    under = {n.removeprefix(f"{info}/licenses/") for n in entries if n.startswith(f"{info}/licenses/")}
    assert sorted(named) == sorted(under), (named, under)
    return {n: entries[f"{info}/licenses/{n}"] for n in named}


@pytest.fixture
def project(tmp_path) -> Project:
    root = tmp_path / "proj"
    shutil.copytree(REPO / "packaging" / package.DIST, root / "packaging" / package.DIST)
    shutil.copy(REPO / "packaging" / "vllm-releases.toml", root / "packaging" / "vllm-releases.toml")
    for name in ("LICENSE", "NOTICE"):
        shutil.copy(REPO / name, root / name)
    return Project(root)


CUTLASS_COMMENT = (
    b"/****\n * Copyright (c) 2017 - 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.\n"
    b" * SPDX-License-Identifier: BSD-3-Clause\n *\n * Redistribution and use in source and binary forms ...\n"
    b" ****/\n"
)


def fa2_tree(path: Path) -> Path:
    """A stand-in for the replayed FA2 tree: FA2's LICENSE and AUTHORS and a cutlass.h that opens with
    its licence."""
    (path / "csrc" / "cutlass" / "include" / "cutlass").mkdir(parents=True)
    (path / "LICENSE").write_bytes(b"BSD 3-Clause License\n\nCopyright (c) 2022, Tri Dao.\n")
    (path / "AUTHORS").write_bytes(b"Tri Dao, trid@cs.stanford.edu\n")
    header = CUTLASS_COMMENT + b"\n/*! \\file */\n#pragma once\n"
    (path / "csrc" / "cutlass" / "include" / "cutlass" / "cutlass.h").write_bytes(header)
    return path


def test_plugin_wheel_carries_our_licence_and_notice(project, tmp_path):
    wheel = package.plugin_wheel(project, tmp_path / "out", "sha256:" + "0" * 64)
    info, entries = read_wheel(wheel)
    assert licence_files(info, entries) == {
        "LICENSE": (REPO / "LICENSE").read_bytes(),
        "NOTICE": (REPO / "NOTICE").read_bytes(),
    }


def test_extension_wheel_licences_include_fa2_and_cutlass(project, tmp_path):
    """What wheel() gives write_wheel: ours and the FA2 tree's (its LICENSE with the AUTHORS file that
    LICENSE names, and CUTLASS's: the opening comment of cutlass.h, as cutlass.h.license), under
    flash-attn/ by their paths in the tree."""
    tree = fa2_tree(tmp_path / "flash-attn")
    licenses = {**package.own_licenses(project), **package.tree_licenses(tree)}
    wheel = package.write_wheel(tmp_path / "out", "0.1.0+torch2.9.1", "cp39-abi3-linux_x86_64", {}, "x", licenses)
    info, entries = read_wheel(wheel)
    assert licence_files(info, entries) == {
        "LICENSE": (REPO / "LICENSE").read_bytes(),
        "NOTICE": (REPO / "NOTICE").read_bytes(),
        "flash-attn/LICENSE": (tree / "LICENSE").read_bytes(),
        "flash-attn/AUTHORS": (tree / "AUTHORS").read_bytes(),
        "flash-attn/csrc/cutlass/include/cutlass/cutlass.h.license": CUTLASS_COMMENT,
    }


def test_missing_licence_files_are_refused(project, tmp_path):
    (project.root / "NOTICE").unlink()
    with pytest.raises(EnvironmentProblem, match="no NOTICE to put in the wheel"):
        package.own_licenses(project)
    tree = fa2_tree(tmp_path / "flash-attn")
    (tree / "LICENSE").unlink()
    with pytest.raises(EnvironmentProblem, match=r"no LICENSE \(is it the replayed FA2 tree\?\)"):
        package.tree_licenses(tree)
    (tree / "LICENSE").write_bytes(b"BSD 3-Clause License\n")
    (tree / "AUTHORS").unlink()
    with pytest.raises(EnvironmentProblem, match=r"no AUTHORS \(is it the replayed FA2 tree\?\)"):
        package.tree_licenses(tree)
    (tree / "csrc" / "cutlass" / "include" / "cutlass" / "cutlass.h").write_bytes(b"#pragma once\n")
    with pytest.raises(EnvironmentProblem, match=r"cutlass\.h: does not open with a comment holding its BSD-3"):
        package.license_comment(tree / "csrc" / "cutlass" / "include" / "cutlass" / "cutlass.h")
