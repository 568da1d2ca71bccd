"""Which cloud GPU instance to run an image on: a data table per cloud, filtered by what the image
can run on, ranked by what the workload needs, explained line by line for `ngcx deploy --dry-run`.

Why a data table and not DescribeInstanceTypes: the cloud APIs name the GPU ("NVIDIA A10") and
count it, but say nothing about tensor TFLOP/s, memory bandwidth or compute capability, which is
what decides whether an image runs at all and how fast. Those come from NVIDIA's datasheets and
change only when a family is added, so they live in <cloud>/offers.yaml (cloud-neutral keys, the
same for AWS), validated as strictly as the catalog: a bad row is one line with file:line.

Prices in the table are estimates written from public price lists at `prices_as_of`, never live
figures: every row carries price_estimate, and explain() prints "est." next to such a price.

Rules, in the order a type is rejected (the first failing one is its reason):
1. compute capability: the GPU's must be in the image's label `ai.ngcx.compute-capabilities`. An
   entry "8.0+PTX" also admits every newer GPU (PTX is JIT-compiled forward). Plain entries are
   matched exactly, not by CUDA's same-major binary compatibility: the label is the list the image
   was built and tested for, and a missing architecture is the image author's signal.
2. driver: the image's `ai.ngcx.min-driver` is compared only with a row's `max_driver`, which the
   table carries only where NVIDIA has said a branch is a GPU's last (R580 for Pascal and Volta).
   Otherwise the host image is assumed to ship a current driver, and the floor is recorded in `why`.
3. `min_gpu_memory_gib` (per GPU: a served model must fit on one GPU), then `max_price` (an
   instance without a public price is kept only when there is no limit, marked "no public price").
`gpu` (--gpu) narrows the table to one model before these rules; the other models are not listed
as rejected, since the user asked for them to be left out.

Ranking (seeds-digest: 2020 GPU buying guide) compares PER-GPU figures, so an 8-GPU box does not
beat a better single GPU by adding them up; among equal figures fewer GPUs rank first (serving runs
one model per GPU, and a 1-GPU instance is the cheapest way to get that GPU), then the lower price
(spot price with spot=True, unknown prices last), then the name, so the order is total and stable.
- cnn: tensor TFLOP/s, FP32 TFLOP/s, GPU memory, FP16 TFLOP/s (all descending).
- rnn / transformer: memory bandwidth, GPU memory, FP16, tensor, FP32 TFLOP/s (small matrix
  multiplies are bandwidth-bound).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..core.errors import UserError
from ..core.problems import Problem, ProblemsFound, schema_problems

WORKLOADS = ("cnn", "rnn", "transformer")
TARGETS_DIR = Path(__file__).resolve().parent    # each target's table: <cloud>/offers.yaml
_URL = r"^https?://\S+$"
_UNKNOWN_KEY_HINT = "remove it or check its spelling; the keys are listed at the top of cli/deploy/offers.py's _Row"


# ----------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class InstanceType:
    """One row of the table. GPU figures are per GPU; vcpu and ram_gib per instance."""

    name: str
    family: str
    gpu: str
    gpu_count: int
    gpu_memory_gib: float
    memory_bandwidth_gbs: float
    tensor_tflops: float
    fp32_tflops: float
    fp16_tflops: float
    compute_capability: str
    vcpu: int
    ram_gib: float
    price_per_hour: float | None
    spot_price_per_hour: float | None
    price_estimate: bool
    price_source: str | None
    price_region: str | None = None
    max_driver: str | None = None
    notes: str | None = None

    def price(self, spot: bool = False) -> float | None:
        """The hourly price ranking and --max-price use: the spot figure when asked and known, else
        on-demand (Alibaba's SpotAsPriceGo caps a spot bid at the on-demand price)."""
        if spot and self.spot_price_per_hour is not None:
            return self.spot_price_per_hour
        return self.price_per_hour

    def gpu_label(self) -> str:
        """e.g. '1x A100 80 GB': what a user compares across rows."""
        return f"{self.gpu_count}x {self.gpu} {_num(self.gpu_memory_gib)} GB"


@dataclass(frozen=True)
class Candidate:
    itype: InstanceType
    rank: int  # 1 = best
    why: str  # one short line


@dataclass(frozen=True)
class Rejected:
    itype: InstanceType
    reason: str


@dataclass(frozen=True)
class Choice:
    cloud: str
    candidates: list[Candidate]
    rejected: list[Rejected]
    workload: str
    prices_as_of: str
    currency: str = "USD"
    spot: bool = False
    gpu: str | None = None
    driver_floor: str | None = None


# ----------------------------------------------------------------------------- schema


class _Strict(BaseModel):
    # strict: a quoted "1" is not a GPU count and 8.6 unquoted is not a compute capability string
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Row(_Strict):
    """One instance type as written in <cloud>/offers.yaml."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="e.g. ecs.gn7i-c8g1.2xlarge")
    family: str = Field(pattern=r"^[a-z0-9][a-z0-9\-]*$", description="e.g. gn7i; must appear in name")
    gpu: str = Field(pattern=r"^[A-Za-z0-9]+$", description="model without memory: T4, A10, A100")
    gpu_count: int = Field(gt=0, le=64)
    gpu_memory_gib: float = Field(gt=0, le=1024, description="per GPU")
    memory_bandwidth_gbs: float = Field(gt=0, le=100_000, description="per GPU, GB/s")
    tensor_tflops: float = Field(ge=0, le=100_000, description="dense FP16 tensor-core TFLOP/s per GPU, 0 = none")
    fp32_tflops: float = Field(gt=0, le=100_000)
    fp16_tflops: float = Field(gt=0, le=100_000, description="non-tensor (packed) FP16 TFLOP/s per GPU")
    compute_capability: str = Field(pattern=r"^\d{1,2}\.\d$", description='quoted, e.g. "8.6"')
    vcpu: int = Field(gt=0, le=4096)
    ram_gib: float = Field(gt=0)
    price_per_hour: float | None = Field(gt=0, description="on-demand, one region; null = no public figure")
    spot_price_per_hour: float | None = Field(None, gt=0)
    price_estimate: bool
    price_region: str | None = Field(None, min_length=1)
    price_source: str | None = Field(None, pattern=_URL)
    max_driver: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$", description="last driver branch, if sourced")
    max_driver_source: str | None = Field(None, pattern=_URL)
    notes: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> _Row:
        if self.family not in self.name:
            raise ValueError(f"family {self.family!r} does not appear in the name {self.name!r}")
        if self.price_per_hour is not None and (not self.price_source or not self.price_region):
            raise ValueError("a price needs price_source (the page) and price_region")
        if self.spot_price_per_hour is not None:
            if self.price_per_hour is None:
                raise ValueError("a spot price needs the on-demand price_per_hour too")
            if self.spot_price_per_hour > self.price_per_hour:
                raise ValueError("spot_price_per_hour is above price_per_hour (spot is capped at on-demand)")
        if self.max_driver and not self.max_driver_source:
            raise ValueError("max_driver needs max_driver_source: the table carries driver limits only if sourced")
        return self


class _Table(_Strict):
    cloud: str = Field(pattern=r"^[a-z0-9\-]+$")
    currency: Literal["USD", "CNY"]
    prices_as_of: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    sources: list[str] = Field(min_length=1)
    instance_types: list[_Row] = Field(min_length=1)

    @field_validator("prices_as_of", mode="before")
    @classmethod
    def _date_as_text(cls, value: Any) -> Any:
        """YAML reads an unquoted 2024-09-01 as a date; accept it as the text it was."""
        return value.isoformat() if isinstance(value, datetime.date) else value

    @field_validator("sources")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        bad = [s for s in value if not re.match(_URL, s)]
        if bad:
            raise ValueError(f"sources must be http(s) URLs, not {bad[0]!r}")
        return value


# ----------------------------------------------------------------------------- load


def table_file(cloud: str) -> Path:
    """<cloud>/offers.yaml; an unknown cloud -> UserError naming the known ones."""
    known = sorted(p.parent.name for p in TARGETS_DIR.glob("*/offers.yaml"))
    if not re.fullmatch(r"[a-z0-9\-]+", cloud) or cloud not in known:
        raise UserError(f"no instance table for cloud {cloud!r}: ngcx knows {', '.join(known) or 'none'}",
                        hint="pick one of them")
    return TARGETS_DIR / cloud / "offers.yaml"


def load_table(cloud: str, path: Path | None = None) -> tuple[list[InstanceType], dict]:
    """The instance types of `cloud` (from `path`, or the shipped <cloud>/offers.yaml) and the table's
    meta: cloud, currency, prices_as_of, sources, file. A bad table -> one UserError line, file:line."""
    file = Path(path) if path is not None else table_file(cloud)
    try:
        stat = file.stat()
    except OSError as exc:
        raise UserError(f"cannot read {file}: {exc.strerror or exc}", hint="check the --table path") from None
    types, meta = _load_cached(str(file), cloud, stat.st_mtime_ns, stat.st_size)
    return list(types), dict(meta)


@lru_cache(maxsize=8)
def _load_cached(source: str, cloud: str, _mtime: int, _size: int) -> tuple[tuple[InstanceType, ...], dict]:
    """Parse once per file version: the dry run, the deploy and `ngcx deploy --explain` all ask."""
    from ..core.yamlio import read_text

    file = Path(source)
    data, lines = _parse(read_text(file, "check the instance table's path"), source)
    try:
        table = _Table.model_validate(data)
    except ValidationError as exc:
        raise ProblemsFound(file.name, schema_problems(exc, source, lines, _UNKNOWN_KEY_HINT)) from None
    problems = _table_problems(table, cloud, source, lines)
    if problems:
        raise ProblemsFound(file.name, problems)
    types = tuple(_instance(row) for row in table.instance_types)
    meta = {"cloud": table.cloud, "currency": table.currency, "prices_as_of": table.prices_as_of,
            "sources": list(table.sources), "file": source}
    return types, meta


def _parse(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """YAML -> (data, {path: line}) through the one limited loader; a non-mapping says what is expected."""
    from ..core.yamlio import load_mapping_with_lines

    expected = "a mapping with cloud, currency, prices_as_of, sources and instance_types"
    try:
        return load_mapping_with_lines(text, source, expected)
    except ProblemsFound as exc:  # its hint is about ngcx.yaml; say what this file needs instead
        raise ProblemsFound(Path(source).name, [Problem(source, "", "parse.not-a-mapping",
                                                        f"the file must be {expected}")]) from exc


def _table_problems(table: _Table, cloud: str, source: str, lines: dict[tuple, int]) -> list[Problem]:
    """Rules across rows that the per-row schema cannot see."""
    from ..core.problems import where

    problems = []
    if table.cloud != cloud:
        problems.append(Problem(where(source, lines, ("cloud",)), "cloud", "offers.wrong-cloud",
                                f"the table is for {table.cloud!r}, asked for {cloud!r}"))
    seen: dict[str, int] = {}
    for i, row in enumerate(table.instance_types):
        if row.name in seen:
            problems.append(Problem(where(source, lines, ("instance_types", i, "name")), f"instance_types.{i}.name",
                                    "offers.duplicate-name",
                                    f"{row.name} is listed twice (first as instance_types.{seen[row.name]})"))
        seen.setdefault(row.name, i)
    return problems


def _instance(row: _Row) -> InstanceType:
    return InstanceType(**row.model_dump(exclude={"max_driver_source"}))


# ----------------------------------------------------------------------------- choose


def choose(cloud: str, *, compute_capabilities: list[str], driver_floor: str | None, gpu: str | None = None,
           workload: str = "cnn", max_price: float | None = None, spot: bool = False,
           min_gpu_memory_gib: float | None = None, table: Path | None = None) -> Choice:
    """Rank `cloud`'s instance types for an image (its compute-capability and min-driver labels) and a
    workload; see the module docstring for the rules. No candidates is not an error here: the Choice
    says why each type was rejected and the caller words the message."""
    if workload not in WORKLOADS:
        raise UserError(f"unknown workload {workload!r}", hint=f"use one of {', '.join(WORKLOADS)}")
    if max_price is not None and max_price <= 0:
        raise UserError(f"the price limit must be above 0, not {max_price}")
    if min_gpu_memory_gib is not None and min_gpu_memory_gib <= 0:
        raise UserError(f"the minimum GPU memory must be above 0 GiB, not {min_gpu_memory_gib}")
    supported = _parse_capabilities(compute_capabilities)
    floor = _parse_driver(driver_floor)
    types, meta = load_table(cloud, table)
    if gpu:
        types = _only_gpu(types, gpu, cloud)
    kept, rejected = [], []
    for itype in types:
        reason = _rejection(itype, supported, driver_floor, floor, min_gpu_memory_gib, max_price, spot, meta)
        if reason:
            rejected.append(Rejected(itype, reason))
        else:
            kept.append(itype)
    kept.sort(key=lambda t: _rank_key(t, workload, spot))
    candidates = [Candidate(t, i + 1, _why(t, i, kept, workload, spot, driver_floor)) for i, t in enumerate(kept)]
    return Choice(cloud=meta["cloud"], candidates=candidates, rejected=rejected, workload=workload,
                  prices_as_of=meta["prices_as_of"], currency=meta["currency"], spot=spot, gpu=gpu,
                  driver_floor=driver_floor)


@dataclass(frozen=True)
class _Cap:
    """One entry of the image's compute-capability label; ptx = also runs on newer GPUs (JIT)."""

    version: tuple[int, int]
    ptx: bool

    def admits(self, cc: tuple[int, int]) -> bool:
        return cc == self.version or (self.ptx and cc > self.version)

    def text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}" + ("+PTX" if self.ptx else "")


def _parse_capabilities(values: list[str]) -> list[_Cap]:
    """The label's entries ("8.6", "86", "sm_86", "8.0+PTX"; comma-joined entries are split too)."""
    caps: list[_Cap] = []
    for raw in (part.strip() for value in values for part in str(value).split(",")):
        if not raw:
            continue
        m = re.fullmatch(r"(?:sm_|compute_)?(\d{1,2})\.?(\d)(\+ptx)?", raw, flags=re.IGNORECASE)
        if not m:
            raise UserError(f"the image's compute capability {raw!r} is not like 8.6 or 8.0+PTX",
                            hint="check its label ai.ngcx.compute-capabilities")
        caps.append(_Cap((int(m[1]), int(m[2])), bool(m[3])))
    if not caps:
        raise UserError("the image declares no GPU compute capabilities, so no GPU instance can be chosen",
                        hint="check its label ai.ngcx.compute-capabilities (e.g. 7.5,8.0,8.6)")
    return sorted(set(caps), key=lambda c: (c.version, c.ptx))


def _parse_driver(floor: str | None) -> tuple[int, ...] | None:
    if floor is None or not str(floor).strip():
        return None
    if not re.fullmatch(r"\d+(\.\d+){0,2}", str(floor).strip()):
        raise UserError(f"the image's minimum driver {floor!r} is not a version like 525.60.13",
                        hint="check its label ai.ngcx.min-driver")
    return tuple(int(p) for p in str(floor).strip().split("."))


def _only_gpu(types: list[InstanceType], wanted: str, cloud: str) -> list[InstanceType]:
    """--gpu: a model ('a10', 'A100') or a model with memory ('A100-80G', 'v100 32gb'), any case."""
    models = sorted({t.gpu for t in types})
    model, _, rest = re.sub(r"[\s_]+", "-", wanted.strip()).partition("-")
    memory = re.fullmatch(r"(\d+)G(?:I?B)?", rest, flags=re.IGNORECASE) if rest else None
    match = [t for t in types if t.gpu.lower() == model.lower()]
    if not match or (rest and not memory):
        with_memory = sorted({f"{t.gpu}-{_num(t.gpu_memory_gib)}G" for t in types})
        raise UserError(f"unknown GPU {wanted!r} for {cloud}: the table knows {', '.join(models)}",
                        hint=f"a model, or a model with memory: {', '.join(with_memory)}")
    if memory:
        sizes = sorted({t.gpu_memory_gib for t in match})
        match = [t for t in match if t.gpu_memory_gib == float(memory[1])]
        if not match:
            raise UserError(f"{cloud} has no {model.upper()} with {memory[1]} GB",
                            hint=f"{model.upper()} comes with {', '.join(_num(s) for s in sizes)} GB")
    return match


def _rejection(t: InstanceType, supported: list[_Cap], floor_text: str | None, floor: tuple[int, ...] | None,
               min_memory: float | None, max_price: float | None, spot: bool, meta: dict) -> str | None:
    """Why `t` cannot be a candidate (the first rule it breaks), or None."""
    cc = tuple(int(p) for p in t.compute_capability.split("."))
    if not any(cap.admits(cc) for cap in supported):
        listed = ", ".join(cap.text() for cap in supported)
        return f"GPU {t.gpu} is compute capability {t.compute_capability}, the image supports {listed}"
    if floor and t.max_driver and floor[0] > int(t.max_driver.split(".")[0]):
        return (f"GPU {t.gpu}'s last NVIDIA driver branch is {t.max_driver}, "
                f"the image needs driver >= {floor_text}")
    if min_memory is not None and t.gpu_memory_gib < min_memory:
        return f"GPU {t.gpu} has {_num(t.gpu_memory_gib)} GB per GPU, at least {_num(min_memory)} GB was asked"
    price = t.price(spot)
    if max_price is not None and price is None:
        return "no public price to compare with the price limit"
    if max_price is not None and price is not None and price > max_price:
        return f"costs {_price(t, spot, meta['currency'])}, over the limit of {_num(max_price)} {meta['currency']}/h"
    return None


_FIGURES = {  # (attribute, label) in ranking order, per workload
    "cnn": (("tensor_tflops", "tensor TFLOP/s"), ("fp32_tflops", "FP32 TFLOP/s"),
            ("gpu_memory_gib", "GB memory"), ("fp16_tflops", "FP16 TFLOP/s")),
    "rnn": (("memory_bandwidth_gbs", "GB/s"), ("gpu_memory_gib", "GB memory"), ("fp16_tflops", "FP16 TFLOP/s"),
            ("tensor_tflops", "tensor TFLOP/s"), ("fp32_tflops", "FP32 TFLOP/s")),
}
_FIGURES["transformer"] = _FIGURES["rnn"]


def _figures(t: InstanceType, workload: str) -> tuple[float, ...]:
    return tuple(getattr(t, attr) for attr, _ in _FIGURES[workload])


def _rank_key(t: InstanceType, workload: str, spot: bool) -> tuple:
    """Per-GPU figures (descending), fewer GPUs, lower price (unknown last), then the smaller instance
    (fewer vCPU, less RAM: the likely cheaper one where no price is known), then the name."""
    price = t.price(spot)
    return (tuple(-f for f in _figures(t, workload)), t.gpu_count, price is None, price or 0.0,
            t.vcpu, t.ram_gib, t.name)


def _why(t: InstanceType, i: int, ranked: list[InstanceType], workload: str, spot: bool,
         driver_floor: str | None) -> str:
    """One short line: what put `t` below the types above it (its figures are on the same line)."""
    _, label = _FIGURES[workload][0]
    if i == 0:
        parts = [f"most {label} per GPU" + (f" of {len(ranked)}" if len(ranked) > 1 else "")]
    else:
        parts = [_versus(t, ranked[i - 1], ranked, workload, spot)]
    if driver_floor:  # no sourced limit for this GPU: the host image's driver is assumed current
        parts.append(f"driver >= {driver_floor} assumed on the host")
    return "; ".join(parts)


def _versus(t: InstanceType, above: InstanceType, ranked: list[InstanceType], workload: str, spot: bool) -> str:
    """Why `t` ranks below `above`, named by the rank of the first type with the same GPU figures."""
    mine, theirs = _figures(t, workload), _figures(above, workload)
    head = next(n for n, r in enumerate(ranked, 1) if _figures(r, workload) == theirs)
    for (_, label), a, b in zip(_FIGURES[workload], mine, theirs, strict=True):
        if a != b:
            return f"{_num(a)} < {_num(b)} {label} of #{head}"
    if t.gpu_count != above.gpu_count:
        return f"same GPU as #{head}, {t.gpu_count} GPUs (fewer GPUs rank first)"
    mine_p, theirs_p = t.price(spot), above.price(spot)
    if mine_p is not None and theirs_p is not None and mine_p > theirs_p:
        return f"same GPU as #{head}, costs more"
    return f"same GPU as #{head}, larger instance"


# ----------------------------------------------------------------------------- explain


def explain(choice: Choice) -> list[str]:
    """The lines `ngcx deploy --dry-run` prints: a header, the ranked candidates with their key figures
    and price ("est." when the table's figure is an estimate), then the rejected types grouped by
    family and reason (forty T4 sizes rejected for one reason are one line)."""
    mode = "spot" if choice.spot else "on-demand"
    only = f" ({choice.gpu} only)" if choice.gpu else ""
    lines = [f"{choice.cloud}: {len(choice.candidates)} candidate(s){only} for a {choice.workload} workload; "
             f"prices {choice.currency}/h {mode}, list prices as of {choice.prices_as_of}, not live"]
    width = max((len(c.itype.name) for c in choice.candidates), default=0)
    for c in choice.candidates:
        t = c.itype
        lines.append(f"  {c.rank:>2}. {t.name:<{width}}  {t.gpu_label()}, {_num(t.tensor_tflops)} tensor / "
                     f"{_num(t.fp32_tflops)} FP32 TFLOP/s, {_num(t.memory_bandwidth_gbs)} GB/s, {t.vcpu} vCPU "
                     f"{_num(t.ram_gib)} GiB, {_price(t, choice.spot, choice.currency)} - {c.why}")
    if choice.rejected:
        lines.append(f"rejected ({len(choice.rejected)}):")
        lines += _rejected_lines(choice.rejected)
    return lines


def _rejected_lines(rejected: list[Rejected]) -> list[str]:
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rejected:
        groups.setdefault((r.itype.family, r.reason), []).append(r.itype.name)
    out = []
    for (family, reason), names in groups.items():
        who = names[0] if len(names) == 1 else f"{family} ({len(names)} types)"
        out.append(f"  {who}: {reason}")
    return out


def _price(t: InstanceType, spot: bool, currency: str) -> str:
    price = t.price(spot)
    if price is None:
        return "no public price"
    kind = (" spot" if t.spot_price_per_hour is not None else " on-demand (no spot figure)") if spot else ""
    return f"{price:.2f} {currency}/h{kind}" + (" est." if t.price_estimate else "")


def _num(x: float) -> str:
    """12.0 -> '12', 19.5 -> '19.5': figures read as the datasheets print them."""
    return f"{x:g}"


# ----------------------------------------------------------------------------- across clouds


def merged(choices: list[Choice]) -> list[tuple[str, Candidate]]:
    """Every cloud's candidates in one ranking (`--cloud any`): the same key as within a cloud (per-GPU
    figures for the workload, fewer GPUs, price), so an A100 on one cloud ranks above a T4 on another.
    Prices are compared as written; the tables share one currency (USD) — checked here."""
    currencies = {c.currency for c in choices if c.candidates}
    if len(currencies) > 1:
        raise UserError(f"the instance tables price in different currencies ({', '.join(sorted(currencies))})",
                        hint="write every <cloud>/offers.yaml in one currency")
    pairs = [(choice.cloud, cand) for choice in choices for cand in choice.candidates]
    return sorted(pairs, key=lambda p: _rank_key(p[1].itype, choices[0].workload,
                                                 next(c.spot for c in choices if c.cloud == p[0])))


def merged_order(choices: list[Choice]) -> list[str]:
    """The clouds in the order of their best candidate in the merged ranking (clouds without one last out)."""
    order: list[str] = []
    for cloud, _cand in merged(choices):
        if cloud not in order:
            order.append(cloud)
    return order


def explain_merged(choices: list[Choice]) -> list[str]:
    """`--cloud any --dry-run`: the merged ranking (cloud named on each line), then each cloud's rejections."""
    ranking = merged(choices)
    first = next((c for c in choices if c.candidates), choices[0])
    lines = [f"any: {len(ranking)} candidate(s) across {', '.join(c.cloud for c in choices)} for a "
             f"{first.workload} workload; prices {first.currency}/h, list prices as of "
             f"{', '.join(f'{c.cloud} {c.prices_as_of}' for c in choices)}, not live"]
    width = max((len(c.itype.name) for _, c in ranking), default=0)
    for rank, (cloud, c) in enumerate(ranking, 1):
        t = c.itype
        lines.append(f"  {rank:>2}. {cloud:<6} {t.name:<{width}}  {t.gpu_label()}, {_num(t.tensor_tflops)} tensor / "
                     f"{_num(t.fp32_tflops)} FP32 TFLOP/s, {_num(t.memory_bandwidth_gbs)} GB/s, "
                     f"{_price(t, first.spot, first.currency)}")
    for choice in choices:
        if choice.rejected:
            lines.append(f"{choice.cloud} rejected ({len(choice.rejected)}):")
            lines += _rejected_lines(choice.rejected)
    return lines


# ----------------------------------------------------------------------------- a service's cost


@dataclass(frozen=True)
class ServiceCost:
    """What a service's hosts cost per hour as bought (each on its market) and all on demand, from the table.

    Why from the table and not the bill: the table is what ngcx ranked the hosts by, the same figure on both
    clouds; its prices are estimates (prices_as_of), and a spot price moves hourly, so `show` says "est.".
    None: a host's type has no public price in the table."""

    hosts: int
    spot_hosts: int
    per_hour: float | None
    on_demand_per_hour: float | None
    currency: str
    prices_as_of: str

    @property
    def saving(self) -> float | None:
        """The share of the all-on-demand price that buying spot saves (0.0 .. 1.0)."""
        if not self.per_hour or not self.on_demand_per_hour:
            return None
        return 1.0 - self.per_hour / self.on_demand_per_hour

    def text(self) -> str:
        if self.per_hour is None or self.on_demand_per_hour is None:
            return f"{self.hosts} host(s): no public price in the offers table"
        line = (f"{self.per_hour:.3f} {self.currency}/h est. for {self.hosts} host(s) "
                f"({self.spot_hosts} spot, {self.hosts - self.spot_hosts} on demand)")
        if self.spot_hosts:
            line += f"; all on demand {self.on_demand_per_hour:.3f} {self.currency}/h ({self.saving:.0%} saved)"
        return line + f"; prices as of {self.prices_as_of}"


def service_cost(cloud: str, instance_type: str, markets: list[str]) -> ServiceCost | None:
    """The cost of hosts of `instance_type`, one per entry of `markets` ("spot" / "on-demand"); None when the
    type is not in the cloud's table."""
    types, meta = load_table(cloud)
    row = next((t for t in types if t.name == instance_type), None)
    if row is None:
        return None
    spot = sum(1 for m in markets if m == "spot")
    on_demand = row.price(spot=False)
    spot_price = row.price(spot=True)
    per_hour = None if on_demand is None or spot_price is None else (
        spot * spot_price + (len(markets) - spot) * on_demand)
    return ServiceCost(len(markets), spot, per_hour, None if on_demand is None else len(markets) * on_demand,
                       str(meta.get("currency", "")), str(meta.get("prices_as_of", "")))


def planned_markets(hosts: int, spot: bool, on_demand_base: int) -> list[str]:
    """The markets a group of `hosts` buys: the floor on demand, the rest spot (MixedInstancesPolicy / ESS)."""
    if not spot:
        return ["on-demand"] * hosts
    floor = min(on_demand_base, hosts)
    return ["on-demand"] * floor + ["spot"] * (hosts - floor)
