"""`ngcx test`: an image's pins (or a project's examples) checked against what actually loads.

test/image.py runs the probes in the image, project/check.py the examples; this module prints the table
and records the run in the state store (the dashboard's image page shows it).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.errors import CheckFailed, UserError
from ..test.image import FAIL, PASS, SKIP, Check, test_image
from .options import CatalogOpt, Gpu, GpuOpt, JsonOpt, ProjectFileOpt, VariantOpt


def print_table(tag: str, checks: list[Check]) -> None:
    from ..core import output

    output.table(f"ngcx test {tag}", ["check", "expected", "found", "", "note"],
                 [[c.name, c.expected, c.found, c.status, c.note] for c in checks])


def register(app: typer.Typer) -> None:
    @app.command("test")
    def test_cmd(
        ref: Annotated[str | None, typer.Argument(
            help="IMAGE_REF (local tag) or IMAGE[:RELEASE]; omit it in a project folder (ngcx.yaml).")] = None,
        project_file: ProjectFileOpt = None,
        repeats: Annotated[int, typer.Option("--repeats", min=0, help="Project mode: extra requests per "
                                             "example for the latency figures.")] = 20,
        variant: VariantOpt = "runtime",
        gpu: GpuOpt = Gpu.auto,
        json_out: JsonOpt = False,
        catalog_file: CatalogOpt = None,
    ) -> None:
        """Verify a built image: pins vs loaded libraries, framework views, the image's own tests."""
        from ..core import output
        from ..workstation.host import resolve_image

        started = time.monotonic()
        if ref is None:
            tag, checks, report = _project_checks(project_file, gpu, repeats)
        else:
            tag = resolve_image(ref, variant, catalog_file)
            checks, report = test_image(tag, gpu)
        failed = [c for c in checks if c.status == FAIL]
        if json_out:
            doc = {"image": tag, "ok": not failed, "checks": [asdict(c) for c in checks]}
            output.emit_json({**doc, **(report if "probe" in report else {"probe": report})})
        else:
            print_table(tag, checks)
            for ex in report.get("examples", []):          # project mode: the whole diff, not the table's cut
                for line in ex["diffs"] or ([ex["error"]] if ex["error"] else []):
                    print(f"example {ex['name']}: {line}")
            passed = sum(c.status == PASS for c in checks)
            skipped = sum(c.status == SKIP for c in checks)
            print(f"{passed} passed, {len(failed)} failed, {skipped} skipped")
        record_run(tag, checks, time.monotonic() - started)
        if failed:
            raise CheckFailed()


STATUS_WORDS = {PASS: "passed", FAIL: "failed", SKIP: "skipped"}


def record_run(tag: str, checks: list[Check], seconds: float) -> None:
    """Keep this run's checks in the state store for `ngcx dashboard`'s image page, keyed by the image id.

    Only what the table shows is kept (each check's name, status, expected, found, note, with any
    user:password@ in a URL hidden), never the probe report. A store or engine that cannot take the record
    is one warning line on stderr: the test's own result and exit code stand either way.
    """
    from docker.errors import DockerException

    from ..core.engine import engine_client
    from ..core.output import redact
    from ..state import db as state

    results = [{"name": redact(c.name), "status": STATUS_WORDS.get(c.status, "failed"),
                "expected": redact(c.expected), "found": redact(c.found), "note": redact(c.note)} for c in checks]
    try:
        image_id = engine_client(timeout=60).images.get(tag).id
        state.record_test(tag=tag, image_id=image_id, results=results, duration_s=round(seconds, 3))
    except (UserError, DockerException) as exc:  # the store's faults are UserErrors; the image may be gone
        reason = exc.line() if isinstance(exc, UserError) else str(exc).splitlines()[0][:160]
        print(f"ngcx: warning: the test results of {tag} were not recorded: {reason}", file=sys.stderr)


def _project_checks(project_file: Path | None, gpu: str, repeats: int) -> tuple[str, list[Check], dict[str, Any]]:
    """The project in project_file (or ./ngcx.yaml): release checks + served examples."""
    from ..project import find_project_file
    from ..project.check import test_project
    from ..project.spec import load_project

    file = find_project_file(project_file) if project_file else find_project_file()
    if file is None:
        raise UserError(f"no IMAGE given and no ngcx.yaml in {project_file or Path.cwd()}",
                        hint="give an image (`ngcx test cuda:24.05`) or run it in a project folder")
    project = load_project(file)
    checks, report = test_project(project, gpu, repeats)
    return project.image_tag, checks, report
