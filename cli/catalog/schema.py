"""The catalog's schema (validate, step 1): registry.yaml's shape as strict, typed dataclasses.

Why its own module: the shape of the file (unknown keys rejected, typed versions and compute
capabilities so completion can never crash on them) is one job; the compatibility rules that
compare values across the file are another (rules.py). Schema errors become typed Problems with
the dotted path of the value, and the fix (`25.10` read as a number is the classic).

Why dataclasses and pydantic-core rather than pydantic BaseModels: building the 13 BaseModel
classes (pydantic's Python schema generation) cost 0.15-0.30 s of every cold `ngcx render`, the
validation itself 1 ms. The same validator runs here: `core_schema()` turns each dataclass's
annotations into the core schema pydantic generated from the models (lax types, extra keys
forbidden, the same error types and locations), in about 2 ms and without importing pydantic.
It knows only the annotations this file uses and raises TypeError on any other, at first use.
pydantic-core fills an instance's __dict__ as it does a model's, so vars() of a spec also shows
its three __pydantic_*__ bookkeeping entries; fields(), ==, repr and dump() see the fields only.
"""

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic_core import SchemaValidator, ValidationError
from pydantic_core import core_schema as cs

from ..core.problems import Problem

# Re-exported: rules.py and model.py import the patterns from here, next to the schema that uses them.
from .patterns import CC as CC
from .patterns import DRIVER as DRIVER
from .patterns import PIN as PIN
from .patterns import RELEASE_TAG as RELEASE_TAG


@dataclass(frozen=True)
class Pattern:
    """A str must match `regex`; `example` is what an error says it should look like."""

    regex: str
    example: str


@dataclass(frozen=True)
class After:
    """A check run on the typed value; a ValueError it raises is the error's message."""

    check: Callable[[Any], Any]


@dataclass(frozen=True)
class Before:
    """A conversion run on the raw YAML value before its type is checked."""

    convert: Callable[[Any], Any]


# Schema types for values that complete() computes with (int(), Version()): a malformed one must
# stop at validation, not crash completion (a '$' spliced into full_driver did: test_fuzz_catalog.py).
DriverVersion = Annotated[str, Pattern(r"^[0-9]+(\.[0-9]+){1,2}$", "a driver version like 570.26")]
ComputeCapability = Annotated[str, Pattern(r"^[0-9]{1,2}\.[0-9]$", "MAJOR.MINOR like 8.6")]


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


def _py_str(value: Any) -> Any:
    """python: 3.10 unquoted is the float 3.1 in YAML; str() keeps what was meant for the rules to catch."""
    return str(value) if isinstance(value, float) else value


VersionRange = Annotated[str, After(_specifier)]
InstallTemplate = Annotated[str, After(_install_template)]
PythonVersion = Annotated[str, Before(_py_str)]


def _alias(name: str) -> Any:
    """A field whose YAML key is a Python keyword or builtin (`schema`)."""
    return field(metadata={"alias": name})


# ----------------------------------------------------------------------------- schema


@dataclass(frozen=True, kw_only=True)
class Base:
    image: str
    offline: str | None = None
    suite: str | None = None
    python: str
    glibc: str | None = None


@dataclass(frozen=True, kw_only=True)
class Stack:
    cuda: str
    pins: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class ReleaseSpec:
    base: str
    python: PythonVersion
    stack: str
    pins: dict[str, str] = field(default_factory=dict)  # per-release overrides of the stack
    framework: str | None = None
    extras: list[str] = field(default_factory=list)
    index_urls: list[str] = field(default_factory=list)
    compute_capabilities: list[str]
    min_driver: str | None = None  # raise the derived floor (never lower it)


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    description: str
    buildable: bool = True
    not_buildable_reason: str | None = None
    releases: dict[str, ReleaseSpec]


@dataclass(frozen=True, kw_only=True)
class CudaMajorRule:
    min_driver: DriverVersion
    min_cc: ComputeCapability
    max_cc: ComputeCapability
    toolkit_suffix: str
    library_suffix: str


@dataclass(frozen=True, kw_only=True)
class CudaMinorRule:
    full_driver: DriverVersion
    max_cc: ComputeCapability


@dataclass(frozen=True, kw_only=True)
class ComponentRule:
    stem: str
    kind: str  # toolkit | library
    label: str


@dataclass(frozen=True, kw_only=True)
class RangeRule:
    versions: VersionRange
    cuda_majors: list[str]
    min_cc: ComputeCapability | None = None


@dataclass(frozen=True, kw_only=True)
class FrameworkRule:
    cuda: str | None = None
    cuda_majors: list[str] | None = None
    cudnn_majors: list[str] | None = None
    python: VersionRange
    install: InstallTemplate | None = None
    requires: dict[str, str] = field(default_factory=dict)
    max_cc: ComputeCapability | None = None


@dataclass(frozen=True, kw_only=True)
class Rules:
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


@dataclass(frozen=True, kw_only=True)
class CatalogSpec:
    schema_: int = _alias("schema")
    bases: dict[str, Base]
    stacks: dict[str, Stack]
    images: dict[str, ImageSpec]
    rules: Rules


# ----------------------------------------------------------------------------- annotations -> core schema


def core_schema(tp: Any) -> cs.CoreSchema:
    """The pydantic-core schema of one annotation (the subset above; TypeError for anything else)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        schema = core_schema(args[0])
        for mark in args[1:]:
            if isinstance(mark, Pattern):
                schema = cs.str_schema(pattern=mark.regex)
            elif isinstance(mark, After):
                schema = cs.no_info_after_validator_function(mark.check, schema)
            elif isinstance(mark, Before):
                schema = cs.no_info_before_validator_function(mark.convert, schema)
            else:
                raise TypeError(f"unknown schema mark {mark!r}")
        return schema
    if origin in (UnionType, Union) and len(args) == 2 and type(None) in args:
        return cs.nullable_schema(core_schema(next(a for a in args if a is not type(None))))
    if origin is list:
        return cs.list_schema(core_schema(args[0]))
    if origin is dict:
        return cs.dict_schema(core_schema(args[0]), core_schema(args[1]))
    simple = {str: cs.str_schema, bool: cs.bool_schema, int: cs.int_schema}
    if tp in simple:
        return simple[tp]()
    if isinstance(tp, type) and is_dataclass(tp):
        return _model_schema(tp)
    raise TypeError(f"no schema for {tp!r}")


def _model_schema(cls: type) -> cs.CoreSchema:
    """A dataclass as pydantic validates a model: its fields, their defaults, unknown keys forbidden."""
    out: dict[str, cs.ModelField] = {}
    for f in fields(cls):
        schema = core_schema(f.type)
        if f.default is not MISSING:
            schema = cs.with_default_schema(schema, default=f.default)
        elif f.default_factory is not MISSING:
            schema = cs.with_default_schema(schema, default_factory=f.default_factory)
        out[f.name] = cs.model_field(schema, validation_alias=f.metadata.get("alias"))
    return cs.model_schema(cls, cs.model_fields_schema(out, model_name=cls.__name__, extra_behavior="forbid"))


_validator: SchemaValidator | None = None


def validate(data: Any) -> CatalogSpec:
    """registry.yaml's data -> CatalogSpec; pydantic_core.ValidationError lists every schema error."""
    global _validator
    if _validator is None:
        _validator = SchemaValidator(core_schema(CatalogSpec))
    return _validator.validate_python(data)


def dump(spec: Any) -> Any:
    """A validated spec as JSON data under its YAML keys (what validate() reads back: the cache stores it)."""
    if is_dataclass(spec):
        return {f.metadata.get("alias", f.name): dump(getattr(spec, f.name)) for f in fields(spec)}
    if isinstance(spec, dict):
        return {k: dump(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [dump(v) for v in spec]
    return spec


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
            what = next((t.__metadata__[0].example for t in (DriverVersion, ComputeCapability)
                         if t.__metadata__[0].regex == err["ctx"]["pattern"]), f"matching {err['ctx']['pattern']}")
            out.append(Problem(source, field, "schema.pattern", f"{err['input']!r} is not {what}"))
        elif kind == "value_error":  # our validators' messages, without pydantic's prefix
            out.append(Problem(source, loc, "schema.value", err["msg"].removeprefix("Value error, ")))
        else:
            out.append(Problem(source, loc, f"schema.{kind}", err["msg"]))
    return out
