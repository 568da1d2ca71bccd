"""Stop, start and destroy from the page: each runs `ngcx deployments VERB ID` as a child process.

Why a child process and not a call into deploy/: the command is the one code path users already run (its
checks, its confirmation-free `--yes`, its one-line errors, its interrupted-deploy bookkeeping), a slow cloud
call never holds the dashboard's event loop or its threads, and a dashboard stopped mid-action leaves the
command to finish on its own, as a terminal's would. The page shows the command's output lines as they come
(events.py sends a change when a job moves) and its exit status at the end.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

VERBS = {"stop": ("stop",), "start": ("start",), "destroy": ("destroy", "--yes")}
KEEP_LINES = 200


class JobRefused(ValueError):
    """A job that cannot start: an unknown verb, or another job already working on the same deployment."""


@dataclass
class Job:
    id: int
    verb: str
    deployment: str
    started: float
    lines: list[str] = field(default_factory=list)
    rc: int | None = None
    finished: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "verb": self.verb, "deployment": self.deployment, "started": self.started,
                "lines": self.lines[-KEEP_LINES:], "rc": self.rc, "finished": self.finished,
                "state": "running" if self.rc is None else ("done" if self.rc == 0 else "failed")}


class Jobs:
    """The jobs this dashboard started; `version` grows on every change, for events.py to notice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[int, Job] = {}
        self.version = 0

    def start(self, verb: str, deployment: str) -> Job:
        if verb not in VERBS:
            raise JobRefused(f"unknown action {verb!r}: use one of {', '.join(VERBS)}")
        if not re.fullmatch(r"s?[0-9]{1,9}", deployment):     # it becomes an argument of the command
            raise JobRefused(f"{deployment[:40]!r} is not a deployment id (a number) or a service (s<number>)")
        with self._lock:
            if any(j.deployment == deployment and j.rc is None for j in self._jobs.values()):
                raise JobRefused(f"deployment {deployment} already has an action running; wait for it to finish")
            job = Job(id=len(self._jobs) + 1, verb=verb, deployment=deployment, started=time.time())
            self._jobs[job.id] = job
            self.version += 1
        argv = [sys.executable, "-m", "ngcx", "deployments", *VERBS[verb][:1], deployment, *VERBS[verb][1:]]
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, bufsize=1)
        threading.Thread(target=self._follow, args=(job, child), name=f"job-{job.id}", daemon=True).start()
        return job

    def of(self, deployment: str) -> list[dict[str, Any]]:
        """The jobs of one deployment, newest first."""
        with self._lock:
            return [j.as_json() for j in sorted(self._jobs.values(), key=lambda j: -j.id)
                    if j.deployment == deployment]

    def get(self, job_id: int) -> dict[str, Any] | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return job.as_json() if job else None

    def _follow(self, job: Job, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            with self._lock:
                job.lines.append(line.rstrip("\n"))
                del job.lines[:-KEEP_LINES]
                self.version += 1
        rc = child.wait()
        with self._lock:
            job.rc, job.finished = rc, time.time()
            self.version += 1
