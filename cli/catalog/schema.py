"""The catalog's schema (validate, step 1): registry.yaml's shape as strict pydantic models.

Why its own module: the shape of the file (unknown keys rejected, typed versions and compute
capabilities so completion can never crash on them) is one job; the compatibility rules that
compare values across the file are another (rules.py). Schema errors become typed Problems with
the dotted path of the value, and the fix (`25.10` read as a number is the classic).
"""

from __future__ import annotations

from typing import Annotated, Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from ..core.problems import Problem

# Re-exported: rules.py and model.py import the patterns from here, next to the schema that uses them.
from .patterns import CC as CC
from .patterns import DRIVER as DRIVER
from .patterns import PIN as PIN
from .patterns import RELEASE_TAG as RELEASE_TAG

# Schema types for values that complete() computes with (int(), Version()): a malformed one must
# stop at validation, not crash completion (a '$' spliced into full_driver did: test_fuzz_catalog.py).
DriverVersion = Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+){1,2}$")]
ComputeCapability = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,2}\.[0-9]$")]
PATTERN_EXAMPLES = {DriverVersion: "a driver version like 570.26", ComputeCapability: "MAJOR.MINOR like 8.6"}


def _specifier(text: str) -> str:
    """A PEP 440 specifier set, checked at load: the rules evaluate it (found by test_fuzz_catalog: '>\\t=3.8')."""
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        raise ValueError(f"{text!r} is not a version range like >=3.9,<3.14") from None
    return text


def _install_template(text: str) -> str:
    """complete() fills it with str.format(version=...): any other {field} would be a KeyError there."""
    try:
        text.format(version="0")
    except (KeyError, IndexError, ValueError, AttributeError):
        raise ValueError(f"{text!r} may use only {{version}} as a placeholder") from None
    return text


VersionRange = Annotated[str, AfterValidator(_specifier)]
InstallTemplate = Annotated[str, AfterValidator(_install_template)]


# ----------------------------------------------------------------------------- schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Base(_Strict):
    image: str
    offline: str | None = None
    suite: str | None = None
    python: str
    glibc: str | None = None


class Stack(_Strict):
    cuda: str
    pins: dict[str, str]


class ReleaseSpec(_Strict):
    base: str
    python: str
    stack: str
    pins: dict[str, str] = Field(default_factory=dict)  # per-release overrides of the stack
    framework: str | None = None
    extras: list[str] = Field(default_factory=list)
    index_urls: list[str] = Field(default_factory=list)
    compute_capabilities: list[str]
    min_driver: str | None = None  # raise the derived floor (never lower it)

    @field_validator("python", mode="before")
    @classmethod
    def _py_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, float) else v


class ImageSpec(_Strict):
    description: str
    buildable: bool = True
    not_buildable_reason: str | None = None
    releases: dict[str, ReleaseSpec]


class CudaMajorRule(_Strict):
    min_driver: DriverVersion
    min_cc: ComputeCapability
    max_cc: ComputeCapability
    toolkit_suffix: str
    library_suffix: str


class CudaMinorRule(_Strict):
    full_driver: DriverVersion
    max_cc: ComputeCapability


class ComponentRule(_Strict):
    stem: str
    kind: str  # toolkit | library
    label: str


class RangeRule(_Strict):
    versions: VersionRange
    cuda_majors: list[str]
    min_cc: ComputeCapability | None = None


class FrameworkRule(_Strict):
    cuda: str | None = None
    cuda_majors: list[str] | None = None
    cudnn_majors: list[str] | None = None
    python: VersionRange
    install: InstallTemplate | None = None
    requires: dict[str, str] = Field(default_factory=dict)
    max_cc: ComputeCapability | None = None


class Rules(_Strict):
    cuda_majors: dict[str, CudaMajorRule]
    cuda_minors: dict[str, CudaMinorRule]
    arch_min_driver: dict[ComputeCapability, DriverVersion]
    driver_branches: list[int]
    require_cuda_brands: list[str]
    components: dict[str, ComponentRule]
    cudnn: list[RangeRule]
    nccl: list[RangeRule]
    tensorrt: list[RangeRule]
    frameworks: dict[str, dict[str, FrameworkRule]]


class CatalogSpec(_Strict):
    schema_: int = Field(alias="schema")
    bases: dict[str, Base]
    stacks: dict[str, Stack]
    images: dict[str, ImageSpec]
    rules: Rules


def _schema_errors(exc: ValidationError, source: str) -> list[Problem]:
    """pydantic errors -> one Problem each: where (the file), field (dotted path), what, how to fix."""
    out: list[Problem] = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        field, kind = loc.removesuffix(".[key]"), err["type"]
        if kind == "extra_forbidden":
            out.append(Problem(source, loc, "schema.unknown-key", "unknown key", "remove it or check its spelling"))
        elif kind == "missing":
            out.append(Problem(source, loc, "schema.missing", "required key is missing"))
        elif kind == "string_type" and isinstance(err["input"], int | float):
            # YAML reads an unquoted 25.10 as the number 25.1: say so instead of "valid string".
            what = "release tag" if err["loc"][-1] == "[key]" else "value"
            out.append(Problem(source, field, "schema.number-not-string",
                               f"{what} {err['input']!r} is a number, not a string; quote it "
                               "(e.g. \"25.10\", \"3.10\") - YAML reads 25.10 as 25.1"))
        elif kind == "string_pattern_mismatch":
            what = next((v for t, v in PATTERN_EXAMPLES.items() if t.__metadata__[0].pattern == err["ctx"]["pattern"]),
                        f"matching {err['ctx']['pattern']}")
            out.append(Problem(source, field, "schema.pattern", f"{err['input']!r} is not {what}"))
        elif kind == "value_error":  # our validators' messages, without pydantic's prefix
            out.append(Problem(source, loc, "schema.value", err["msg"].removeprefix("Value error, ")))
        else:
            out.append(Problem(source, loc, f"schema.{kind}", err["msg"]))
    return out
