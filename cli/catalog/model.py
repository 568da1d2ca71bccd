"""The catalog: load registry.yaml, validate its schema and compatibility rules, resolve refs.

Separate steps, as cog does (parse -> validate -> complete), one module each:
  parse     core/yamlio.py: YAML -> plain data, with line numbers, duplicate keys, deep nesting and
            alias bombs caught (PyYAML silently keeps the last duplicate, which would hide a
            second `"24.05":` release);
  schema    schema.py: strict typed dataclasses, validated by pydantic-core (unknown keys rejected);
  rules     rules.py: the compatibility rules, which are data in the same file; every violation
            is collected as a typed Problem (core/problems.py), not just the first;
  complete  complete.py: stacks resolved into each release, min driver / GPU range / labels.
This module holds the entry points (load_catalog, validated_catalog, problems_of) and re-exports the
names the rest of ngcx imports. Every load of bytes not seen before runs all steps, so a broken
catalog can never reach render or build; bytes that passed them under the same code come from
cache.py (keyed by the file's sha256 and this code's), which is what load_catalog goes through.
"""

from __future__ import annotations

from pydantic_core import ValidationError

from ..core.errors import UserError
from ..core.problems import Problem, ProblemsFound
from ..core.yamlio import load_yaml
from .complete import Catalog, Pin, Release, complete, parse_pin
from .rules import Checker
from .schema import PIN, RELEASE_TAG, CatalogSpec, ReleaseSpec, Rules, _schema_errors, validate

__all__ = ["PIN", "RELEASE_TAG", "Catalog", "CatalogInvalid", "CatalogSpec", "Checker", "Pin", "Release",
           "ReleaseSpec", "Rules", "complete", "parse", "parse_pin", "problems_of", "validated_catalog"]


# ----------------------------------------------------------------------------- parse


def parse(text: str, source: str) -> dict:
    """YAML text -> dict; malformed YAML, duplicate keys, deep nesting, alias bombs -> UserError with file:line."""
    data = load_yaml(text, source)
    if not isinstance(data, dict):
        raise UserError(f"{source}: the catalog must be a mapping with 'images' and 'rules'")
    return data


# ----------------------------------------------------------------------------- entry points


class CatalogInvalid(ProblemsFound):
    """The catalog broke one or more rules; `problems` holds every violation."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        super().__init__(f"catalog {source}", problems, f"ngcx catalog check {source}")


def problems_of(text: str, source: str) -> tuple[CatalogSpec | None, list[Problem]]:
    """Parse + validate; returns the spec (if the schema held) and every violation found."""
    data = parse(text, source)
    try:
        spec = validate(data)
    except ValidationError as exc:
        return None, _schema_errors(exc, source)
    checker = Checker(spec)
    checker.catalog_level()
    for image, img in spec.images.items():
        for tag, rel in img.releases.items():
            checker.release(image, tag, rel)
    return spec, checker.problems


def validated_catalog(text: str, source: str) -> Catalog:
    """Parse, validate and complete catalog text, with no cache: CatalogInvalid lists every violation."""
    spec, problems = problems_of(text, source)
    if problems:
        raise CatalogInvalid(source, problems)
    assert spec is not None
    return complete(spec, source)
