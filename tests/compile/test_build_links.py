# SPDX-License-Identifier: BSD-3-Clause
"""build.ninja's paths (compile/builder.py): spelled relative to the build folder through its links,
so two project folders give the same commands; the links replaced on every build; a folder in a
link's place refused, naming it."""

from pathlib import Path

import pytest

from fa2patch.compile.builder import BuildFailed, folder_links, make_links, spell


def project(root: Path) -> tuple[Path, dict[str, Path]]:
    build = root / "build" / "sm_70"
    build.mkdir(parents=True)
    return build, folder_links(root / "work" / "flash-attn", root / "venv" / "site-packages", "/usr/include/py")


def test_two_project_folders_spell_the_same_paths(tmp_path):
    spelled = []
    for name in ("a", "b/deeper"):
        root = tmp_path / name
        build, links = project(root)
        paths = [
            root / "work/flash-attn/csrc/flash_attn/src",  # the tree
            root / "venv/site-packages/torch/include",  # torch's headers
            Path("/usr/include/py/Python.h"),  # Python's
            build / "cuda-12.8",  # inside the build folder
            build / "obj/x.cu.o",
        ]
        spelled.append([spell(p, build, links) for p in paths])
    assert (
        spelled[0]
        == spelled[1]
        == [
            "fa2/csrc/flash_attn/src",
            "site-packages/torch/include",
            "python-include/Python.h",
            "cuda-12.8",
            "obj/x.cu.o",
        ]
    )


def test_the_deepest_linked_folder_wins_and_others_stay_absolute(tmp_path):
    build = tmp_path / "proj" / "build" / "sm_70"
    links = {"fa2": tmp_path / "proj", "site-packages": tmp_path / "elsewhere"}
    assert spell(build / "obj/a.o", build, links) == "obj/a.o"  # the build folder is deeper than the tree
    assert spell(tmp_path / "proj/src/a.cu", build, links) == "fa2/src/a.cu"
    assert spell("/opt/cuda/include", build, links) == "/opt/cuda/include"


def test_links_are_replaced_and_a_folder_in_their_place_refused(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    make_links(build, {"fa2": tmp_path / "one"})
    make_links(build, {"fa2": tmp_path / "two"})
    assert (build / "fa2").readlink() == tmp_path / "two"
    (build / "fa2").unlink()
    (build / "fa2").mkdir()
    with pytest.raises(BuildFailed, match=r"build/fa2: expected a link to .*two made by fa2patch build, found a fold"):
        make_links(build, {"fa2": tmp_path / "two"})
