# SPDX-License-Identifier: BSD-3-Clause
"""The toolchain pins have one home, baseline.lock: the install script reads them from there."""

import re

from helpers import REPO, locked_toolchain


def test_install_script_takes_the_fatbinary_and_clang_pins_from_the_lock():
    script = (REPO / "ci" / "install.sh").read_text()
    pins = locked_toolchain()
    assert pins.fatbinary_wheel not in script and "13.0.88" not in script
    assert not re.search(r"clang(\+\+)?-\d", script), "the clang version is retyped in ci/install.sh"
    assert "fatbinary_wheel" in script and "clang" in script


def test_check_compares_the_pins_with_pyproject(mini):
    """`check` passes with this repository's pyproject.toml and fails on a changed `build` extra."""
    assert "toolchain pins" in mini.run("check").stdout
    pyproject = mini.root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"torch==2.9.1"', '"torch==2.9.0"'))
    proc = mini.run("check", check_rc=1)
    assert str(pyproject) in proc.stdout and "torch==2.9.0" in proc.stdout and "torch==2.9.1" in proc.stdout
