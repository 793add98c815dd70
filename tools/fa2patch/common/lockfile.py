# SPDX-License-Identifier: BSD-3-Clause
"""baseline.lock: the pristine baseline, the ordered patch list and the toolchain pins.

TOML, reviewed like code. Read and written with tomlkit so that comments survive when
`fa2patch export` rewrites the [[patches]] entries.

Every field is checked against what it describes, and unknown fields are refused:
- here, on loading: the format number, the shape of every value, and the fields that must
  agree with each other (archive and top folder from project and version; wheel versions
  from the CUDA release);
- by fetch: the archive's sha256 and size;
- by replay: the archive's top folder and PKG-INFO (project, version), the extracted file
  count and tree digest, each patch's sha256 and tree digest;
- by check: the toolchain pins against pyproject.toml's `build` extra;
- by doctor and build: the toolchain pins against what is installed.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from fa2patch.common.errors import CheckFailed, EnvironmentProblem, mismatch

FORMAT = 2
# \Z, not $, ends the patterns: $ also matches before a final newline ("...\n").
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}\Z")
PATCH_NAME_RE = re.compile(r"^([0-9]{4})-[a-z0-9][a-z0-9-]*\.patch\Z")
PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+-]*)\Z")
SDIST_SUFFIX = ".tar.gz"


def normalize_name(name: str) -> str:
    """A distribution name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Baseline:
    project: str
    version: str
    archive: str
    sha256: str
    size: int
    top_dir: str
    tree_digest: str
    files: int


@dataclass(frozen=True)
class PatchEntry:
    file: str
    sha256: str
    tree_digest: str


@dataclass(frozen=True)
class Toolchain:
    cuda: str  # the CUDA release the sm_70 build targets, "12.8"
    torch: str  # the torch release the extension is built and loaded with
    clang: str  # the clang major version of the clang route
    wheels: tuple[str, ...]  # the CUDA wheels of pyproject.toml's `build` extra, "name==version"
    fatbinary_wheel: str  # installed --no-deps for its fatbinary, "name==version"

    def pins(self) -> dict[str, str]:
        """{distribution name: pinned version} of every pinned Python package."""
        return dict(split_pin(p) for p in (f"torch=={self.torch}", *self.wheels))

    @property
    def fatbinary_pin(self) -> tuple[str, str]:
        return split_pin(self.fatbinary_wheel)


def split_pin(pin: str) -> tuple[str, str]:
    """("name", "version") of "name==version" (the lock's pins are checked to have that form)."""
    m = PIN_RE.match(pin)
    if m is None:
        raise ValueError(f"{pin!r} is not NAME==VERSION")
    return m.group(1), m.group(2)


@dataclass(frozen=True)
class Identity:
    name: str
    email: str
    date: str  # ISO 8601 with offset, used as author and committer date


# Author, committer and date of every workspace commit, so that replays give identical commit ids.
WORKSPACE_IDENTITY = Identity("fa2patch", "fa2patch@localhost", "2025-08-15T00:00:00+00:00")

TABLES = {"baseline": Baseline, "toolchain": Toolchain}
TOP_LEVEL = {"format", "baseline", "toolchain", "patches"}


class Lock:
    def __init__(self, path: Path, doc: tomlkit.TOMLDocument):
        self.path = Path(path)
        self.doc = doc
        self._plain = doc.unwrap()  # plain Python values to check (tomlkit gives a bare bool for true/false)
        self._check_format()
        self.baseline = self._baseline()
        self.toolchain = self._toolchain()
        self.patches = self._patches()
        self.identity = WORKSPACE_IDENTITY

    @classmethod
    def load(cls, path: Path) -> "Lock":
        path = Path(path)
        if not path.is_file():
            raise EnvironmentProblem(f"{path}: lock file not found")
        try:
            doc = tomlkit.parse(path.read_text())
        except Exception as exc:  # tomlkit raises several parse error types
            raise CheckFailed(f"{path}: not valid TOML: {exc}") from exc
        return cls(path, doc)

    def _fail(self, message: str) -> CheckFailed:
        return CheckFailed(f"{self.path}: {message}")

    def _check_format(self) -> None:
        value = self._plain.get("format")
        if value is None:
            raise self._fail("missing format")
        if type(value) is not int or value != FORMAT:
            raise CheckFailed(
                mismatch("format", str(self.path), FORMAT, value) + "\n  (a lock written for another fa2patch version)"
            )
        unknown = sorted(set(self._plain) - TOP_LEVEL)
        if unknown:
            raise self._fail(
                f"unknown top-level field(s) {', '.join(unknown)} (expected only {', '.join(sorted(TOP_LEVEL))})"
            )

    def _table(self, name: str, cls, kinds: dict) -> dict:
        table = self._plain.get(name)
        if table is None:
            raise self._fail(f"missing [{name}]")
        if not isinstance(table, dict):
            raise self._fail(f"[{name}] must be a table, got {table!r}")
        fields = cls.__dataclass_fields__
        unknown = sorted(set(table) - set(fields))
        missing = [f for f in fields if f not in table]
        if unknown or missing:
            raise self._fail(
                f"[{name}] "
                + "; ".join(
                    ([f"unknown field(s) {', '.join(unknown)}"] if unknown else [])
                    + ([f"missing {', '.join(missing)}"] if missing else [])
                )
            )
        for key, value in table.items():
            kind = kinds.get(key, str)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise self._fail(f"[{name}] {key} must be {kind.__name__}, got {value!r}")
        return table

    def _baseline(self) -> Baseline:
        b = Baseline(**self._table("baseline", Baseline, {"size": int, "files": int}))
        if not SHA256_RE.match(b.sha256):
            raise self._fail(f"[baseline] sha256 is not 64 hex digits: {b.sha256!r}")
        if not DIGEST_RE.match(b.tree_digest):
            raise self._fail(f"[baseline] tree_digest is not sha256:<hex>: {b.tree_digest!r}")
        if b.size <= 0 or b.files <= 0:
            raise self._fail(f"[baseline] size and files must be positive, got {b.size} and {b.files}")
        # An sdist is <name>-<version>.tar.gz holding the folder <name>-<version>/, where <name>
        # is the project's name in any spelling that normalizes to the same (PEP 503/625).
        name, dash, version = b.top_dir.rpartition("-")
        if not dash or normalize_name(name) != normalize_name(b.project) or version != b.version:
            raise CheckFailed(
                mismatch("[baseline] top_dir", str(self.path), f"<{b.project} in any spelling>-{b.version}", b.top_dir)
            )
        if b.archive != b.top_dir + SDIST_SUFFIX:
            raise CheckFailed(mismatch("[baseline] archive", str(self.path), b.top_dir + SDIST_SUFFIX, b.archive))
        return b

    def _toolchain(self) -> Toolchain:
        raw = self._table("toolchain", Toolchain, {"wheels": list})
        t = Toolchain(**{**raw, "wheels": tuple(raw["wheels"])})
        if not re.fullmatch(r"[0-9]+\.[0-9]+", t.cuda) or not re.fullmatch(r"[0-9]+", t.clang):
            raise self._fail(f"[toolchain] cuda must be MAJOR.MINOR and clang MAJOR, got {t.cuda!r} and {t.clang!r}")
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", t.torch):
            raise self._fail(f"[toolchain] torch must be a release number, got {t.torch!r}")
        for pin in (*t.wheels, t.fatbinary_wheel):
            if not isinstance(pin, str) or not PIN_RE.match(pin):
                raise self._fail(f"[toolchain] {pin!r} is not NAME==VERSION")
        for pin in t.wheels:  # the CUDA wheels are the release that `cuda` names
            _, version = split_pin(pin)
            if not version.startswith(t.cuda + "."):
                raise CheckFailed(
                    mismatch(
                        f"[toolchain] CUDA release of {pin}", str(self.path), f"{t.cuda}.x (the cuda field)", version
                    )
                )
        return t

    def _patches(self) -> list[PatchEntry]:
        items = self._plain.get("patches", [])
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise self._fail(f"patches must be an array of tables ([[patches]]), got {items!r}")
        entries = []
        fields = PatchEntry.__dataclass_fields__
        for i, raw in enumerate(items, start=1):
            if set(raw) != set(fields):
                raise self._fail(f"patch #{i}: fields {sorted(raw)}, expected {sorted(fields)}")
            wrong = next((k for k in fields if not isinstance(raw[k], str)), None)
            if wrong is not None:
                raise self._fail(f"patch #{i}: {wrong} must be str, got {raw[wrong]!r}")
            entry = PatchEntry(**{k: raw[k] for k in fields})
            m = PATCH_NAME_RE.match(entry.file)
            if not m or int(m.group(1)) != i:
                raise self._fail(f"patch #{i} file name must be {i:04d}-<slug>.patch, got {entry.file!r}")
            if not SHA256_RE.match(entry.sha256):
                raise self._fail(f"patch {entry.file}: sha256 is not 64 hex digits: {entry.sha256!r}")
            if not DIGEST_RE.match(entry.tree_digest):
                raise self._fail(f"patch {entry.file}: tree_digest is not sha256:<hex>: {entry.tree_digest!r}")
            entries.append(entry)
        return entries

    def final_digest(self) -> str:
        return self.patches[-1].tree_digest if self.patches else self.baseline.tree_digest

    def series_fingerprint(self) -> str:
        """sha256 of what determines the workspace: baseline, identity and patch list."""
        import dataclasses
        import hashlib
        import json

        state = [
            dataclasses.asdict(self.baseline),
            dataclasses.asdict(self.identity),
            [dataclasses.asdict(p) for p in self.patches],
        ]
        return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()

    def write_patches(self, entries: list[PatchEntry]) -> None:
        """Replace the [[patches]] array and write the file (atomically)."""
        aot = tomlkit.aot()
        for e in entries:
            t = tomlkit.table()
            t.add("file", e.file)
            t.add("sha256", e.sha256)
            t.add("tree_digest", e.tree_digest)
            aot.append(t)
        if "patches" in self.doc:
            del self.doc["patches"]
        self.doc.add("patches", aot)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(tomlkit.dumps(self.doc))
        tmp.replace(self.path)
        self.patches = list(entries)
