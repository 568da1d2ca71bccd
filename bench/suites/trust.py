"""trust: what issue 48's guarantees cost, against its "Done when" targets (the SBOM's own time: sbom.py).

Per round (--repeat rounds, each part interleaved with the others so a load spike hits all of them alike):
1. push vs sign + attest. `ngcx push ngcx/cuda:24.05-runtime --no-sign` into a fresh docker-registry process with
   empty storage (push_registry.FreshRegistry): a new repository on 127.0.0.1:5000 would not make every layer
   upload, since a registry mounts blobs it holds under another repository. Then, in a fresh process, what
   `ngcx push` adds after it: trust/publish.py's signer read once, trust/sbom.py make_sbom(LOCAL, digest=) (one
   container of the image) and sign_and_attest (cosign signature, SLSA provenance and SBOM envelopes) on that
   digest. Target: sign + attest <= 5 % of the push.
2. verify at deploy, in a fresh process: trust/verify.py verify(REPO@DIGEST) timed from before its import (the
   first call a deploy pays), then CALLS warm calls, then CALLS calls of deploy/gate.py checked_pull with a real
   DeployConfig (it resolves the tag ngcx pushed, from the push recorded in this state, and verifies what it
   serves), its per-process memo cleared before each. Target: <= 0.3 s.
3. `ngcx build cuda:24.05 --base offline --no-cache` at HEAD against the same at commit BEFORE (no wheel hashes
   yet), from a git worktree whose cli/ and runtime/ are imported through a folder of symlinks on PYTHONPATH.
   NGCX_BENCH_TRUST_BUILDS=0 leaves this part out (each build takes minutes).
Everything this suite tags is ngcx-bench/trust-* (removed at the end); its state folder and worktree live in the
run's scratch folder.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..core import ROOT, Measurement, Ratio, Stats, SuiteResult, SuiteSkipped, ratio, script

REF = "cuda:24.05"
LOCAL = "ngcx/cuda:24.05-runtime"                 # what `ngcx build cuda:24.05` tags (runtime variant)
PINNED = "ngcx-bench/trust-cuda:24.05-runtime"    # our own tag: another session may rebuild LOCAL mid-run
BEFORE = "0e48917"                                # the last commit before issue 48's wheel hashes (7131805)
BUILT = {"HEAD": "ngcx-bench/trust-build:head", BEFORE: "ngcx-bench/trust-build:before"}
NAMESPACE = "trust"
CALLS = 5
TARGET_SHARE, TARGET_VERIFY_S = 0.05, 0.3
BUILDS_ENV = "NGCX_BENCH_TRUST_BUILDS"
DOCKER = "/usr/bin/docker"

# Run with `python -c CODE ARGS...` so nothing but the code measured is imported first (the bench's own
# suites import other parts of ngcx); each prints one JSON line.
PUBLISH = """\
import json, sys, time
remote, digest, local = sys.argv[1:4]
t0 = time.perf_counter()
from ngcx.trust.publish import prepare_signer, sign_and_attest
signer = prepare_signer(None)
t1 = time.perf_counter()
from ngcx.trust.sbom import make_sbom
bom = make_sbom(local, digest=digest)
t2 = time.perf_counter()
done = sign_and_attest(remote, digest, local_ref=local, sbom=bom, signer=signer)
t3 = time.perf_counter()
print(json.dumps({"sbom": t2 - t1, "sign": (t1 - t0) + (t3 - t2), "key": done.key,
                  "attestations": list(done.attestations), "components": len(bom.get("components") or [])}))
"""
VERIFY = """\
import json, sys, time
repository, digest, local, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ref = f"{repository}@{digest}"
t0 = time.perf_counter()
from ngcx.trust.verify import verify
first = verify(ref)
cold = time.perf_counter() - t0
if not first.ok:
    sys.exit(first.line())
warm = []
for _ in range(calls):
    t = time.perf_counter()
    verdict = verify(ref)
    warm.append(time.perf_counter() - t)
    if not verdict.ok:
        sys.exit(verdict.line())
from ngcx.deploy import gate
from ngcx.deploy.common import DeployConfig
config = DeployConfig(cloud="aws", image=local, pull_ref=None, registry=repository.split("/", 1)[0], labels={},
                      model=None)
pulls = []
for _ in range(calls):
    gate._VERIFIED.clear()
    t = time.perf_counter()
    gate.checked_pull(config, repository, digest)
    pulls.append(time.perf_counter() - t)
print(json.dumps({"cold": cold, "first_verify": first.seconds, "warm": warm, "gate": pulls,
                  "attestations": list(first.attestations)}))
"""
WHICH = "import ngcx, ngcx_runtime; print(ngcx.__file__); print(ngcx_runtime.__file__)"


class Figures:
    """Values per figure name, with how each was made; Measurements in the order first added."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}
        self.meta: dict[str, tuple[str, str, str, str]] = {}     # name -> (tool, unit, command, note)

    def add(self, name: str, value: float, tool: str, command: str, note: str = "", unit: str = "s") -> None:
        self.values.setdefault(name, []).append(value)
        self.meta[name] = (tool, unit, command, note)

    def merge(self, other: Figures) -> None:
        """Add a finished round's figures (a round that failed half-way adds none)."""
        for name, values in other.values.items():
            self.values.setdefault(name, []).extend(values)
            self.meta[name] = other.meta[name]

    def measurement(self, name: str) -> Measurement:
        tool, unit, command, note = self.meta[name]
        return Measurement(name=name, tool=tool, unit=unit, better="lower", wall=Stats.of(self.values[name]),
                           command=command, note=note)

    def measurements(self) -> list[Measurement]:
        return [self.measurement(name) for name in self.values]


# ----------------------------------------------------------------------------- processes


def _docker(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check, timeout=900)


def _run(argv: list[str], env: dict[str, str], timeout: float = 1800) -> tuple[float, float, str]:
    """(wall s, the child's CPU s, stdout) of one command; a failure stops the suite with its stderr's tail."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0, start = usage.ru_utime + usage.ru_stime, time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        shown = " ".join(a if len(a) < 80 else "CODE" for a in argv)
        raise RuntimeError(f"{shown} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime - cpu0, proc.stdout


def _probe(code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    import json

    _wall, _cpu, out = _run([sys.executable, "-c", code, *args], env, timeout=900)
    return json.loads(out.strip().splitlines()[-1])


def _retried(step: Any, facts: dict[str, Any], what: str) -> None:
    """Run step(); once more if it fails. Why: this machine's dockerd 20.10 has died mid-run under other sessions'
    concurrent builds (BuildKit's "panic: failed to get edge"), which says nothing of what is measured here.
    Each failure is kept in extra.retried; a second one stops the suite."""
    try:
        step()
    except (RuntimeError, subprocess.SubprocessError) as exc:
        facts.setdefault("retried", []).append(f"{what}: {str(exc)[-300:]}")
        print(f"bench trust: {what} failed, once more when the engine answers: {str(exc)[-200:]}", file=sys.stderr)
        deadline = time.monotonic() + 300
        while _docker("info", "--format", "{{.ServerVersion}}").returncode != 0 and time.monotonic() < deadline:
            time.sleep(5)
        step()


# ----------------------------------------------------------------------------- set-up


def _require() -> None:
    if _docker("info", "--format", "{{.ServerVersion}}").returncode != 0:
        raise SuiteSkipped("needs the Docker engine (scripts/setup.sh)")
    if shutil.which("docker-registry") is None:
        raise SuiteSkipped("needs Debian's docker-registry (scripts/setup.sh installs it)")


def _pin_image(env: dict[str, str]) -> dict[str, Any]:
    """Tag the built cuda:24.05 as PINNED (built first when missing); its id, size and layer count."""
    if _docker("image", "inspect", LOCAL).returncode != 0:
        print(f"bench trust: {LOCAL} is missing: ngcx build {REF} --base offline", file=sys.stderr)
        _run([script("ngcx"), "build", REF, "--base", "offline"], env, timeout=3600)
    _docker("tag", LOCAL, PINNED, check=True)
    out = _docker("image", "inspect", "--format", "{{.Id}} {{.Size}} {{len .RootFS.Layers}}", PINNED, check=True)
    image_id, size, layers = out.stdout.split()
    return {"id": image_id, "size": int(size), "layers": int(layers)}


def _state(work: Path) -> Path:
    """A state folder of the run's own (pushes, builds, ngcx's signing key) holding this user's offline-base pin
    (bases.json: a HEAD build refuses an unpinned offline base, render/basepin.py)."""
    from ngcx.core.paths import state_dir

    folder = work / "state"
    folder.mkdir(parents=True, exist_ok=True)
    pin = state_dir() / "bases.json"
    if pin.is_file():
        shutil.copy2(pin, folder / "bases.json")
    return folder


# ----------------------------------------------------------------------------- 1 and 2: push, sign, verify


def _push_sign_verify(work: Path, env: dict[str, str], total: Figures, facts: dict[str, Any]) -> None:
    from .push_registry import FreshRegistry

    figs = Figures()
    with FreshRegistry(parent=work) as registry:
        target = f"{registry.address}/{NAMESPACE}"
        wall, _cpu, out = _run([script("ngcx"), "push", PINNED, "--registry", target, "--no-sign"], env)
        remote, _, digest = out.strip().splitlines()[-1].partition("@")
        repository = remote.rpartition(":")[0]
        try:
            figs.add("push (ngcx push --no-sign)", wall, "ngcx", f"ngcx push {PINNED} --registry 127.0.0.1:PORT/"
                     f"{NAMESPACE} --no-sign", "into an empty registry: every layer compressed and uploaded")
            done = _probe(PUBLISH, [remote, digest, PINNED], env)
            figs.add("SBOM for the attestation (make_sbom)", done["sbom"], "ngcx", "trust/sbom.py make_sbom(LOCAL, "
                     "digest=DIGEST)", "one container of the image lists dpkg, pip and the CUDA libraries loaded")
            figs.add("sign + attach (signature, provenance, SBOM envelopes)", done["sign"], "ngcx",
                     "trust/publish.py prepare_signer + sign_and_attest(REMOTE, DIGEST, sbom=...)",
                     "fresh process: its imports and key read included; 3 manifests + blobs uploaded")
            figs.add("sign + attest, SBOM included", done["sbom"] + done["sign"], "ngcx",
                     "make_sbom + prepare_signer + sign_and_attest",
                     "the two rows above, summed per round: what ngcx push adds after the upload")
            facts.setdefault("attested", done["attestations"])
            facts.setdefault("sbom_components", done["components"])
            seen = _probe(VERIFY, [repository, digest, PINNED, str(CALLS)], env)
            figs.add("verify, first call in a fresh process", seen["cold"] * 1e3, "ngcx",
                     "python -c 'from ngcx.trust.verify import verify; verify(\"REPO@DIGEST\")'",
                     "import of trust/verify.py included (what a deploy's first check pays)", unit="ms")
            figs.add("verify, that first call alone (import aside)", seen["first_verify"] * 1e3, "ngcx",
                     "the same call, timed by verify() itself", "its lazy imports (requests, cryptography's "
                     "ECDSA) and the first connection included", unit="ms")
            figs.add(f"verify, warm (median of {CALLS} calls)", statistics.median(seen["warm"]) * 1e3, "ngcx",
                     "trust/verify.py verify(REPO@DIGEST), same process", "tag resolve + .sig + .att fetched and "
                     "checked each call", unit="ms")
            figs.add(f"deploy gate checked_pull (median of {CALLS} calls)", statistics.median(seen["gate"]) * 1e3,
                     "ngcx", "deploy/gate.py checked_pull(DeployConfig, REPO, DIGEST)", "resolves the tag ngcx "
                     "pushed (state's push row) and verifies; memo cleared per call", unit="ms")
            facts.setdefault("verify_calls_ms", []).append({k: [round(v * 1e3, 2) for v in seen[k]]
                                                            for k in ("warm", "gate")})
        finally:
            _docker("rmi", remote)                 # the engine keeps a local tag per push
    total.merge(figs)


# ----------------------------------------------------------------------------- 3: builds, HEAD and before


def _worktree(work: Path) -> tuple[Path, Path]:
    """(worktree at BEFORE, a folder with ngcx and ngcx_runtime symlinked to its cli/ and runtime/)."""
    tree = work / f"ngcx-{BEFORE}"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), BEFORE], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=300)
    shim = work / "before-path"
    shim.mkdir()
    (shim / "ngcx").symlink_to(tree / "cli", target_is_directory=True)
    (shim / "ngcx_runtime").symlink_to(tree / "runtime", target_is_directory=True)
    return tree, shim


def _check_loads(tree: Path, env: dict[str, str]) -> list[str]:
    """The files `import ngcx, ngcx_runtime` loads under that env; both must be the worktree's."""
    _w, _c, out = _run([sys.executable, "-c", WHICH], env, timeout=120)
    files = [Path(file).resolve() for file in out.split()]
    for file in files:
        if not file.is_relative_to(tree.resolve()):
            raise RuntimeError(f"PYTHONPATH did not win: {file} loads instead of {BEFORE}'s worktree")
    return [str(file.relative_to(tree.resolve())) for file in files]


Commands = dict[str, tuple[list[str], dict[str, str]]]


def _build_commands(work: Path, env: dict[str, str], facts: dict[str, Any]) -> Commands:
    """(argv, env) per commit; facts["before_loaded"]: the files the old commit's imports resolved to."""
    tree, shim = _worktree(work)
    before_env = {**env, "PYTHONPATH": str(shim)}
    facts["before_loaded"] = _check_loads(tree, before_env)
    args = ["build", REF, "--base", "offline", "--no-cache", "--progress", "plain"]
    return {"HEAD": ([script("ngcx"), *args, "--tag", BUILT["HEAD"]], env),
            BEFORE: ([sys.executable, "-m", "ngcx", *args, "--tag", BUILT[BEFORE]], before_env)}


def _build(which: str, commands: Commands, figs: Figures) -> None:
    argv, env = commands[which]
    old = _docker("image", "inspect", "--format", "{{.Id}}", BUILT[which]).stdout.strip()
    wall, _cpu, _out = _run(argv, env, timeout=1800)
    if old and old != _docker("image", "inspect", "--format", "{{.Id}}", BUILT[which]).stdout.strip():
        _docker("rmi", old)                        # the last round's image: only the layers now tagged are kept
    name = f"build --no-cache at {which}" + (" (wheels hash-checked)" if which == "HEAD" else " (before hashes)")
    figs.add(name, wall, "ngcx" if which == "HEAD" else "before", f"ngcx build {REF} --base offline --no-cache",
             "pip --require-hashes, registry.lock.yaml" if which == "HEAD" else f"commit {BEFORE}, PYTHONPATH -> "
             "its worktree's cli/ and runtime/")


def _drop_worktree(work: Path) -> None:
    tree = work / f"ngcx-{BEFORE}"
    if tree.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True,
                       timeout=300)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True, timeout=300)


# ----------------------------------------------------------------------------- the suite


def run(result: SuiteResult, work: Path, out: Path) -> None:
    """result.repeat rounds of parts 1-3, interleaved; ratios against the push and the old build, notes."""
    _require()
    env = {**os.environ, "NGCX_STATE_DIR": str(_state(work)), "NGCX_BASE": "offline"}
    builds = os.environ.get(BUILDS_ENV, "1") != "0"
    figs, facts = Figures(), {}
    try:
        facts["image"] = _pin_image(env)
        _probe("import json; from ngcx.trust.publish import prepare_signer; prepare_signer(None); print('{}')", [],
               env)                                # ngcx's key made once, before round 1 times anything
        commands = _build_commands(work, env, facts) if builds else {}
        for round_ in range(result.repeat):
            print(f"bench trust: round {round_ + 1} of {result.repeat}", file=sys.stderr)
            _retried(lambda: _push_sign_verify(work, env, figs, facts), facts, f"round {round_ + 1} push")
            for which in (("HEAD", BEFORE) if round_ % 2 == 0 else (BEFORE, "HEAD")) if builds else ():
                _retried(lambda w=which: _build(w, commands, figs), facts, f"round {round_ + 1} build {which}")
    finally:
        _docker("rmi", PINNED, *BUILT.values())
        _drop_worktree(work)
    result.measurements = figs.measurements()
    result.ratios = _ratios(figs, builds)
    result.notes = _notes(figs, builds)
    result.extra.update(ref=REF, before=BEFORE, calls_per_round=CALLS, builds=builds,
                        targets={"sign_attest_share_of_push": TARGET_SHARE, "verify_s": TARGET_VERIFY_S}, **facts)


def _ratios(figs: Figures, builds: bool) -> list[Ratio]:
    push = figs.measurement("push (ngcx push --no-sign)")
    out = [ratio("sign + attest (SBOM included) / push", figs.measurement("sign + attest, SBOM included"), push),
           ratio("sign + attach alone (SBOM aside) / push",
                 figs.measurement("sign + attach (signature, provenance, SBOM envelopes)"), push)]
    if builds:
        out.append(ratio("build with hash-checked wheels / before", figs.measurement(
            "build --no-cache at HEAD (wheels hash-checked)"), figs.measurement(f"build --no-cache at {BEFORE} "
                                                                                "(before hashes)")))
    return out                                     # wall only: dockerd and BuildKit do the work, not the CLI


def _notes(figs: Figures, builds: bool) -> list[str]:
    m = {name: figs.measurement(name).wall for name in figs.values}
    push = m["push (ngcx push --no-sign)"]
    share = m["sign + attest, SBOM included"].median / push.median
    alone = m["sign + attach (signature, provenance, SBOM envelopes)"].median / push.median
    cold = m["verify, first call in a fresh process"]
    gate = m[f"deploy gate checked_pull (median of {CALLS} calls)"]
    notes = [
        f"Target sign + attest <= {TARGET_SHARE:.0%} of the push: {share:.1%} with the SBOM made for it "
        f"({'met' if share <= TARGET_SHARE else 'not met'}), {alone:.1%} for signing and attaching alone. The push "
        f"is into an empty loopback registry (median {push.median:.1f} s); a push over a real network takes longer "
        "and the share falls. Push time varies with disk (the engine reads each layer) and the CPU left for gzip; "
        "the SBOM with the load (one container start) and the page cache.",
        f"Target verify at deploy <= {TARGET_VERIFY_S} s: first call in a fresh process {cold.median:.0f} ms "
        f"(min {cold.min:.0f}, max {cold.max:.0f}), the deploy gate {gate.median:.0f} ms: "
        f"{'met' if max(cold.max, gate.max) <= TARGET_VERIFY_S * 1e3 else 'not met at the worst call'}. Loopback "
        "registry: a remote one adds about 3 round trips (tag, .sig, .att manifests) and 3-4 blob reads; the first "
        "call's import time grows with load and a cold page cache.",
    ]
    if builds:
        head = m["build --no-cache at HEAD (wheels hash-checked)"]
        before = m[f"build --no-cache at {BEFORE} (before hashes)"]
        noise = ": the ranges overlap, so the difference is within this run's noise" if head.overlaps(before) else ""
        notes.append(
            f"Builds: HEAD {head.median:.0f} s ({head.min:.0f}-{head.max:.0f}) against {BEFORE} {before.median:.0f} s "
            f"({before.min:.0f}-{before.max:.0f}), alternated per round{noise}. --no-cache ignores the layer cache, "
            "not BuildKit's cache mounts (pip's cache, apt's lists and archives, the wheel pool) that both commits use "
            "alike; the index pages and any wheel not cached come through this machine's HTTP proxy, so the figure "
            "varies with the proxy, the load (other sessions' builds) and the disk. Each --no-cache build leaves ~2 "
            "GB of build cache behind (`docker builder prune` reclaims it).")
    else:
        notes.append(f"Builds left out ({BUILDS_ENV}=0).")
    return notes
