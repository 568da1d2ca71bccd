"""`ngcx test` in a project folder: the release's checks, then the served model against examples.yaml.

Why both: the project image inherits its base's pins, and a user requirement could still have
broken what the dynamic linker loads, so the release's checks (test/image.py test_image) run on
the PROJECT image; then the image is started as a user's host would start it (serving.py), and
every example is sent through the same KServe v2 wire format a client uses, compared within its
tolerance (examples.py), and timed: p50 / p99 over `repeats` requests per example.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..test.image import Check
    from .spec import Project


@dataclass
class ExampleRun:
    """What one example did: its diffs against the expected outputs and its latencies."""

    name: str
    where: str
    diffs: list[str] = field(default_factory=list)
    error: str = ""
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.diffs and not self.error


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): with 20 samples p99 is the slowest, never interpolated."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def run_examples(client: Any, model: str, examples: list, repeats: int) -> list[ExampleRun]:
    """Send every example once and compare; then `repeats` more times each for the latency figures."""
    from .client import InferError
    from .examples import compare

    runs = []
    for ex in examples:
        run = ExampleRun(ex.name, ex.where)
        try:
            got = _timed(client, model, ex.inputs, run.latencies_ms)
            run.diffs = compare(ex.outputs, got)
            for _ in range(repeats):
                _timed(client, model, ex.inputs, run.latencies_ms)
        except InferError as exc:
            run.error = f"the server answered {exc.status}: {exc.message}"
        runs.append(run)
    return runs


def _timed(client: Any, model: str, inputs: dict, into: list[float]) -> dict:
    start = time.perf_counter()
    out = client.infer(model, inputs)
    into.append((time.perf_counter() - start) * 1000)
    return out


def example_checks(runs: list[ExampleRun]) -> list[Check]:
    from ..test.image import FAIL, PASS, SKIP, Check

    checks = []
    for r in runs:
        found = "matches" if r.ok else (r.error or f"{len(r.diffs)} output(s) differ")
        checks.append(Check(f"example {r.name}", "expected outputs", found, PASS if r.ok else FAIL,
                            "; ".join(r.diffs)[:500] if r.diffs else r.where))
    latencies = [ms for r in runs for ms in r.latencies_ms]
    if latencies:
        found = f"p50 {percentile(latencies, 50):.1f} ms, p99 {percentile(latencies, 99):.1f} ms"
        checks.append(Check("latency", f"{len(latencies)} requests", found, PASS,
                            f"mean {statistics.fmean(latencies):.1f} ms, over HTTP on 127.0.0.1"))
    else:
        checks.append(Check("latency", "requests", "none sent", SKIP, "no examples"))
    return checks


def test_project(project: Project, gpu_mode: str, repeats: int = 20) -> tuple[list[Check], dict[str, Any]]:
    """Release checks on the project image, then serve it and run the examples. (checks, report)."""
    from ..core.errors import UserError
    from ..test.image import test_image
    from ..workstation.host import host_has_gpu
    from . import serving
    from .client import Client
    from .examples import load_examples

    checks, probe = test_image(project.image_tag, gpu_mode)
    if project.examples is None:
        raise UserError(f"{project.file} names no examples, so the served model cannot be checked",
                        hint="add `examples: examples.yaml` (`ngcx init` writes a stub)")
    gpu = host_has_gpu()[0] and gpu_mode != "off"
    served = serving.start(project, gpu=gpu)
    try:
        client = Client(served.url)
        meta = client.metadata(served.model)
        examples = load_examples(project.examples, meta["inputs"], meta["outputs"])
        runs = run_examples(client, served.model, examples, repeats)
        client.close()
    finally:
        served.stop()
    checks += example_checks(runs)
    report = {"probe": probe, "url": served.url, "ready_s": round(served.ready_s, 2),
              "examples": [{"name": r.name, "ok": r.ok, "diffs": r.diffs, "error": r.error,
                            "latencies_ms": [round(x, 3) for x in r.latencies_ms]} for r in runs]}
    return checks, report
