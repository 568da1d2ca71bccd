"""The image page's trust panel: each recorded push verified (signature, SBOM, provenance) off the request thread.

Why its own module, and why checks run in a pool with a cache (issue 48, item 6): verifying a push asks its
registry for the signature and attestation manifests and their blobs (trust/verify.py); a registry that does
not answer takes requests' 10 s timeout per call (registry/api.py), and a page must not wait for that. So a
page starts the checks it needs, waits at most PAGE_WAIT_S for them, and shows "checking" for the rest; a check
still running after CHECK_TIMEOUT_S reads "unreachable". The store watcher polls `version()` (app.py
_moving_parts), so a check that finishes or times out makes the open page fetch its live parts again.

What is shown comes only from verified bytes: the SBOM and the provenance are read from the DSSE envelopes at
the digest's .att tag whose signatures verify with the same key and whose subject is the digest (the checks of
trust/verify.py's _open_envelope), never from an attestation that failed. The key is ngcx's own public key on
this machine (what `ngcx verify` uses without --key): the dashboard reads it, never makes one.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import UserError

PAGE_WAIT_S = 2.0          # a page waits this long for its checks, then shows "checking" (loopback: ~50 ms)
CHECK_TIMEOUT_S = 25.0     # a check still running after this reads "unreachable" (the registry did not answer)
FRESH_S = 60.0             # a finished check is reused this long; then the next page view (or live refresh) checks
                           # again, showing the last result meanwhile: an attestation edited later is marked within it
MAX_COMPONENTS = 2000      # rows of the components table (the download has them all)
SLSA = "https://slsa.dev/provenance/v1"
CYCLONEDX = "https://cyclonedx.org/bom"
KINDS = (("deb", "Debian packages"), ("pypi", "Python distributions"), ("cuda", "CUDA libraries"),
         ("model", "model files"), ("other", "other"))


@dataclass
class Check:
    """One push's check: running (future), then its result (a dict the template reads)."""

    future: Future
    started: float
    result: dict[str, Any] | None = None
    done_at: float = 0.0
    sbom_json: bytes | None = field(default=None, repr=False)
    previous: dict[str, Any] | None = None     # the last check's result, shown while a stale one is redone


class TrustChecks:
    """The checks of the pushes the pages have shown, keyed by (remote ref, digest)."""

    def __init__(self, workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ngcx-trust")
        self._checks: dict[tuple[str, str], Check] = {}
        self._lock = threading.Lock()

    def annotate(self, pushes: list[dict[str, Any]], wait_s: float = PAGE_WAIT_S) -> None:
        """Set each push's "trust" (see `_view`), starting the checks not cached, waiting at most `wait_s`."""
        checks = [self._start((p["remote_ref"], p["digest"])) for p in pushes]
        running = [c.future for c in checks if not c.future.done()]
        if running:
            wait(running, timeout=wait_s)
        for push, check in zip(pushes, checks, strict=True):
            push["trust"] = self._view(check)

    def sbom(self, remote_ref: str, digest: str, wait_s: float = CHECK_TIMEOUT_S) -> tuple[bytes | None, str]:
        """(the CycloneDX JSON of a verified push, "") or (None, why not: one line)."""
        check = self._start((remote_ref, digest))
        if not check.future.done():
            wait([check.future], timeout=wait_s)
        view = self._view(check)
        if view["state"] != "valid":
            return None, f"{remote_ref}@{digest}: {view['state']}: {view.get('line') or 'not verified yet'}"
        if check.sbom_json is None:
            return None, f"{remote_ref}@{digest}: verified, but no CycloneDX SBOM is attested for it"
        return check.sbom_json, ""

    def version(self) -> tuple:
        """What the watcher compares between ticks: every check's state (a timeout changes it too)."""
        with self._lock:
            checks = list(self._checks.items())
        return tuple((key, self._view(check)["state"]) for key, check in checks)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _start(self, key: tuple[str, str]) -> Check:
        with self._lock:
            check = self._checks.get(key)
            stale = check is not None and check.future.done() and time.monotonic() - check.done_at > FRESH_S
            if check is None or stale:
                before = check
                check = Check(future=Future(), started=time.monotonic(), previous=before.result if before else None,
                              sbom_json=before.sbom_json if before else None)
                check.future = self._pool.submit(self._run, check, *key)
                self._checks[key] = check
            return check

    def _run(self, check: Check, remote_ref: str, digest: str) -> None:
        try:
            check.result, check.sbom_json = verify_push(remote_ref, digest)
        except Exception as exc:  # noqa: BLE001 - one push's odd registry answer is its row's line, not a 500
            check.result = {"state": "error", "line": f"{type(exc).__name__}: {str(exc)[:200]}"}
        check.done_at = time.monotonic()

    @staticmethod
    def _view(check: Check) -> dict[str, Any]:
        if check.result is not None:
            return check.result
        if check.previous is not None and time.monotonic() - check.started <= CHECK_TIMEOUT_S:
            return check.previous
        if time.monotonic() - check.started > CHECK_TIMEOUT_S:
            return {"state": "unreachable",
                    "line": f"the registry did not answer within {CHECK_TIMEOUT_S:.0f} s (still trying)"}
        return {"state": "checking", "line": "verifying against the registry…"}


def verify_push(remote_ref: str, digest: str) -> tuple[dict[str, Any], bytes | None]:
    """(the view of one push, the SBOM's JSON bytes when verified): its digest verified with ngcx's key, then the
    verified attestations read, and what the tag serves now (another digest is a note, not a failure: a later
    push of the same tag is normal; `ngcx deploy` checks whatever the tag serves)."""
    from ..trust.keys import public_key_for
    from ..trust.ociref import Repo, parse_ref
    from ..trust.verify import _load_public, verify

    try:
        ref = parse_ref(remote_ref)
        pem = public_key_for(None)
    except UserError as exc:
        return {"state": "nokey", "line": exc.message}, None
    try:
        verdict = verify(f"{ref.name}@{digest}", public_pem=pem)
    except UserError as exc:
        state = "unreachable" if "not reachable" in exc.message else "error"
        return {"state": state, "line": exc.message}, None
    view: dict[str, Any] = {"state": "valid" if verdict.ok else "failed", "line": verdict.failure,
                            "verdict": verdict.as_dict()}
    if not verdict.ok:
        return view, None
    repo = Repo.of(ref)
    statements = _verified_statements(repo, digest, _load_public(pem))
    bom, prov = statements.get(CYCLONEDX), statements.get(SLSA)
    view["sbom"] = sbom_summary(bom["predicate"]) if bom else None
    view["provenance"] = provenance_view(prov["predicate"]) if prov else None
    view["tag_digest"] = _tag_digest(repo, ref)
    return view, _json_bytes(bom["predicate"]) if bom else None


def _verified_statements(repo: Any, digest: str, public: Any) -> dict[str, dict[str, Any]]:
    """{predicateType: statement} of the envelopes at the .att tag that verify with `public` and name `digest`."""
    from ..trust.attest import DSSE_LAYER
    from ..trust.ociref import att_tag
    from ..trust.verify import _open_envelope

    manifest = repo.manifest_json(att_tag(digest)) or {}
    found: dict[str, dict[str, Any]] = {}
    for descriptor in manifest.get("layers") or []:
        if descriptor.get("mediaType") != DSSE_LAYER:
            continue
        raw = repo.blob(descriptor.get("digest", ""))
        stmt = _open_envelope(raw, public) if raw is not None else None
        subjects = [s.get("digest", {}).get("sha256") for s in (stmt or {}).get("subject") or []]
        if stmt and digest.removeprefix("sha256:") in subjects and isinstance(stmt.get("predicate"), dict):
            found[stmt.get("predicateType", "")] = stmt
    return found


def _tag_digest(repo: Any, ref: Any) -> str | None:
    try:
        return repo.resolve(ref) if ref.tag else None
    except UserError:
        return None


def _json_bytes(doc: dict[str, Any]) -> bytes:
    import json

    return json.dumps(doc, indent=2, sort_keys=False).encode()


def kind_of(component: dict[str, Any]) -> str:
    """deb / pypi / cuda / model / other, from the purl and ngcx's package-type property (trust/sbom_cyclonedx.py
    writes pkg:deb/…, pkg:pypi/…, pkg:generic/nvidia/… with ngcx:package-type cuda-library)."""
    purl = component.get("purl") or ""
    props = {p.get("name"): p.get("value") for p in component.get("properties") or [] if isinstance(p, dict)}
    if purl.startswith("pkg:deb/"):
        return "deb"
    if purl.startswith("pkg:pypi/"):
        return "pypi"
    if props.get("ngcx:package-type") == "cuda-library" or purl.startswith("pkg:generic/nvidia/"):
        return "cuda"
    if component.get("type") == "machine-learning-model":
        return "model"
    return "other"


def sbom_summary(bom: dict[str, Any]) -> dict[str, Any]:
    """Counts by kind (deb, pypi, CUDA libraries, …) and the component rows (name, version, kind, purl)."""
    components = [c for c in bom.get("components") or [] if isinstance(c, dict)]
    rows = [{"name": c.get("name", "?"), "version": c.get("version") or "", "kind": kind_of(c),
             "purl": c.get("purl") or ""} for c in components]
    counts = Counter(r["kind"] for r in rows)
    subject = (bom.get("metadata") or {}).get("component") or {}
    return {"format": f"{bom.get('bomFormat', '?')} {bom.get('specVersion', '')}".strip(), "total": len(rows),
            "counts": [{"kind": k, "title": title, "count": counts[k]} for k, title in KINDS if counts[k]],
            "components": rows[:MAX_COMPONENTS], "cut": max(0, len(rows) - MAX_COMPONENTS),
            "subject": subject.get("name")}


def provenance_view(predicate: dict[str, Any]) -> dict[str, Any]:
    """SLSA v1's fields a reader asks for: builder, build type, parameters, resolved dependencies, start and end."""
    definition = predicate.get("buildDefinition") or {}
    run = predicate.get("runDetails") or {}
    builder = run.get("builder") or {}
    meta = run.get("metadata") or {}
    deps = [{"name": d.get("name") or d.get("uri") or "?", "uri": d.get("uri") or "",
             "digest": ", ".join(f"{k}:{v}" for k, v in sorted((d.get("digest") or {}).items()))}
            for d in definition.get("resolvedDependencies") or [] if isinstance(d, dict)]
    version = builder.get("version") or {}
    return {"builder": builder.get("id"), "builder_version": ", ".join(f"{k} {v}" for k, v in version.items())
            if isinstance(version, dict) else str(version), "build_type": definition.get("buildType"),
            "parameters": dict(definition.get("externalParameters") or {}), "dependencies": deps,
            "started": meta.get("startedOn"), "finished": meta.get("finishedOn"),
            "invocation": meta.get("invocationId")}
