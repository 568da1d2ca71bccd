"""BuildKit's --progress=plain output, parsed into steps and shown as a short live view.

Why one module: the catalog build (build/image.py) and the project build (project/build.py) run the
same `docker build` and must show the same thing: one line per Dockerfile step with a readable
title and its time, the running step's last log line, and on a failure the failing step's own log,
every line with credentials in URLs redacted before it reaches the terminal. A push's layer stream
may later reuse the view. rich is imported inside run_build so `ngcx --help` stays fast.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections import deque
from dataclasses import dataclass, field

from .output import redact

STEP_LINE = re.compile(r"^#(?P<id>\d+) (?P<rest>.*)$")
# "[3/8] RUN ...", "[stage-0 3/8] RUN ..."; BuildKit pads the number to the total's width: "[stage-0  4/13] RUN ..."
DOCKERFILE_STEP = re.compile(r"^\[(?:[\w.-]+ )? *(\d+)/(\d+)\] ")


@dataclass
class Step:
    id: str
    name: str = ""
    title: str = ""
    status: str = "running"  # running | done | cached | error
    seconds: float | None = None
    log: deque = field(default_factory=lambda: deque(maxlen=25))


class ProgressParser:
    """Reads BuildKit's --progress=plain lines into steps (name, state, last log lines)."""

    def __init__(self, titles: dict[int, str] | None = None) -> None:
        self.titles = titles or {}
        self.returncode: int | None = None  # docker build's exit status, once it ended
        self.steps: dict[str, Step] = {}
        self.order: list[str] = []
        self.error: str | None = None

    def feed(self, raw: str) -> Step | None:
        line = redact(raw.rstrip("\n"))
        m = STEP_LINE.match(line)
        if not m:
            return None
        sid, rest = m.group("id"), m.group("rest")
        step = self.steps.get(sid)
        if step is None:
            step = self.steps[sid] = Step(sid)
            self.order.append(sid)
        if rest == "CACHED":
            step.status = "cached"
        elif rest.startswith("DONE"):
            step.status = "done"
            with contextlib.suppress(IndexError, ValueError):
                step.seconds = float(rest.split()[1].rstrip("s"))
        elif rest.startswith("ERROR"):
            step.status = "error"
            self.error = rest
        elif not step.name:
            step.name = rest
            m = DOCKERFILE_STEP.match(rest)
            if m:
                step.title = f"[{m.group(1)}/{m.group(2)}] " + self.titles.get(int(m.group(1)), rest[m.end():])
        else:
            text = re.sub(r"^\d+\.\d+ ", "", rest)
            step.log.append(text)
        return step

    def build_steps(self) -> list[Step]:
        """The Dockerfile steps ([n/m] ...), in order (BuildKit's [internal] steps left out)."""
        return [self.steps[s] for s in self.order if DOCKERFILE_STEP.match(self.steps[s].name)]

    def failed(self) -> Step | None:
        return next((self.steps[s] for s in self.order if self.steps[s].status == "error"), None)


def run_build(cmd: list[str], env: dict[str, str], progress: str, titles: dict[int, str]) -> ProgressParser:
    """Run docker build, showing live progress; returns the parsed steps."""
    import sys

    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    parser = ProgressParser(titles)
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
    live_ok = progress == "auto" and console.is_terminal
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", bufsize=1)
    assert proc.stdout is not None

    def view() -> Text:
        steps = parser.build_steps()
        text = Text()
        for s in steps[-12:]:
            mark = {"done": "✓", "cached": "✓ cached", "error": "✗", "running": "…"}[s.status]
            secs = f" {s.seconds:.1f}s" if s.seconds is not None else ""
            text.append(f"{mark:<9}{(s.title or s.name)[:110]}{secs}\n")
            if s.status == "running" and s.log:
                text.append(f"          {s.log[-1][:100]}\n", style="dim")
        return text

    try:
        if live_ok:
            with Live(view(), console=console, refresh_per_second=4, transient=False) as live:
                for line in proc.stdout:
                    parser.feed(line)
                    live.update(view())
        else:
            for line in proc.stdout:
                step = parser.feed(line)
                if step is not None and DOCKERFILE_STEP.match(step.name) and step.status in ("done", "cached"):
                    mark = "✓ cached" if step.status == "cached" else "✓"
                    console.print(f"{mark:<9}{(step.title or step.name)[:110]}"
                                  + (f" {step.seconds:.1f}s" if step.seconds else ""), highlight=False)
                elif progress == "plain" and step is not None:
                    console.print(redact(line.rstrip()), highlight=False, markup=False)
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=30)
        raise
    parser.returncode = proc.returncode
    return parser
