# SPDX-License-Identifier: BSD-3-Clause
"""The served workload's client (fa2patch.lab.serve_load) against a stand-in OpenAI-compatible server
on this machine: streamed requests complete, the asked disconnects happen, an HTTP error is a failure,
probes read their text; the workload's shape; the soak's verdict, target by target."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fa2patch.lab import serve_load as sl


class Server:
    """/v1/completions: streamed chunks " t0", " t1", ... (one per token, the last with finish_reason
    "length", then [DONE], except for 13 tokens: no [DONE]) or, unstreamed, a text made from the prompt
    (+ a suffix once ``mutate`` is set); prompts over 1,000 tokens get HTTP 400."""

    def __init__(self):
        self.mutate, self.broken = False, 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if len(body["prompt"]) > 1000:
                    self.send_response(400)
                    self.end_headers()
                    self.wfile.write(b'{"error": "prompt too long"}')
                    return
                if not body.get("stream"):
                    text = f"answer-{sum(body['prompt']) % 997}" + ("-changed" if owner.mutate else "")
                    payload = json.dumps({"choices": [{"text": text}]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for i in range(body["max_tokens"]):
                        finish = "length" if i == body["max_tokens"] - 1 else None
                        chunk = {"choices": [{"text": f" t{i}", "finish_reason": finish}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    if body["max_tokens"] != 13:  # 13 tokens: the stream stops without [DONE]
                        self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    owner.broken += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture()
def server():
    s = Server()
    yield s
    s.httpd.shutdown()


def test_streams_complete_disconnect_and_fail_as_they_should(server):
    requests = [sl.Request([1, 2, 3], 5), sl.Request(list(range(200)), 40), sl.Request([7], 30, disconnect_after=2),
                sl.Request([5] * 1001, 4), sl.Request([9], 13)]  # fmt: skip
    load = sl.run_load("127.0.0.1", server.port, "m", requests, concurrency=3, seconds=60)
    s = load["summary"]
    assert (s["sent"], s["completed"], s["disconnected"], s["failed"]) == (5, 2, 1, 2)
    assert sorted(w.split(":")[0].split(" after")[0] for w in s["failures"]) == ["HTTP 400", "the stream ended"]
    assert "[DONE] False, finish_reason 'length'" in next(w for w in s["failures"] if "stream ended" in w)
    done = sorted((r for r in load["results"] if r["status"] == "completed"), key=lambda r: r["max_tokens"])
    assert [r["chunks"] for r in done] == [5, 40]
    assert all(r["ttft_s"] > 0 and r["tpot_s"] is not None for r in done)
    cut = next(r for r in load["results"] if r["status"] == "disconnected")
    assert cut["chunks"] == 2


def test_no_request_starts_after_the_deadline(server):
    load = sl.run_load("127.0.0.1", server.port, "m", [sl.Request([1], 1)] * 5, concurrency=1, seconds=0)
    assert load["summary"]["sent"] == 0


def test_probes_read_the_text_and_the_verdict_sees_a_change(server):
    probes = sl.probe_prompts(8192, lengths=(5, 50))
    before = [sl.probe("127.0.0.1", server.port, "m", p, "phase") for p in probes]
    assert all(p["ok"] and p["text"].startswith("answer-") for p in before)
    server.mutate = True
    after = [sl.probe("127.0.0.1", server.port, "m", p, "phase") for p in probes]
    verdict = sl.judge(record(probes_before=before, probes_after=after))
    assert not verdict["pass"] and "probe answers changed over the soak" in verdict["reasons"]
    assert sl.judge(record(probes_before=before, probes_after=before))["pass"]
    refused = sl.probe("127.0.0.1", server.port, "m", sl.Request([1] * 1001, 4), "phase")
    assert not refused["ok"] and "HTTP 400" in refused["why"]


def test_an_unreachable_server_is_a_failed_request_not_a_traceback():
    r = sl.stream("127.0.0.1", 9, "m", sl.Request([1], 1), timeout=2)  # port 9: nothing listens
    assert r["status"] == "failed" and r["why"]


def test_the_mixed_workload_has_the_issues_shape():
    a = sl.mixed_workload(0, 400, 8192)
    assert a == sl.mixed_workload(0, 400, 8192)
    lengths = [len(r.prompt) for r in a]
    assert min(lengths) >= 10 and max(lengths) <= 30_000
    assert sum(n >= 16_384 for n in lengths) >= 20  # long enough for the long-prefill route
    assert all(1 <= r.max_tokens <= 512 for r in a)
    cuts = [r for r in a if r.disconnect_after is not None]
    assert 20 <= len(cuts) <= 60 and all(1 <= r.disconnect_after <= r.max_tokens for r in cuts)
    heads = {tuple(r.prompt[:64]) for r in a if len(r.prompt) >= 10_000}
    shared = sum(sum(tuple(r.prompt[:64]) == h for r in a) >= 10 for h in heads)
    assert shared == 3  # three long prefixes, each shared by many requests


def record(**changes) -> dict:
    ok = [{"ok": True, "text": "x"}]
    base = {
        "load": {"failed": 0, "failures": []},
        "server_errors": [],
        "memory": [(0.0, 100.0), (10.0, 5000.0), (20.0, 5030.0), (30.0, 4990.0)],
        "warmup_s": 10.0,
        "probes_before": ok,
        "probes_after": ok,
        "route_stats": {"devices": {"0": {"routes": {"sm70-gqa-prefill": 8}, "fallbacks": {}}}},
        "expect_route_stats": True,
        "expect_long_prefill": True,
    }
    return base | changes


def test_the_verdict_target_by_target():
    assert sl.judge(record()) == {"pass": True, "reasons": [], "memory_drift_mib": 30.0}
    cases = {
        "failed requests": record(load={"failed": 2, "failures": ["HTTP 500"]}),
        "error lines": record(server_errors=["ERROR engine died"]),
        "device memory": record(memory=[(0.0, 100.0), (10.0, 5000.0), (40.0, 5100.0)]),
        "a probe failed": record(probes_after=[{"ok": False, "why": "timeout"}]),
        "route fallbacks": record(route_stats={"devices": {"0": {"routes": {"sm70-gqa-prefill": 8},
                                                                 "fallbacks": {"workspace_oom": 1}}}}),
        "long-prefill route": record(route_stats={"devices": {"0": {"routes": {"sm70-dense": 9}, "fallbacks": {}}}}),
    }  # fmt: skip
    for words, rec in cases.items():
        verdict = sl.judge(rec)
        assert not verdict["pass"] and any(words in r for r in verdict["reasons"]), (words, verdict)
    assert sl.judge(record(route_stats=None, expect_route_stats=False))["pass"]  # FA3 or Triton: none to read
    missing = sl.judge(record(route_stats=None))
    assert not missing["pass"] and "no route_stats line" in missing["reasons"][0]
    capped = {"devices": {"0": {"routes": {"sm70-dense": 9}, "fallbacks": {"workspace_cap": 4}}}}
    assert sl.judge(record(route_stats=capped, expected_fallbacks=["workspace_cap"]))["pass"]
    unmoved = sl.judge(record(expected_fallbacks=["workspace_cap"]))
    assert unmoved["reasons"] == ["the injected fault caused no ['workspace_cap'] fallback"]


def test_memory_drift_is_measured_from_the_first_sample_after_warm_up():
    assert sl.memory_drift_mib([(0, 10.0), (5, 900.0), (6, 880.0), (9, 960.0)], warmup_s=5) == 60.0
    assert sl.memory_drift_mib([(0, 10.0)], warmup_s=5) is None


def test_the_client_refuses_a_remote_host(capsys):
    with pytest.raises(SystemExit):
        sl.main(["--host", "10.0.0.1", "--port", "8000", "--model", "m", "--json-file", "x.json"])
    assert "expected this machine (127.0.0.1), actual '10.0.0.1'" in capsys.readouterr().err
