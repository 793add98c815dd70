# SPDX-License-Identifier: BSD-3-Clause
"""The toolchain pins have one home, baseline.lock: pyproject.toml's `build` extra pins the same
versions (`fa2patch check` holds it to them) and the install script reads them from the lock. Every
expectation here is computed from those files, so a pin change keeps the tests meaningful."""

import re
import tomllib

from helpers import REPO, locked_toolchain


def build_extra(path=REPO / "pyproject.toml") -> dict[str, str]:
    """{name: version} of the `==` pins of pyproject.toml's `build` extra."""
    extra = tomllib.loads(path.read_text())["project"]["optional-dependencies"]["build"]
    return dict(r.replace(" ", "").split("==") for r in extra if "==" in r)


def test_pyproject_pins_exactly_what_the_lock_pins():
    """torch and every CUDA wheel of the lock's [toolchain], version for version, and no other pin."""
    pins = locked_toolchain().pins()
    assert "torch" in pins and len(pins) > 1
    assert build_extra() == pins


def test_install_script_takes_every_pin_from_the_lock():
    """No version the lock pins (clang's major, the fatbinary wheel, torch, the CUDA wheels) is typed
    into ci/install.sh: it installs the `build` extra and reads each [toolchain] field it needs with
    its `pin` function."""
    script = (REPO / "ci" / "install.sh").read_text()
    toolchain = locked_toolchain()
    versions = {toolchain.clang, toolchain.fatbinary_pin[1], *toolchain.pins().values()}
    typed = [v for v in sorted(versions) if re.search(rf"(?<![\w.]){re.escape(v)}(?![\w.])", script)]
    assert typed == [], f"ci/install.sh types the locked version(s) {typed}"
    assert re.search(r"\$\(pin clang\)", script) and re.search(r"\$\(pin fatbinary_wheel\)", script)
    assert "'.[build,test,docs,plot]'" in script  # docs, plot: the user guide and report --plot's tests


def test_check_compares_the_pins_with_pyproject(mini):
    """`check` passes with this repository's pyproject.toml and fails, naming both versions, when
    the `build` extra pins another torch than the lock (the lock's own version, changed)."""
    assert "toolchain pins" in mini.run("check").stdout
    torch = locked_toolchain().torch
    other = re.sub(r"(\d+)$", lambda m: str(int(m.group(1)) + 1), torch)
    pyproject = mini.root / "pyproject.toml"
    text = pyproject.read_text()
    assert f'"torch=={torch}"' in text
    pyproject.write_text(text.replace(f'"torch=={torch}"', f'"torch=={other}"'))
    assert build_extra(pyproject)["torch"] == other
    proc = mini.run("check", check_rc=1)
    assert str(pyproject) in proc.stdout and f"torch=={other}" in proc.stdout and f"torch=={torch}" in proc.stdout
