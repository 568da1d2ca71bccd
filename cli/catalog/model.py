"""The catalog: load registry.yaml, validate its schema and compatibility rules, resolve refs.

Separate steps, as cog does (parse -> validate -> complete), one module each:
  parse     yamlio.py: YAML -> plain data, with line numbers, duplicate keys, deep nesting and
            alias bombs caught (PyYAML silently keeps the last duplicate, which would hide a
            second `"24.05":` release);
  schema    schema.py: strict pydantic models (unknown keys rejected, typed versions);
  rules     rules.py: the compatibility rules, which are data in the same file; every violation
            is collected as a typed Problem (cli/problems.py), not just the first;
  complete  complete.py: stacks resolved into each release, min driver / GPU range / labels.
This module holds the entry points (load_catalog, problems_of) and re-exports the names the rest
of ngcx imports. Every load runs all steps, so a broken catalog can never reach render or build.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from ngcx import paths
from ngcx.catalog.complete import Catalog, Pin, Release, complete, parse_pin
from ngcx.catalog.rules import Checker
from ngcx.catalog.schema import (
    PIN,
    RELEASE_TAG,
    CatalogSpec,
    ReleaseSpec,
    Rules,
    _schema_errors,
)
from ngcx.catalog.yamlio import load_yaml
from ngcx.errors import UserError
from ngcx.problems import Problem, ProblemsFound

__all__ = ["PIN", "RELEASE_TAG", "Catalog", "CatalogInvalid", "CatalogSpec", "Checker", "Pin", "Release",
           "ReleaseSpec", "Rules", "complete", "load_catalog", "parse", "parse_pin", "problems_of"]


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
        spec = CatalogSpec.model_validate(data)
    except ValidationError as exc:
        return None, _schema_errors(exc, source)
    checker = Checker(spec)
    checker.catalog_level()
    for image, img in spec.images.items():
        for tag, rel in img.releases.items():
            checker.release(image, tag, rel)
    return spec, checker.problems


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load, validate and complete a catalog (default: the shipped registry.yaml)."""
    file = Path(path) if path else paths.registry_file()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"catalog file {file} does not exist",
                        hint="pass an existing registry.yaml or omit the argument for the shipped one") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"catalog {file} is not UTF-8 text (byte {exc.start})",
                        hint="save it as UTF-8, or check that this is the right file") from None
    except OSError as exc:
        raise UserError(f"cannot read catalog {file}: {exc.strerror or exc.__class__.__name__}") from None
    spec, problems = problems_of(text, str(file))
    if problems:
        raise CatalogInvalid(str(file), problems)
    assert spec is not None
    return complete(spec, str(file))
