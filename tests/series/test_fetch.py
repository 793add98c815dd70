# SPDX-License-Identifier: BSD-3-Clause
import hashlib
import http.server
import json
import threading
from typing import ClassVar

import pytest

from fa2patch.series.fetch import pip_index_urls


class _Index(http.server.BaseHTTPRequestHandler):
    """A loopback simple repository: /json/<project>/ (PEP 691), /html/<project>/ (PEP 503)."""

    files: ClassVar[dict] = {}  # shared by the handler instances of one server
    stated_sha: str | None = None

    def do_GET(self):
        kind, _, rest = self.path.strip("/").partition("/")
        if rest.startswith("files/"):
            body, ctype = self.files.get(rest[len("files/") :]), "application/octet-stream"
        elif rest == "mini":
            entries = [(n, self.stated_sha or hashlib.sha256(d).hexdigest()) for n, d in self.files.items()]
            if kind == "json":
                body = json.dumps(
                    {
                        "meta": {"api-version": "1.0"},
                        "name": "mini",
                        "files": [{"filename": n, "url": f"../files/{n}", "hashes": {"sha256": h}} for n, h in entries],
                    }
                ).encode()
                ctype = "application/vnd.pypi.simple.v1+json"
            else:
                body = "".join(f'<a href="../files/{n}#sha256={h}">{n}</a>' for n, h in entries).encode()
                ctype = "text/html"
        else:
            body = None
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def index(mini):
    _Index.files = {"mini-1.0.tar.gz": mini.archive.read_bytes()}
    _Index.stated_sha = None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("api", ["json", "html"])
def test_fetch_through_simple_index_verifies_and_caches(mini, index, api):
    mini.run("fetch", "--index-url", f"{index}/{api}/")
    cached = mini.cache / "archives" / "mini-1.0.tar.gz"
    assert cached.read_bytes() == mini.archive.read_bytes()


def test_pip_index_url_environment_is_used(mini, index, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", f"{index}/json/")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    assert pip_index_urls()[0] == f"{index}/json/"
    assert "verified" in mini.run("fetch").stdout


def test_tampered_download_is_rejected_and_not_cached(mini, index):
    good = mini.archive.read_bytes()
    _Index.files["mini-1.0.tar.gz"] = good[:-1] + bytes([good[-1] ^ 1])
    _Index.stated_sha = hashlib.sha256(good).hexdigest()  # the index claims the right hash
    proc = mini.run("fetch", "--index-url", f"{index}/json/", check_rc=1)
    assert "sha256 mismatch" in proc.stderr
    assert hashlib.sha256(good).hexdigest() in proc.stderr
    assert hashlib.sha256(_Index.files["mini-1.0.tar.gz"]).hexdigest() in proc.stderr
    assert not (mini.cache / "archives" / "mini-1.0.tar.gz").exists()
    assert not list((mini.cache / "archives").glob(".partial-*"))


def test_index_stating_another_hash_is_rejected(mini, index):
    _Index.stated_sha = "0" * 64
    proc = mini.run("fetch", "--index-url", f"{index}/html/", check_rc=1)
    assert "stated by the index" in proc.stderr and "0" * 64 in proc.stderr


def test_archive_missing_from_index_is_an_environment_error(mini, index):
    _Index.files = {}
    proc = mini.run("fetch", "--index-url", f"{index}/json/", check_rc=2)
    assert "mini-1.0.tar.gz: not found in any configured package index" in proc.stderr


def test_offline_sdist_is_verified(mini, tmp_path):
    mini.run("fetch", "--sdist", str(mini.archive))
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(mini.archive.read_bytes() + b"\0")
    proc = mini.run("fetch", "--sdist", str(bad), "--force", check_rc=1)
    assert str(bad) in proc.stderr and "expected" in proc.stderr
    missing = mini.run("fetch", "--sdist", str(tmp_path / "nope.tar.gz"), "--force", check_rc=2)
    assert "nope.tar.gz: --sdist file not found" in missing.stderr


def _tampered_copy(mini, tmp_path):
    """The archive with one byte flipped (same size), and the two hashes."""
    good = mini.archive.read_bytes()
    bad = tmp_path / "tampered" / mini.archive.name
    bad.parent.mkdir()
    bad.write_bytes(good[:200] + bytes([good[200] ^ 1]) + good[201:])
    return bad, hashlib.sha256(good).hexdigest(), hashlib.sha256(bad.read_bytes()).hexdigest()


@pytest.mark.parametrize("command", ["fetch", "replay"])
def test_a_named_sdist_is_verified_even_when_the_cache_holds_the_archive(mini, tmp_path, command):
    mini.run("fetch", "--sdist", str(mini.archive))
    cached = mini.cache / "archives" / "mini-1.0.tar.gz"
    bad, good_sha, bad_sha = _tampered_copy(mini, tmp_path)
    proc = mini.run(command, "--sdist", str(bad), check_rc=1)
    assert str(bad) in proc.stderr and good_sha in proc.stderr and bad_sha in proc.stderr
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == good_sha  # the cache is untouched
    assert not mini.workspace.exists()


def test_a_named_sdist_is_used_instead_of_a_bad_cached_archive(mini, tmp_path):
    cached = mini.cache / "archives" / "mini-1.0.tar.gz"
    bad, good_sha, _ = _tampered_copy(mini, tmp_path)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(bad.read_bytes())
    assert "sha256 mismatch" in mini.run("replay", check_rc=1).stderr
    mini.run("replay", "--sdist", str(mini.archive))
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == good_sha
    assert (mini.workspace / "README").read_text() == "mini baseline\n"
