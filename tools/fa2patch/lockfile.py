"""baseline.lock: the pristine baseline, the ordered patch list and the toolchain pins.

TOML, reviewed like code. Read and written with tomlkit so that comments survive when
`fa2patch export` rewrites the [[patches]] entries.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from .errors import CheckFailed, EnvironmentProblem

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
PATCH_NAME_RE = re.compile(r"^(\d{4})-[a-z0-9][a-z0-9-]*\.patch$")


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
class Identity:
    name: str
    email: str
    date: str  # ISO 8601 with offset, used as author and committer date


class Lock:
    def __init__(self, path: Path, doc: tomlkit.TOMLDocument):
        self.path = Path(path)
        self.doc = doc
        self.baseline = self._baseline()
        self.identity = self._identity()
        self.patches = self._patches()

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

    def _field(self, table: str, key: str, kind=str):
        try:
            value = self.doc[table][key]
        except KeyError:
            raise CheckFailed(f"{self.path}: missing [{table}] {key}") from None
        value = value.unwrap() if hasattr(value, "unwrap") else value
        if not isinstance(value, kind):
            raise CheckFailed(
                f"{self.path}: [{table}] {key} must be {kind.__name__}, got {value!r}"
            )
        return value

    def _baseline(self) -> Baseline:
        b = Baseline(**{
            name: self._field("baseline", name, int if name in ("size", "files") else str)
            for name in Baseline.__dataclass_fields__
        })
        if not SHA256_RE.match(b.sha256):
            raise CheckFailed(f"{self.path}: [baseline] sha256 is not 64 hex digits: {b.sha256!r}")
        if not DIGEST_RE.match(b.tree_digest):
            raise CheckFailed(f"{self.path}: [baseline] tree_digest is not sha256:<hex>: {b.tree_digest!r}")
        return b

    def _identity(self) -> Identity:
        return Identity(**{n: self._field("workspace", n) for n in Identity.__dataclass_fields__})

    def _patches(self) -> list[PatchEntry]:
        entries = []
        for i, raw in enumerate(self.doc.get("patches", []), start=1):
            entry = PatchEntry(**{k: str(raw.get(k, "")) for k in PatchEntry.__dataclass_fields__})
            m = PATCH_NAME_RE.match(entry.file)
            if not m or int(m.group(1)) != i:
                raise CheckFailed(
                    f"{self.path}: patch #{i} file name must be {i:04d}-<slug>.patch, got {entry.file!r}"
                )
            if not SHA256_RE.match(entry.sha256) or not DIGEST_RE.match(entry.tree_digest):
                raise CheckFailed(f"{self.path}: patch {entry.file}: malformed sha256 or tree_digest")
            entries.append(entry)
        return entries

    @property
    def toolchain(self) -> dict:
        return self.doc.get("toolchain", {}).unwrap() if "toolchain" in self.doc else {}

    def final_digest(self) -> str:
        return self.patches[-1].tree_digest if self.patches else self.baseline.tree_digest

    def series_fingerprint(self) -> str:
        """sha256 of what determines the workspace: baseline, identity and patch list."""
        import dataclasses
        import hashlib
        import json

        state = [dataclasses.asdict(self.baseline), dataclasses.asdict(self.identity),
                 [dataclasses.asdict(p) for p in self.patches]]
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
