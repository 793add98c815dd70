# SPDX-License-Identifier: BSD-3-Clause
"""The build description's named source groups and the ptxas numbers a build reports, on small trees."""

import re
import textwrap

import pytest

from fa2patch.common.errors import CheckFailed
from fa2patch.compile.builder import BuildFailed, object_path, ptxas_kernels
from fa2patch.compile.description import BuildDescription

FILES = ["api.cpp", "hooks.cpp", "k32.cu", "k64.cu", "combine.cu", "lab_only.cu"]


def tree_with(tmp_path, toml: str):
    for f in FILES:
        (tmp_path / f).write_text("// source\n")
    (tmp_path / "fa2patch-build.toml").write_text(textwrap.dedent(toml))
    return tmp_path


def description(
    host='["api.cpp", "@host"]',
    sm70='["@kernels"]',
    sm90='["@kernels", "lab_only.cu"]',
    groups='host = ["hooks.cpp"]\nkernels = ["k32.cu", "k64.cu", "combine.cu"]',
):
    return f"""
        [sources]
        {groups}
        [extension]
        name = "ext"
        include_dirs = []
        host_sources = {host}
        [arch.sm_70]
        cuda_sources = {sm70}
        [arch.sm_90]
        cuda_sources = {sm90}
        """


def test_groups_expand_in_place_and_in_order(tmp_path):
    desc = BuildDescription.load(tree_with(tmp_path, description()))
    assert desc.host_sources == ["api.cpp", "hooks.cpp"]
    assert desc.arch("sm_70").cuda_sources == ["k32.cu", "k64.cu", "combine.cu"]
    assert desc.arch("sm_90").cuda_sources == ["k32.cu", "k64.cu", "combine.cu", "lab_only.cu"]


def test_an_unknown_group_is_named_with_the_known_ones(tmp_path):
    with pytest.raises(CheckFailed) as exc:
        BuildDescription.load(tree_with(tmp_path, description(sm70='["@kernel"]')))
    msg = str(exc.value)
    assert "fa2patch-build.toml" in msg and "[arch.sm_70] cuda_sources" in msg
    assert "expected: one of @host, @kernels" in msg and "actual:   @kernel" in msg


def test_a_group_cannot_include_a_group(tmp_path):
    with pytest.raises(CheckFailed, match=r"\[sources\] host lists @kernels"):
        BuildDescription.load(
            tree_with(tmp_path, description(groups='host = ["hooks.cpp", "@kernels"]\nkernels = ["k32.cu"]'))
        )


def test_a_file_listed_twice_after_expansion_is_refused(tmp_path):
    with pytest.raises(CheckFailed) as exc:
        BuildDescription.load(tree_with(tmp_path, description(sm90='["@kernels", "k64.cu"]')))
    assert "[arch.sm_90] cuda_sources lists a file more than once" in str(exc.value)
    assert "actual:   k64.cu repeated" in str(exc.value)


def test_a_group_file_missing_from_the_tree_is_refused_even_if_no_list_uses_it(tmp_path):
    """setup.py reads the groups directly, so every group must name real files."""
    with pytest.raises(CheckFailed, match=re.escape("lists gone.cu, which is not in the tree")):
        BuildDescription.load(
            tree_with(
                tmp_path,
                description(
                    groups='host = ["hooks.cpp"]\nkernels = ["k32.cu", "k64.cu", "combine.cu"]\nunused = ["gone.cu"]'
                ),
            )
        )


PTXAS_LOG = """\
ptxas info    : Compiling entry function '{name}' for 'sm_70'
ptxas info    : Function properties for {name}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used {regs} registers, used 1 barriers, 816 bytes cmem[0]
"""


def test_ptxas_numbers_come_only_from_the_listed_sources(tmp_path):
    """A log left by an object that the build description no longer lists is not this build's."""
    object_path(tmp_path, "k32.cu").parent.mkdir(parents=True)
    for src, name, regs in (("k32.cu", "_Z3k32v", 40), ("removed.cu", "_Z7removedv", 99)):
        (tmp_path / "obj" / f"{object_path(tmp_path, src).name}.log").write_text(PTXAS_LOG.format(name=name, regs=regs))
    kernels = ptxas_kernels(tmp_path, ["k32.cu"])
    assert [(k["name"], k["registers"]) for k in kernels] == [("_Z3k32v", 40)]
    with pytest.raises(BuildFailed, match=re.escape("the ptxas -v output of k64.cu is missing")):
        ptxas_kernels(tmp_path, ["k32.cu", "k64.cu"])
