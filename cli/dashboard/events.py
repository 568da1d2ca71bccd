"""Live pages without reloading: one watcher notices every change, server-sent events tell the pages.

Why server-sent events and not websockets: the traffic is one way (the server tells; actions are plain POSTs
that the CSRF check covers), EventSource reconnects by itself, and it is a plain streaming HTTP response that
the token guard (guard.py) sees like any other request.

What counts as a change: a commit to the state store (any ngcx command: a deploy, a state change, a build, a
push, an `ngcx test` run), a deployment's health turning, or an action's new output line. The watcher reads the
store every WATCH_S through its own read-only connection (a reader never blocks a command's write in WAL mode) and bumps
`version`; each page's stream sends `change` and the page fetches its live parts again. WATCH_S = 0.5 s keeps a
new deployment on screen within 2 s (issue 23) with a query of a few microseconds per tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

WATCH_S = 0.5
RESYNC_S = 10.0             # on_state also runs this often: a key rotated (keys/, not the store) reaches the scrapers
HEARTBEAT_S = 15.0          # a comment line now and then: proxies and browsers keep the stream open
FINGERPRINT = """SELECT (SELECT count(*) || ':' || coalesce(max(updated_at), 0) FROM deployments),
                        (SELECT count(*) || ':' || coalesce(max(updated_at), 0) FROM services),
                        (SELECT count(*) FROM builds), (SELECT count(*) FROM pushes), (SELECT count(*) FROM tests)"""


class Watcher:
    """Bumps `version` on every change; `problem` is one line while the store cannot be read."""

    def __init__(self, db: Path, parts: Callable[[], tuple], on_state: Callable[[], None]) -> None:
        self.db, self.parts, self.on_state = db, parts, on_state
        self.version = 0
        self.problem: str | None = None
        self._last: tuple | None = None
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """Every WATCH_S until cancelled; a tick that fails is a banner line, never the end of live updates."""
        synced = 0.0
        while True:
            try:
                synced = await self._tick(synced)
            except Exception as exc:  # noqa: BLE001 - one bad tick must not stop every page's updates
                self.problem = f"the dashboard's watcher failed a tick ({type(exc).__name__}: {str(exc)[:200]})"
            await asyncio.sleep(WATCH_S)

    async def _tick(self, synced: float) -> float:
        store = await asyncio.to_thread(self._store_fingerprint)
        now = (store, self.problem, self.parts())
        if self._last is None or now[0] != self._last[0] or time.monotonic() - synced > RESYNC_S:
            await asyncio.to_thread(self.on_state)
            synced = time.monotonic()
        if now != self._last:
            self._last = now
            self.version += 1
            self._changed.set()
            self._changed = asyncio.Event()
        return synced

    async def changed(self, seen: int, timeout: float) -> int:
        if self.version == seen:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        return self.version

    def _store_fingerprint(self) -> tuple | None:
        if not self.db.exists():
            self.problem = None
            return None
        try:
            conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=1.0)
            try:
                row = tuple(conn.execute(FINGERPRINT).fetchone())
            finally:
                conn.close()
        except sqlite3.Error as exc:
            self.problem = describe(self.db, exc)
            return None
        self.problem = None
        return row


def describe(db: Path, exc: sqlite3.Error) -> str:
    """One line for the page's banner: which store, what is wrong, what to do."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return f"state database {db} is locked by another ngcx process; the page shows the last state it read"
    if "not a database" in text or "malformed" in text or "no such table" in text:
        return (f"state database {db} cannot be read ({text}); any ngcx command moves a corrupt store aside "
                "and starts a fresh one (`ngcx deployments ls`)")
    return f"state database {db} cannot be read: {text}"


async def stream(watcher: Watcher, extra: Callable[[], AsyncIterator[str]] | None = None) -> AsyncIterator[str]:
    """The `change` events of one page (and the page's own events from `extra`, e.g. chart points)."""
    seen = -1
    yield "retry: 1000\n\n"
    while True:
        version = await watcher.changed(seen, WATCH_S if extra else HEARTBEAT_S)
        if version != seen:
            seen = version
            yield event("change", {"version": version, "problem": watcher.problem})
        elif extra is None:
            yield ": heartbeat\n\n"
        if extra is not None:
            async for line in extra():
                yield line


def event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
