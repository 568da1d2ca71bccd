"""The completed catalog (complete): stacks resolved into releases, driver floors and labels derived.

Why its own module: render, build, test and run consume only these frozen dataclasses (Release,
Catalog, Pin), never the raw schema; deriving the driver floor, NVIDIA_REQUIRE_CUDA and the
labels happens once, here, after validation has passed.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from packaging.version import Version

from ngcx.catalog.schema import PIN, Base, CatalogSpec, ImageSpec, ReleaseSpec, Rules
from ngcx.errors import UserError

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
