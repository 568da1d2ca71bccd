"""A failing e2e test's report says what the emulated clouds' machines raised.

The clouds only answer "deleted while booting" (ECS SystemFailure.Delete, EC2 terminated); why a machine could
not be made lives in the emulator (`host_errors`), in the pytest process, which CI's output never showed (stop 41's
CI: two failures, no cause). The hook in tests/e2e/clouds.py adds those errors to a failed test's report, which
pytest prints with the failure; a passing test's report stays as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from _pytest.reports import TestReport
from e2e import clouds


def report_through_hook(outcome: str) -> TestReport:
    """The report pytest would print, after the hook wrapped it (the hook runs around pytest's own maker)."""
    made = TestReport("tests/e2e/x.py::t", ("x.py", 1, "t"), {}, outcome, "boom" if outcome == "failed" else None,
                      "call")
    wrapper = clouds.pytest_runtest_makereport(None, None)
    next(wrapper)
    with pytest.raises(StopIteration) as done:
        wrapper.send(made)
    return done.value.value


@pytest.fixture
def lost_machines() -> Iterator[list[tuple[str, str]]]:
    errors = [(f"i-{n:03d}", f"RuntimeError: no space left on device ({n})") for n in range(10)]
    clouds._EMULATORS["paper"] = SimpleNamespace(host_errors=errors)
    yield errors
    del clouds._EMULATORS["paper"]


def test_a_failed_tests_report_carries_the_last_machine_errors_of_each_cloud(lost_machines):
    report = report_through_hook("failed")
    [(title, body)] = [s for s in report.sections if s[0].startswith("paper ")]  # the session clouds may add theirs
    assert title == "paper emulator: machine errors (10, last 8)"
    assert body.splitlines() == [f"{i}: {what}" for i, what in lost_machines[-8:]]


def test_a_passed_tests_report_is_left_alone(lost_machines):
    assert report_through_hook("passed").sections == []
