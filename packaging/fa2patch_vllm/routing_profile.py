# SPDX-License-Identifier: BSD-3-Clause
"""Routing profiles (format ``fa2patch-routing-profile/1``; README "Tuning routing for your card"):
the one reader and validator of profile files, and ``install``, which hands a checked profile to the
loaded extension.

The file is read here, with the standard library (strict ``json``: duplicate keys, NaN and Infinity
refused; ``hashlib`` for the extension's SHA-256), never by the extension (docs/DESIGN.md §4). The
extension receives the checked decisions through ``set_routing_profile`` (or the reason through
``refuse_routing_profile``) and compares the device the profile was made on with each device at its
first SM70 call; a mismatch refuses the profile there, logged once, and the built-in rule applies.

Who calls ``install``: fa2patch's vLLM plugin in every vLLM process once the extension is loaded;
anything else that loads the extension itself (``torch.ops.load_library``) calls it after loading.
If FA2PATCH_ROUTING_PROFILE is set and nothing was installed, the extension refuses the profile at
its first SM70 call with a reason that says so: a set variable is never ignored silently.

Standalone on purpose (the standard library only; torch inside ``install``): it ships in the plugin
wheel and fa2patch's tools load this same file (fa2patch.measure.profile).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

ENV = "FA2PATCH_ROUTING_PROFILE"
FORMAT = "fa2patch-routing-profile/1"
# The names a decision may carry (build_info()'s routes); a decision's route is also its kernel:
# sm70-decode the decode kernel, sm70-dense the exact kernel.
EXACT, DECODE, GQA = "sm70-dense", "sm70-decode", "sm70-gqa-prefill"
ROUTES = (EXACT, DECODE, GQA)
TOP_LEVEL = {"format", "device", "extension_sha256", "software", "clocks_seen", "measured", "decisions"}
REQUIRED = ("format", "device", "extension_sha256", "decisions")
DEVICE_KEYS = ("name", "sms", "capability")
DECISION_KEYS = {"group", "head_dim", "q", "kv", "batch", "route", "splits"}  # batch and splits optional
MAX_SPLITS = 16
MAX_HEAD_DIM, MAX_GROUP, MAX_SMS, MAX_RANGE_END = 256, 1 << 16, 1 << 20, 1 << 62
ALL_BATCHES = (1, MAX_RANGE_END)  # a decision without "batch": any number of sequences


class ProfileRefused(ValueError):
    """A profile the router must refuse; ``reason`` is one of: unreadable, invalid_json,
    wrong_format, unknown_key, bad_field, unknown_route, device_mismatch, extension_mismatch."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"duplicate key(s) {', '.join(map(repr, duplicates))} in one object")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def load(path: str | os.PathLike) -> Any:
    """The file's JSON value, strictly parsed, or ProfileRefused (unreadable, invalid_json)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ProfileRefused("unreadable", f"{path}: cannot read it: {exc}") from None
    try:  # RFC 8259: UTF-8; a UnicodeDecodeError is a ValueError
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ProfileRefused("invalid_json", f"{path}: not valid JSON: {exc}") from None


def _int(value: Any, low: int, high: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


def _device(dev: Any, where: str) -> None:
    if not isinstance(dev, dict):
        raise ProfileRefused("bad_field", f"{where}: device: expected an object, actual {type(dev).__name__}")
    unknown = sorted(set(dev) - set(DEVICE_KEYS))
    if unknown:
        raise ProfileRefused("unknown_key", f"{where}: device: unknown key(s) {', '.join(unknown)}")
    if not isinstance(dev.get("name"), str) or not dev["name"]:
        raise ProfileRefused(
            "bad_field", f"{where}: device.name: expected a non-empty string, actual {dev.get('name')!r}"
        )
    if not _int(dev.get("sms"), 1, MAX_SMS):
        raise ProfileRefused(
            "bad_field", f"{where}: device.sms: expected an integer 1..{MAX_SMS}, actual {dev.get('sms')!r}"
        )
    cap = dev.get("capability")
    if not (isinstance(cap, list) and len(cap) == 2 and all(_int(c, 0, 1 << 16) for c in cap)):
        raise ProfileRefused("bad_field", f"{where}: device.capability: expected [major, minor], actual {cap!r}")


def _decision(d: Any, where: str) -> None:
    if not isinstance(d, dict):
        raise ProfileRefused("bad_field", f"{where}: expected an object, actual {type(d).__name__}")
    unknown = sorted(set(d) - DECISION_KEYS)
    if unknown:
        raise ProfileRefused("unknown_key", f"{where}: unknown key(s) {', '.join(unknown)}")
    for key, high in (("group", MAX_GROUP), ("head_dim", MAX_HEAD_DIM)):
        if not _int(d.get(key), 1, high):
            raise ProfileRefused("bad_field", f"{where}.{key}: expected an integer 1..{high}, actual {d.get(key)!r}")
    for key, low in (("q", 0), ("kv", 0), ("batch", 1)):
        if key == "batch" and key not in d:
            continue
        r = d.get(key)
        if not (isinstance(r, list) and len(r) == 2 and all(_int(x, low, MAX_RANGE_END) for x in r) and r[0] < r[1]):
            raise ProfileRefused(
                "bad_field", f"{where}.{key}: expected [lo, hi] integers with {low} <= lo < hi <= 2^62, actual {r!r}"
            )
    route = d.get("route")
    if not isinstance(route, str):
        raise ProfileRefused("bad_field", f"{where}.route: expected a string, actual {route!r}")
    if route not in ROUTES:
        raise ProfileRefused("unknown_route", f"{where}.route: {route!r} is not one of {', '.join(ROUTES)}")
    if "splits" in d:
        if route != EXACT:
            raise ProfileRefused("bad_field", f"{where}.splits: allowed only with route {EXACT!r}, not {route!r}")
        if not _int(d["splits"], 1, MAX_SPLITS):
            raise ProfileRefused(
                "bad_field", f"{where}.splits: expected an integer 1..{MAX_SPLITS}, actual {d['splits']!r}"
            )


def validate(doc: Any, where: str = "profile", device: dict | None = None, sha256: str | None = None) -> dict:
    """Raise ProfileRefused on the first problem the format refuses a profile for; with ``device``
    ({name, sms, capability}) and ``sha256`` (of the extension that would use it) also on another
    device or extension. Returns the document."""
    if not isinstance(doc, dict):
        raise ProfileRefused("bad_field", f"{where}: expected a JSON object, actual {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise ProfileRefused("wrong_format", f"{where}: format: expected {FORMAT!r}, actual {doc.get('format')!r}")
    unknown = sorted(set(doc) - TOP_LEVEL)
    if unknown:
        raise ProfileRefused(
            "unknown_key", f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(TOP_LEVEL))})"
        )
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise ProfileRefused("bad_field", f"{where}: missing {', '.join(missing)}")
    _device(doc["device"], where)
    sha = doc["extension_sha256"]
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ProfileRefused(
            "bad_field", f"{where}: extension_sha256: expected 64 lowercase hex digits, actual {sha!r}"
        )
    for key, kind in (("software", dict), ("clocks_seen", dict), ("measured", list)):
        if key in doc and not isinstance(doc[key], kind):
            raise ProfileRefused(
                "bad_field",
                f"{where}: {key}: expected a JSON {'object' if kind is dict else 'array'}"
                f", actual {type(doc[key]).__name__}",
            )
    if not isinstance(doc["decisions"], list):
        raise ProfileRefused(
            "bad_field", f"{where}: decisions: expected an array, actual {type(doc['decisions']).__name__}"
        )
    for i, d in enumerate(doc["decisions"]):
        _decision(d, f"{where}: decisions[{i}]")
    if device is not None:
        dev = doc["device"]
        for key in DEVICE_KEYS:
            if dev[key] != device[key]:
                raise ProfileRefused(
                    "device_mismatch",
                    f"{where}: device {key}: expected {device[key]!r} (this GPU), actual {dev[key]!r} (the profile)",
                )
    if sha256 is not None and sha != sha256:
        raise ProfileRefused(
            "extension_mismatch",
            f"{where}: extension_sha256: expected {sha256} (the loaded extension), actual {sha} (the profile)",
        )
    return doc


def check_file(path: str | os.PathLike, device: dict | None = None, sha256: str | None = None) -> dict:
    """Load and validate a profile file; ProfileRefused naming the file and the reason."""
    return validate(load(path), str(path), device, sha256)


def flat_decisions(doc: dict) -> tuple[list[int], list[str]]:
    """The decisions as set_routing_profile takes them: 9 integers each (group, head_dim, q lo, q hi,
    kv lo, kv hi, batch lo, batch hi, splits; no batch: every batch) and the routes."""
    ints: list[int] = []
    for d in doc["decisions"]:
        ints += [d["group"], d["head_dim"], *d["q"], *d["kv"], *d.get("batch", ALL_BATCHES), d.get("splits", 1)]
    return ints, [d["route"] for d in doc["decisions"]]


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def install(path: str | os.PathLike | None = None, ops: Any = None) -> dict:
    """Check the profile at ``path`` (default: $FA2PATCH_ROUTING_PROFILE) against the loaded
    extension's file and hand it to the extension (``ops``: torch.ops._vllm_fa2_C by default), or hand
    it the reason it is refused. Returns {"path", "status": "installed" | "refused" | "none", "reason"?}.
    Never raises for a bad profile: the extension logs the refusal at its first SM70 call."""
    path = path if path is not None else os.environ.get(ENV) or None
    if path is None:
        return {"path": None, "status": "none"}
    if ops is None:
        import torch

        ops = torch.ops._vllm_fa2_C
    try:
        extension = ops.extension_path()
        try:
            sha = sha256_file(extension)
        except OSError as exc:
            raise ProfileRefused("extension_mismatch", f"cannot hash the loaded extension {extension}: {exc}") from None
        doc = check_file(path, sha256=sha)
    except ProfileRefused as exc:
        ops.refuse_routing_profile(str(path), str(exc))
        return {"path": str(path), "status": "refused", "reason": str(exc)}
    ints, routes = flat_decisions(doc)
    dev = doc["device"]
    ops.set_routing_profile(
        str(path), dev["name"], dev["sms"], dev["capability"][0], dev["capability"][1], ints, routes
    )
    return {"path": str(path), "status": "installed", "decisions": len(routes)}
