import tomllib

from helpers import REPO


def test_lock_toolchain_pins_match_pyproject_build_extra():
    lock = tomllib.loads((REPO / "baseline.lock").read_text())["toolchain"]
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["build"]
    assert f"torch=={lock['torch']}" in extra
    for wheel in lock["wheels"]:
        assert wheel in extra
    assert lock["cuda"] == "12.8" and all("12.8" in w for w in lock["wheels"])


def test_install_script_uses_the_locked_fatbinary_wheel():
    lock = tomllib.loads((REPO / "baseline.lock").read_text())["toolchain"]
    assert lock["fatbinary_wheel"] in (REPO / "ci" / "install.sh").read_text()
