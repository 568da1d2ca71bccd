"""The catalog's compatibility rules (validate, step 2): every release against the rules' data.

Why its own module: the rules (CUDA -> driver floor and compute capabilities, cuDNN / NCCL /
TensorRT lines, wheel suffixes, framework -> CUDA / Python / exact pins) are data in
registry.yaml; this module only applies them and collects EVERY violation as a typed Problem
(where = the release or section, rule = the check that failed), never just the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion

from ..core.problems import Problem
from .complete import _cc_key, _v, parse_pin
from .schema import CC, DRIVER, RELEASE_TAG, CatalogSpec, CudaMajorRule, RangeRule, ReleaseSpec, Rules

# ----------------------------------------------------------------------------- rules


@dataclass
class Checker:
    """Applies the rules to one release spec; collects every violation as a typed Problem."""

    spec: CatalogSpec
    problems: list[Problem] = field(default_factory=list)

    @property
    def rules(self) -> Rules:
        return self.spec.rules

    def fail(self, rule: str, where: str, text: str) -> None:
        """One violation: where = the release (image:tag) or section, rule = the check that found it."""
        self.problems.append(Problem(where, "", rule, text))

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
            self.fail("catalog.release", where, f"release tag {tag!r} is not YY.MM (e.g. 25.08)")
        base = self.spec.bases.get(rel.base)
        if base is None:
            self.fail("catalog.release", where, f"base {rel.base!r} is not defined under 'bases' "
                             f"(known: {', '.join(self.spec.bases)})")
        elif base.python != rel.python:
            self.fail("catalog.release", where, f"python {rel.python} but base {rel.base} ships python {base.python}; "
                             f"pin python {base.python} or pick a base that ships {rel.python}")
        stack = self.spec.stacks.get(rel.stack)
        if stack is None:
            self.fail("catalog.release", where, f"stack {rel.stack!r} is not defined under 'stacks' "
                             f"(known: {', '.join(self.spec.stacks)})")
            return
        cuda = stack.cuda
        major = cuda.split(".")[0]
        major_rule = self.rules.cuda_majors.get(major)
        if major_rule is None:
            self.fail("catalog.release", where, f"CUDA {cuda}: no rules for CUDA major {major} under rules.cuda_majors")
            return
        if cuda not in self.rules.cuda_minors:
            self.fail("catalog.release", where, f"CUDA {cuda}: unknown CUDA release (no entry under rules.cuda_minors)")
        pins = {**stack.pins, **rel.pins}
        for component in ("cudart", "cublas", "cudnn", "nccl"):
            if component not in pins and component in ("cudart", "cublas"):
                self.fail("catalog.release", where, f"pins.{component}: required pin is missing")
        for component, text in pins.items():
            self.pin(where, component, text, cuda, major, rel)
        self.gpus(where, rel, cuda, major_rule)
        self.driver(where, rel, major_rule)
        if rel.framework:
            self.framework(where, rel, cuda, pins)
        for extra in rel.extras:
            if parse_pin(extra) is None:
                self.fail("catalog.release", where, f"extras: {extra!r} is not an exact pin NAME==VERSION")

    def pin(self, where: str, component: str, text: str, cuda: str, major: str, rel: ReleaseSpec) -> None:
        comp = self.rules.components.get(component)
        if comp is None:
            self.fail("catalog.pin", where,
                      f"pins.{component}: unknown component (known: {', '.join(self.rules.components)})")
            return
        parsed = parse_pin(text)
        if parsed is None:
            self.fail("catalog.pin", where, f"pins.{component}: {text!r} is not an exact pin NAME==VERSION")
            return
        wheel, version = parsed
        wheel_major = self.wheel_major(component, wheel)
        if wheel_major is None:
            self.fail("catalog.pin", where, f"{comp.label} wheel {wheel!r} is not a known {comp.stem}* wheel name")
        elif wheel_major != major:
            self.fail("catalog.pin", where,
                      f"{comp.label} {wheel} is a CUDA-{wheel_major} wheel but the release pins CUDA {cuda}")
        try:
            v = _v(version)
        except InvalidVersion:
            self.fail("catalog.pin", where, f"{comp.label} version {version!r} is not a version number")
            return
        if component in ("cudart", "cublas") and str(v.major) != major:
            self.fail("catalog.pin", where, f"{comp.label} {version} belongs to CUDA {v.major}, not CUDA {cuda}")
        if component == "cudart" and f"{v.major}.{v.minor}" != cuda:
            self.fail("catalog.pin", where,
                      f"CUDA runtime {version} is CUDA {v.major}.{v.minor} but the release pins CUDA {cuda}")
        table = {"cudnn": self.rules.cudnn, "nccl": self.rules.nccl}.get(component)
        if table is not None:
            rng = self.range_rule(table, version)
            if rng is None:
                self.fail("catalog.pin", where, f"{comp.label} {version} is not covered by rules.{component}")
            else:
                if major not in rng.cuda_majors:
                    self.fail("catalog.pin", where, f"{comp.label} {version} has no CUDA-{major} build "
                                     f"(builds for CUDA {', '.join(rng.cuda_majors)})")
                if rng.min_cc:
                    low = [cc for cc in rel.compute_capabilities if CC.match(cc) and _cc_key(cc) < _cc_key(rng.min_cc)]
                    if low:
                        self.fail("catalog.pin", where,
                                  f"{comp.label} {version} needs compute capability >= {rng.min_cc} "
                                         f"but the release lists {', '.join(low)}")

    def gpus(self, where: str, rel: ReleaseSpec, cuda: str, major_rule: CudaMajorRule) -> None:
        if not rel.compute_capabilities:
            self.fail("catalog.gpus", where, "compute_capabilities: list at least one GPU architecture")
        minor_rule = self.rules.cuda_minors.get(cuda)
        top = minor_rule.max_cc if minor_rule else major_rule.max_cc
        for cc in rel.compute_capabilities:
            if not CC.match(cc):
                self.fail("catalog.gpus", where, f"compute capability {cc!r} is not MAJOR.MINOR (e.g. 8.6)")
                continue
            if _cc_key(cc) < _cc_key(major_rule.min_cc):
                self.fail("catalog.gpus", where, f"compute capability {cc} is below CUDA {cuda.split('.')[0]}'s "
                                 f"lowest ({major_rule.min_cc})")
            elif _cc_key(cc) > _cc_key(top):
                self.fail("catalog.gpus", where,
                          f"compute capability {cc} is newer than CUDA {cuda} supports (up to {top})")

    def driver(self, where: str, rel: ReleaseSpec, major_rule: CudaMajorRule) -> None:
        if rel.min_driver is None:
            return
        try:
            if not DRIVER.match(rel.min_driver):  # Version() also takes '1!2', 'v570', '570\n'
                raise InvalidVersion(rel.min_driver)
            too_low = _v(rel.min_driver) < _v(major_rule.min_driver)
        except InvalidVersion:
            self.fail("catalog.driver", where, f"min_driver {rel.min_driver!r} is not a driver version like 570.26")
            return
        if too_low:
            self.fail("catalog.driver", where,
                      f"min_driver {rel.min_driver} is below the CUDA floor {major_rule.min_driver}; "
                             f"remove it or raise it")

    def framework(self, where: str, rel: ReleaseSpec, cuda: str, pins: dict[str, str]) -> None:
        parsed = parse_pin(rel.framework or "")
        if parsed is None:
            self.fail("catalog.framework", where, f"framework {rel.framework!r} is not an exact pin NAME==VERSION")
            return
        name, version = parsed
        major = cuda.split(".")[0]
        if name.startswith("tensorrt") and not name.endswith(f"-cu{major}"):
            # Checked first: a bare `tensorrt` has no rules entry, and the wheel name is the fix.
            self.fail("catalog.framework", where,
                      f"TensorRT wheel {name} does not match CUDA {major} (use tensorrt-cu{major}; "
                             f"the bare 'tensorrt' package changes CUDA major between releases)")
            return
        versions = self.rules.frameworks.get(name)
        rule = versions.get(version) if versions else None
        if rule is None:
            known = (f"known versions: {', '.join(versions)}" if versions
                     else f"known frameworks: {', '.join(self.rules.frameworks)}")
            self.fail("catalog.framework", where, f"framework {name} {version} is not in rules.frameworks.{name} "
                             f"({known}); add its CUDA and Requires-Dist pins there")
            return
        if rule.cuda and rule.cuda != cuda:
            rule_major = rule.cuda.split(".")[0]
            if rule_major != major:
                self.fail("catalog.framework", where, f"{name} {version} has no CUDA {major} build "
                                 f"(its wheel is built for CUDA {rule.cuda})")
            else:
                self.fail("catalog.framework", where,
                          f"{name} {version} is built for CUDA {rule.cuda} but the release pins CUDA {cuda}")
        if rule.cuda_majors and major not in rule.cuda_majors:
            self.fail("catalog.framework", where,
                      f"{name} {version} has no CUDA {major} build (CUDA {', '.join(rule.cuda_majors)} only)")
        if rule.cudnn_majors and "cudnn" in pins:
            cudnn = parse_pin(pins["cudnn"])
            if cudnn and cudnn[1].split(".")[0] not in rule.cudnn_majors:
                self.fail("catalog.framework", where, f"{name} {version} needs cuDNN {'/'.join(rule.cudnn_majors)}.x, "
                                 f"the release pins {cudnn[1]}")
        if rel.python and not SpecifierSet(rule.python).contains(rel.python + ".0"):
            self.fail("catalog.framework", where,
                      f"{name} {version} supports python {rule.python}, the release pins {rel.python}")
        for component, want in rule.requires.items():
            have = parse_pin(pins.get(component, ""))
            if have is None:
                self.fail("catalog.framework", where, f"{name} {version} requires {component}=={want} "
                                 f"but the release does not pin {component}")
            elif have[1] != want:
                label = self.rules.components[component].label
                self.fail("catalog.framework", where, f"{label} pin {have[1]} differs from {name} {version}'s own "
                                 f"Requires-Dist =={want}; pip would replace it")
        if rule.max_cc:
            high = [cc for cc in rel.compute_capabilities if CC.match(cc) and _cc_key(cc) > _cc_key(rule.max_cc)]
            if high:
                self.fail("catalog.framework", where,
                          f"{name} {version} has no kernels for compute capability {', '.join(high)} "
                                 f"(newest: {rule.max_cc})")
        rng = self.range_rule(self.rules.tensorrt, version) if name.startswith("tensorrt") else None
        if name.startswith("tensorrt"):
            if rng is None:
                self.fail("catalog.framework", where, f"TensorRT {version} is not covered by rules.tensorrt")
            else:
                if major not in rng.cuda_majors:
                    self.fail("catalog.framework", where, f"TensorRT {version} has no CUDA-{major} build")
                low = [cc for cc in rel.compute_capabilities
                       if rng.min_cc and CC.match(cc) and _cc_key(cc) < _cc_key(rng.min_cc)]
                if low:
                    self.fail("catalog.framework", where,
                              f"TensorRT {version} needs compute capability >= {rng.min_cc} "
                                     f"but the release lists {', '.join(low)}")

    def catalog_level(self) -> None:
        for name, img in self.spec.images.items():
            if not img.releases:
                self.fail("catalog.catalog-level", name, "image has no releases")
            if not img.buildable and not img.not_buildable_reason:
                self.fail("catalog.catalog-level", name,
                          "buildable: false needs not_buildable_reason (shown to users at build time)")
        for name, stack in self.spec.stacks.items():
            if stack.cuda not in self.rules.cuda_minors:
                self.fail("catalog.catalog-level", f"stacks.{name}",
                          f"CUDA {stack.cuda} has no entry under rules.cuda_minors")
