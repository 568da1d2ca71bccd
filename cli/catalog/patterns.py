"""The catalog's text patterns (release tags, exact pins, compute capabilities, driver versions).

Why a module without pydantic: the completed catalog (complete.py) parses pins with PIN, and a
cached catalog is rebuilt from complete.py alone, so these must import in microseconds; schema.py
and rules.py re-export them for validation.
"""

from __future__ import annotations

import re

# ASCII digits and \Z on purpose: \d also matches '٤' and '$' matches before a final newline, and
# "2٤.05" or "24.05\n" must not become a Docker tag (found by tests/registry/test_fuzz_refs.py).
RELEASE_TAG = re.compile(r"^[0-9]{2}\.(0[1-9]|1[0-2])\Z")
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,-]+\])?)==(?P<version>[0-9][0-9A-Za-z.+-]*)$")
CC = re.compile(r"^[0-9]{1,2}\.[0-9]\Z")
DRIVER = re.compile(r"^[0-9]+(\.[0-9]+){1,2}\Z")
