"""The completed catalog (complete): stacks resolved into releases, driver floors and labels derived.

Why its own module: render, build, test and run consume only these frozen dataclasses (Release,
Catalog, Pin and the plain BaseInfo / ReleaseInfo / ImageInfo views of the schema), never the
pydantic models; deriving the driver floor, NVIDIA_REQUIRE_CUDA and the labels happens once, here,
after validation has passed. Plain dataclasses, not pydantic, because a catalog validated once is
rebuilt from its cached plain data (cache.py) without importing pydantic, which is most of the
cost of `ngcx render`; this module therefore imports the schema only when complete() runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError
from .patterns import PIN

if TYPE_CHECKING:
    from packaging.version import Version

    from .schema import Base, CatalogSpec, ImageSpec, ReleaseSpec, Rules

# ----------------------------------------------------------------------------- completed model


def _v(text: str) -> Version:
    from packaging.version import Version  # here: a cached catalog never compares versions

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

    @property
    def wheel_glob(self) -> str:
        """The file name pip gives this pin's wheel, as a shell glob over its tags: the name escaped as wheel
        files spell it (PEP 427: runs of - _ . become _), then the version. recipes/macros.j2 pool_install
        installs straight from the wheel pool when a file matches, without asking the index."""
        return f"{re.sub(r'[-_.]+', '_', self.wheel).lower()}-{self.version}-*.whl"


def parse_pin(text: str) -> tuple[str, str] | None:
    m = PIN.match(text.strip())
    return (m.group("name"), m.group("version")) if m else None


@dataclass(frozen=True)
class BaseInfo:
    """A base OS profile (schema.Base, validated): the image to build FROM and what it ships."""

    image: str
    offline: str | None
    suite: str | None
    python: str
    glibc: str | None

    @classmethod
    def of(cls, base: Base) -> BaseInfo:
        return cls(image=base.image, offline=base.offline, suite=base.suite, python=base.python, glibc=base.glibc)


@dataclass(frozen=True)
class ReleaseInfo:
    """A release as the catalog file states it (schema.ReleaseSpec, validated), before completion."""

    base: str
    python: str
    stack: str
    pins: dict[str, str]
    framework: str | None
    extras: tuple[str, ...]
    index_urls: tuple[str, ...]
    compute_capabilities: tuple[str, ...]
    min_driver: str | None

    @classmethod
    def of(cls, rel: ReleaseSpec) -> ReleaseInfo:
        return cls(base=rel.base, python=rel.python, stack=rel.stack, pins=dict(rel.pins), framework=rel.framework,
                   extras=tuple(rel.extras), index_urls=tuple(rel.index_urls),
                   compute_capabilities=tuple(rel.compute_capabilities), min_driver=rel.min_driver)


@dataclass(frozen=True)
class ImageInfo:
    """An image's own fields (schema.ImageSpec without its releases, which Catalog.releases holds)."""

    description: str
    buildable: bool
    not_buildable_reason: str | None

    @classmethod
    def of(cls, img: ImageSpec) -> ImageInfo:
        return cls(description=img.description, buildable=img.buildable, not_buildable_reason=img.not_buildable_reason)


@dataclass(frozen=True)
class Release:
    """A completed release: everything render, build, test and run need, derived once."""

    image: str
    tag: str
    spec: ReleaseInfo
    base: BaseInfo
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
        from ..core import naming

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
    """A validated, completed catalog.

    `spec` (the pydantic CatalogSpec) is built on first use only: render, build and `catalog ls`
    need releases, images and bases, and a catalog loaded from the cache would otherwise import
    pydantic just to rebuild it. Equality compares what the commands use, not that lazy copy.
    """

    source: str
    releases: dict[str, dict[str, Release]]
    images: dict[str, ImageInfo]
    bases: dict[str, BaseInfo]
    spec_data: dict[str, Any] = field(compare=False, repr=False)  # the validated spec as JSON data
    _spec: CatalogSpec | None = field(default=None, compare=False, repr=False)

    @property
    def spec(self) -> CatalogSpec:
        """The validated schema model; from the cache it is re-validated from spec_data on first use."""
        if self._spec is None:
            from .schema import validate

            self._spec = validate(self.spec_data)
        return self._spec

    @property
    def rules(self) -> Rules:
        return self.spec.rules

    def image_names(self) -> list[str]:
        return list(self.images)

    def image(self, name: str) -> ImageInfo:
        return self.images[name]

    def newest(self, image: str) -> Release:
        tags = sorted(self.releases[image], key=lambda t: tuple(int(x) for x in t.split(".")))
        return self.releases[image][tags[-1]]

    def resolve(self, ref: str) -> Release:
        """`pytorch:25.08` or `pytorch` (newest) -> Release; unknown -> UserError with suggestions."""
        name, _, tag = ref.partition(":")
        if name not in self.releases:
            import difflib  # only for the error: resolving a known ref is the hot path

            close = difflib.get_close_matches(name, self.image_names(), n=3, cutoff=0.4)
            hint = f"did you mean {', '.join(close)}?" if close else "see `ngcx catalog ls`"
            raise UserError(f"unknown image {name!r} in {self.source}", hint=hint)
        if not tag:
            return self.newest(name)
        if tag not in self.releases[name]:
            known = sorted(self.releases[name])
            import difflib

            close = difflib.get_close_matches(tag, known, n=3, cutoff=0.3)
            hint = (f"closest: {', '.join(f'{name}:{t}' for t in close)}; " if close else "") + \
                f"releases of {name}: {', '.join(known)}"
            raise UserError(f"unknown release {tag!r} of image {name!r}", hint=hint)
        return self.releases[name][tag]

    def all_releases(self) -> list[Release]:
        return [r for rels in self.releases.values() for r in rels.values()]


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
    from .schema import dump

    releases: dict[str, dict[str, Release]] = {}
    rules = spec.rules
    bases = {name: BaseInfo.of(b) for name, b in spec.bases.items()}
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
                image=image, tag=tag, spec=ReleaseInfo.of(rel), base=bases[rel.base], cuda=stack.cuda,
                pins=pins, framework=framework, extras=tuple(rel.extras), install=tuple(install),
                min_driver=floor, full_driver=full,
                compute_capabilities=tuple(sorted(rel.compute_capabilities, key=_cc_key)),
                arch_min_driver=arch_floor,
                require_cuda=_require_cuda(stack.cuda, floor, full, rules),
            )
    return Catalog(source=source, releases=releases, images={n: ImageInfo.of(i) for n, i in spec.images.items()},
                   bases=bases, spec_data=dump(spec), _spec=spec)
