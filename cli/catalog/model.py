"""The catalog: load registry.yaml, validate its schema and compatibility rules, resolve refs.

Three separate steps, as cog does (parse -> validate -> complete):
  parse     YAML -> plain data, with line numbers and duplicate keys caught (PyYAML silently
            keeps the last duplicate, which would hide a second `"24.05":` release);
  validate  schema (pydantic, unknown keys rejected) and then the compatibility rules, which are
            data in the same file; every violation is collected, not just the first;
  complete  stacks resolved into each release, min driver / GPU range / labels derived.
Every load runs all three, so a broken catalog can never reach render or build.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from ngcx import paths
from ngcx.catalog.yamlio import load_yaml
from ngcx.errors import UserError

# ASCII digits and \Z on purpose: \d also matches '٤' and '$' matches before a final newline, and
# "2٤.05" or "24.05\n" must not become a Docker tag (found by tests/unit/test_fuzz_refs.py).
RELEASE_TAG = re.compile(r"^[0-9]{2}\.(0[1-9]|1[0-2])\Z")
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,-]+\])?)==(?P<version>[0-9][0-9A-Za-z.+-]*)$")
CC = re.compile(r"^[0-9]{1,2}\.[0-9]\Z")
DRIVER = re.compile(r"^[0-9]+(\.[0-9]+){1,2}\Z")
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


# ----------------------------------------------------------------------------- parse


def parse(text: str, source: str) -> dict:
    """YAML text -> dict; malformed YAML, duplicate keys, deep nesting, alias bombs -> UserError with file:line."""
    data = load_yaml(text, source)
    if not isinstance(data, dict):
        raise UserError(f"{source}: the catalog must be a mapping with 'images' and 'rules'")
    return data


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


def one_line(text: str) -> str:
    """Escape newlines, tabs and other control characters, so a key like "24.05\\n" stays on its line."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _schema_errors(exc: ValidationError, source: str) -> list[str]:
    """pydantic errors -> one readable line each: where (dotted path), what, how to fix."""
    lines: list[str] = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            lines.append(f"{source}: {loc}: unknown key (remove it or check its spelling)")
        elif err["type"] == "missing":
            lines.append(f"{source}: {loc}: required key is missing")
        elif err["type"] == "string_type" and isinstance(err["input"], int | float):
            # YAML reads an unquoted 25.10 as the number 25.1: say so instead of "valid string".
            what = "release tag" if err["loc"][-1] == "[key]" else "value"
            lines.append(f"{source}: {loc.removesuffix('.[key]')}: {what} {err['input']!r} is a number, "
                         f"not a string; quote it (e.g. \"25.10\", \"3.10\") - YAML reads 25.10 as 25.1")
        elif err["type"] == "string_pattern_mismatch":
            what = next((v for t, v in PATTERN_EXAMPLES.items() if t.__metadata__[0].pattern == err["ctx"]["pattern"]),
                        f"matching {err['ctx']['pattern']}")
            lines.append(f"{source}: {loc.removesuffix('.[key]')}: {err['input']!r} is not {what}")
        elif err["type"] == "value_error":  # our validators' messages, without pydantic's prefix
            lines.append(f"{source}: {loc}: {err['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"{source}: {loc}: {err['msg']}")
    return [one_line(line) for line in lines]


# ----------------------------------------------------------------------------- completed model


def _v(text: str) -> Version:
    return Version(text)


def _cc_key(cc: str) -> tuple[int, int]:
    major, minor = cc.split(".")
    return int(major), int(minor)


@dataclass(frozen=True)
class Pin:
    """One pinned wheel: component (cudnn...), wheel name, exact version."""

    component: str
    wheel: str
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.wheel}=={self.version}"


def parse_pin(text: str) -> tuple[str, str] | None:
    m = PIN.match(text.strip())
    return (m.group("name"), m.group("version")) if m else None


@dataclass(frozen=True)
class Release:
    """A completed release: everything render, build, test and run need, derived once."""

    image: str
    tag: str
    spec: ReleaseSpec
    base: Base
    cuda: str
    pins: tuple[Pin, ...]
    framework: Pin | None
    extras: tuple[str, ...]
    install: tuple[str, ...]          # pip requirement lines for the framework layer
    min_driver: str
    full_driver: str
    compute_capabilities: tuple[str, ...]
    arch_min_driver: dict[str, str] = field(default_factory=dict)
    require_cuda: str = ""

    @property
    def ref(self) -> str:
        return f"{self.image}:{self.tag}"

    @property
    def cuda_major(self) -> str:
        return self.cuda.split(".")[0]

    def pin(self, component: str) -> Pin | None:
        return next((p for p in self.pins if p.component == component), None)

    def min_driver_for(self, cc: str | None) -> str:
        """Driver floor for one GPU: the release floor, raised for archs that need more."""
        floor = self.min_driver
        extra = self.arch_min_driver.get(cc or "")
        return extra if extra and _v(extra) > _v(floor) else floor

    def labels(self) -> dict[str, str]:
        """ai.ngcx.* labels: one per pin, plus CUDA, driver floor and GPUs."""
        from ngcx import naming

        out = {
            naming.LABEL_IMAGE: self.image,
            naming.LABEL_RELEASE: self.tag,
            naming.LABEL_CUDA: self.cuda,
            naming.LABEL_MIN_DRIVER: self.min_driver,
            naming.LABEL_COMPUTE_CAPABILITIES: ",".join(self.compute_capabilities),
            naming.pin_label("python"): self.spec.python,
        }
        for p in self.pins:
            out[naming.pin_label(p.component)] = p.version
        if self.framework:
            out[naming.pin_label(_framework_label(self.framework.wheel))] = self.framework.version
        for extra in self.extras:
            parsed = parse_pin(extra)
            if parsed:
                out[naming.pin_label(_framework_label(parsed[0]))] = parsed[1]
        return out


def _framework_label(wheel: str) -> str:
    """Label key for a framework wheel: torch, tensorflow, onnxruntime, tensorrt, ..."""
    name = wheel.split("[")[0].lower()
    for prefix in ("onnxruntime", "tensorrt"):
        if name.startswith(prefix):
            return prefix
    return name


@dataclass
class Catalog:
    """A validated, completed catalog."""

    spec: CatalogSpec
    source: str
    releases: dict[str, dict[str, Release]]

    @property
    def rules(self) -> Rules:
        return self.spec.rules

    def image_names(self) -> list[str]:
        return list(self.spec.images)

    def image(self, name: str) -> ImageSpec:
        return self.spec.images[name]

    def newest(self, image: str) -> Release:
        tags = sorted(self.releases[image], key=lambda t: tuple(int(x) for x in t.split(".")))
        return self.releases[image][tags[-1]]

    def resolve(self, ref: str) -> Release:
        """`pytorch:25.08` or `pytorch` (newest) -> Release; unknown -> UserError with suggestions."""
        name, _, tag = ref.partition(":")
        if name not in self.releases:
            close = difflib.get_close_matches(name, self.image_names(), n=3, cutoff=0.4)
            hint = f"did you mean {', '.join(close)}?" if close else "see `ngcx catalog ls`"
            raise UserError(f"unknown image {name!r} in {self.source}", hint=hint)
        if not tag:
            return self.newest(name)
        if tag not in self.releases[name]:
            known = sorted(self.releases[name])
            close = difflib.get_close_matches(tag, known, n=3, cutoff=0.3)
            hint = (f"closest: {', '.join(f'{name}:{t}' for t in close)}; " if close else "") + \
                f"releases of {name}: {', '.join(known)}"
            raise UserError(f"unknown release {tag!r} of image {name!r}", hint=hint)
        return self.releases[name][tag]

    def all_releases(self) -> list[Release]:
        return [r for rels in self.releases.values() for r in rels.values()]


# ----------------------------------------------------------------------------- rules


@dataclass
class Checker:
    """Applies the rules to one release spec; collects violations as readable lines."""

    spec: CatalogSpec
    problems: list[str] = field(default_factory=list)

    @property
    def rules(self) -> Rules:
        return self.spec.rules

    def fail(self, where: str, text: str) -> None:
        self.problems.append(one_line(f"{where}: {text}"))

    # -- helpers
    def wheel_major(self, component: str, wheel: str) -> str | None:
        """Which CUDA major a component's wheel name belongs to (by its suffix), or None."""
        comp = self.rules.components[component]
        for major, rule in self.rules.cuda_majors.items():
            suffix = rule.toolkit_suffix if comp.kind == "toolkit" else rule.library_suffix
            if wheel == comp.stem + suffix:
                return major
        return None

    def range_rule(self, ranges: list[RangeRule], version: str) -> RangeRule | None:
        try:
            v = _v(version)
        except InvalidVersion:
            return None
        return next((r for r in ranges if v in SpecifierSet(r.versions)), None)

    # -- the checks
    def release(self, image: str, tag: str, rel: ReleaseSpec) -> None:
        where = f"{image}:{tag}"
        if not RELEASE_TAG.match(tag):
            self.fail(where, f"release tag {tag!r} is not YY.MM (e.g. 25.08)")
        base = self.spec.bases.get(rel.base)
        if base is None:
            self.fail(where, f"base {rel.base!r} is not defined under 'bases' "
                             f"(known: {', '.join(self.spec.bases)})")
        elif base.python != rel.python:
            self.fail(where, f"python {rel.python} but base {rel.base} ships python {base.python}; "
                             f"pin python {base.python} or pick a base that ships {rel.python}")
        stack = self.spec.stacks.get(rel.stack)
        if stack is None:
            self.fail(where, f"stack {rel.stack!r} is not defined under 'stacks' "
                             f"(known: {', '.join(self.spec.stacks)})")
            return
        cuda = stack.cuda
        major = cuda.split(".")[0]
        major_rule = self.rules.cuda_majors.get(major)
        if major_rule is None:
            self.fail(where, f"CUDA {cuda}: no rules for CUDA major {major} under rules.cuda_majors")
            return
        if cuda not in self.rules.cuda_minors:
            self.fail(where, f"CUDA {cuda}: unknown CUDA release (no entry under rules.cuda_minors)")
        pins = {**stack.pins, **rel.pins}
        for component in ("cudart", "cublas", "cudnn", "nccl"):
            if component not in pins and component in ("cudart", "cublas"):
                self.fail(where, f"pins.{component}: required pin is missing")
        for component, text in pins.items():
            self.pin(where, component, text, cuda, major, rel)
        self.gpus(where, rel, cuda, major_rule)
        self.driver(where, rel, major_rule)
        if rel.framework:
            self.framework(where, rel, cuda, pins)
        for extra in rel.extras:
            if parse_pin(extra) is None:
                self.fail(where, f"extras: {extra!r} is not an exact pin NAME==VERSION")

    def pin(self, where: str, component: str, text: str, cuda: str, major: str, rel: ReleaseSpec) -> None:
        comp = self.rules.components.get(component)
        if comp is None:
            self.fail(where, f"pins.{component}: unknown component (known: {', '.join(self.rules.components)})")
            return
        parsed = parse_pin(text)
        if parsed is None:
            self.fail(where, f"pins.{component}: {text!r} is not an exact pin NAME==VERSION")
            return
        wheel, version = parsed
        wheel_major = self.wheel_major(component, wheel)
        if wheel_major is None:
            self.fail(where, f"{comp.label} wheel {wheel!r} is not a known {comp.stem}* wheel name")
        elif wheel_major != major:
            self.fail(where, f"{comp.label} {wheel} is a CUDA-{wheel_major} wheel but the release pins CUDA {cuda}")
        try:
            v = _v(version)
        except InvalidVersion:
            self.fail(where, f"{comp.label} version {version!r} is not a version number")
            return
        if component in ("cudart", "cublas") and str(v.major) != major:
            self.fail(where, f"{comp.label} {version} belongs to CUDA {v.major}, not CUDA {cuda}")
        if component == "cudart" and f"{v.major}.{v.minor}" != cuda:
            self.fail(where, f"CUDA runtime {version} is CUDA {v.major}.{v.minor} but the release pins CUDA {cuda}")
        table = {"cudnn": self.rules.cudnn, "nccl": self.rules.nccl}.get(component)
        if table is not None:
            rng = self.range_rule(table, version)
            if rng is None:
                self.fail(where, f"{comp.label} {version} is not covered by rules.{component}")
            else:
                if major not in rng.cuda_majors:
                    self.fail(where, f"{comp.label} {version} has no CUDA-{major} build "
                                     f"(builds for CUDA {', '.join(rng.cuda_majors)})")
                if rng.min_cc:
                    low = [cc for cc in rel.compute_capabilities if CC.match(cc) and _cc_key(cc) < _cc_key(rng.min_cc)]
                    if low:
                        self.fail(where, f"{comp.label} {version} needs compute capability >= {rng.min_cc} "
                                         f"but the release lists {', '.join(low)}")

    def gpus(self, where: str, rel: ReleaseSpec, cuda: str, major_rule: CudaMajorRule) -> None:
        if not rel.compute_capabilities:
            self.fail(where, "compute_capabilities: list at least one GPU architecture")
        minor_rule = self.rules.cuda_minors.get(cuda)
        top = minor_rule.max_cc if minor_rule else major_rule.max_cc
        for cc in rel.compute_capabilities:
            if not CC.match(cc):
                self.fail(where, f"compute capability {cc!r} is not MAJOR.MINOR (e.g. 8.6)")
                continue
            if _cc_key(cc) < _cc_key(major_rule.min_cc):
                self.fail(where, f"compute capability {cc} is below CUDA {cuda.split('.')[0]}'s "
                                 f"lowest ({major_rule.min_cc})")
            elif _cc_key(cc) > _cc_key(top):
                self.fail(where, f"compute capability {cc} is newer than CUDA {cuda} supports (up to {top})")

    def driver(self, where: str, rel: ReleaseSpec, major_rule: CudaMajorRule) -> None:
        if rel.min_driver is None:
            return
        try:
            if not DRIVER.match(rel.min_driver):  # Version() also takes '1!2', 'v570', '570\n'
                raise InvalidVersion(rel.min_driver)
            too_low = _v(rel.min_driver) < _v(major_rule.min_driver)
        except InvalidVersion:
            self.fail(where, f"min_driver {rel.min_driver!r} is not a driver version like 570.26")
            return
        if too_low:
            self.fail(where, f"min_driver {rel.min_driver} is below the CUDA floor {major_rule.min_driver}; "
                             f"remove it or raise it")

    def framework(self, where: str, rel: ReleaseSpec, cuda: str, pins: dict[str, str]) -> None:
        parsed = parse_pin(rel.framework or "")
        if parsed is None:
            self.fail(where, f"framework {rel.framework!r} is not an exact pin NAME==VERSION")
            return
        name, version = parsed
        major = cuda.split(".")[0]
        if name.startswith("tensorrt") and not name.endswith(f"-cu{major}"):
            # Checked first: a bare `tensorrt` has no rules entry, and the wheel name is the fix.
            self.fail(where, f"TensorRT wheel {name} does not match CUDA {major} (use tensorrt-cu{major}; "
                             f"the bare 'tensorrt' package changes CUDA major between releases)")
            return
        versions = self.rules.frameworks.get(name)
        rule = versions.get(version) if versions else None
        if rule is None:
            known = (f"known versions: {', '.join(versions)}" if versions
                     else f"known frameworks: {', '.join(self.rules.frameworks)}")
            self.fail(where, f"framework {name} {version} is not in rules.frameworks.{name} "
                             f"({known}); add its CUDA and Requires-Dist pins there")
            return
        if rule.cuda and rule.cuda != cuda:
            rule_major = rule.cuda.split(".")[0]
            if rule_major != major:
                self.fail(where, f"{name} {version} has no CUDA {major} build "
                                 f"(its wheel is built for CUDA {rule.cuda})")
            else:
                self.fail(where, f"{name} {version} is built for CUDA {rule.cuda} but the release pins CUDA {cuda}")
        if rule.cuda_majors and major not in rule.cuda_majors:
            self.fail(where, f"{name} {version} has no CUDA {major} build (CUDA {', '.join(rule.cuda_majors)} only)")
        if rule.cudnn_majors and "cudnn" in pins:
            cudnn = parse_pin(pins["cudnn"])
            if cudnn and cudnn[1].split(".")[0] not in rule.cudnn_majors:
                self.fail(where, f"{name} {version} needs cuDNN {'/'.join(rule.cudnn_majors)}.x, "
                                 f"the release pins {cudnn[1]}")
        if rel.python and not SpecifierSet(rule.python).contains(rel.python + ".0"):
            self.fail(where, f"{name} {version} supports python {rule.python}, the release pins {rel.python}")
        for component, want in rule.requires.items():
            have = parse_pin(pins.get(component, ""))
            if have is None:
                self.fail(where, f"{name} {version} requires {component}=={want} "
                                 f"but the release does not pin {component}")
            elif have[1] != want:
                label = self.rules.components[component].label
                self.fail(where, f"{label} pin {have[1]} differs from {name} {version}'s own "
                                 f"Requires-Dist =={want}; pip would replace it")
        if rule.max_cc:
            high = [cc for cc in rel.compute_capabilities if CC.match(cc) and _cc_key(cc) > _cc_key(rule.max_cc)]
            if high:
                self.fail(where, f"{name} {version} has no kernels for compute capability {', '.join(high)} "
                                 f"(newest: {rule.max_cc})")
        rng = self.range_rule(self.rules.tensorrt, version) if name.startswith("tensorrt") else None
        if name.startswith("tensorrt"):
            if rng is None:
                self.fail(where, f"TensorRT {version} is not covered by rules.tensorrt")
            else:
                if major not in rng.cuda_majors:
                    self.fail(where, f"TensorRT {version} has no CUDA-{major} build")
                low = [cc for cc in rel.compute_capabilities
                       if rng.min_cc and CC.match(cc) and _cc_key(cc) < _cc_key(rng.min_cc)]
                if low:
                    self.fail(where, f"TensorRT {version} needs compute capability >= {rng.min_cc} "
                                     f"but the release lists {', '.join(low)}")

    def catalog_level(self) -> None:
        for name, img in self.spec.images.items():
            if not img.releases:
                self.fail(name, "image has no releases")
            if not img.buildable and not img.not_buildable_reason:
                self.fail(name, "buildable: false needs not_buildable_reason (shown to users at build time)")
        for name, stack in self.spec.stacks.items():
            if stack.cuda not in self.rules.cuda_minors:
                self.fail(f"stacks.{name}", f"CUDA {stack.cuda} has no entry under rules.cuda_minors")


# ----------------------------------------------------------------------------- complete


def _require_cuda(cuda: str, floor: str, full: str, rules: Rules) -> str:
    """NVIDIA_REQUIRE_CUDA like NVIDIA's images: cuda>=X.Y plus the older data-center branches
    that run it through minor-version compatibility (our images ship no cuda-compat package, so
    only branches at or above the CUDA major's floor are listed)."""
    low, high = int(floor.split(".")[0]), int(full.split(".")[0])
    groups = [
        f"brand={brand},driver>={b},driver<{b + 1}"
        for b in rules.driver_branches if low <= b < high
        for brand in rules.require_cuda_brands
    ]
    return " ".join([f"cuda>={cuda}", *groups])


def complete(spec: CatalogSpec, source: str) -> Catalog:
    """Resolve stacks and derive the values every later stage uses."""
    releases: dict[str, dict[str, Release]] = {}
    rules = spec.rules
    for image, img in spec.images.items():
        releases[image] = {}
        for tag, rel in img.releases.items():
            stack = spec.stacks[rel.stack]
            pins_text = {**stack.pins, **rel.pins}
            pins = tuple(Pin(c, *parse_pin(t)) for c, t in pins_text.items())
            major_rule = rules.cuda_majors[stack.cuda.split(".")[0]]
            floor = max([major_rule.min_driver, rel.min_driver or "0"], key=_v)
            full = rules.cuda_minors[stack.cuda].full_driver
            framework = None
            install: list[str] = []
            if rel.framework:
                fw_name, fw_version = parse_pin(rel.framework)
                framework = Pin("framework", fw_name, fw_version)
                fw_rule = rules.frameworks[fw_name][fw_version]
                install.append(fw_rule.install.format(version=fw_version) if fw_rule.install else rel.framework)
            install.extend(rel.extras)
            arch_floor = {cc: d for cc, d in rules.arch_min_driver.items()
                          if cc in rel.compute_capabilities and _v(d) > _v(floor)}
            releases[image][tag] = Release(
                image=image, tag=tag, spec=rel, base=spec.bases[rel.base], cuda=stack.cuda,
                pins=pins, framework=framework, extras=tuple(rel.extras), install=tuple(install),
                min_driver=floor, full_driver=full,
                compute_capabilities=tuple(sorted(rel.compute_capabilities, key=_cc_key)),
                arch_min_driver=arch_floor,
                require_cuda=_require_cuda(stack.cuda, floor, full, rules),
            )
    return Catalog(spec=spec, source=source, releases=releases)


# ----------------------------------------------------------------------------- entry points


class CatalogInvalid(UserError):
    """The catalog broke one or more rules; `problems` holds one line per violation."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        first = problems[0]
        more = f" (+{len(problems) - 1} more: run `ngcx catalog check {source}`)" if len(problems) > 1 else ""
        super().__init__(f"catalog {source} is invalid: {first}{more}")


def problems_of(text: str, source: str) -> tuple[CatalogSpec | None, list[str]]:
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
