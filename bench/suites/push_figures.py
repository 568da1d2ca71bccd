"""The push suite's figures: their names, the values per round, the ratios, and the notes read from them.

Why apart from bench/suites/push.py: this is the part that must be right without Docker (a ratio
upside down or a note that claims a win the figures do not show would mislead a reader), so it is
pure and unit-tested; the suite module only runs the pushes and pulls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import Measurement, Ratio, Stats

REF = "cuda:24.05"
PAYLOAD_MB = 8
CLEAR = 0.8                       # "wins clearly": at most 80 % of the other's median, and ranges apart
LABEL = {"gzip": "gzip (ngcx push: dockerd)", "pigz": "gzip by pigz", "zstd": "zstd", "none": "uncompressed"}
TOOL = {"gzip": "ngcx", "pigz": "pigz", "zstd": "zstd", "none": "uncompressed"}
DOCKERD, CONTAINERD = "dockerd", "containerd (ctr)"


def push_name(codec: str) -> str:
    return f"push, {LABEL[codec]}"


def pushed_name(codec: str) -> str:
    return f"bytes pushed, {LABEL[codec]}"


def pull_name(codec: str, engine: str = DOCKERD) -> str:
    return f"pull into an empty {engine}, {LABEL[codec]}"


def pulled_name(codec: str) -> str:
    return f"bytes pulled, {LABEL[codec]}"


UNPIGZ = f"pull into an empty dockerd + unpigz, {LABEL['gzip']}"
SECOND_PUSH, SECOND_PUSHED = "second image: ngcx push", "second image: bytes pushed"
SECOND_PULL = f"second image: pull into the dockerd holding {REF}"
SECOND_PULLED, SECOND_SIZE = "second image: bytes pulled", "second image: full compressed size"

ORDER = [  # how the table and the chart list the figures: pushes, then pulls, then the second image
    *(push_name(c) for c in LABEL), *(pushed_name(c) for c in LABEL),
    pull_name("gzip"), UNPIGZ, pull_name("pigz"), pull_name("zstd"), pull_name("none"),
    pull_name("gzip", CONTAINERD), pull_name("zstd", CONTAINERD), *(pulled_name(c) for c in LABEL),
    SECOND_PUSH, SECOND_PUSHED, SECOND_PULL, SECOND_PULLED, SECOND_SIZE,
]

RATIOS = [  # (name, numerator, denominator); the first two head BENCHMARKS.md's summary table
    ("push time: zstd / gzip (ngcx push)", push_name("zstd"), push_name("gzip")),
    ("pull time, containerd: zstd / gzip", pull_name("zstd", CONTAINERD), pull_name("gzip", CONTAINERD)),
    ("bytes: zstd / gzip (ngcx push)", pushed_name("zstd"), pushed_name("gzip")),
    ("push time: pigz / gzip (ngcx push)", push_name("pigz"), push_name("gzip")),
    ("bytes: pigz / gzip (ngcx push)", pushed_name("pigz"), pushed_name("gzip")),
    ("pull time, dockerd: pigz's gzip / ngcx push's gzip", pull_name("pigz"), pull_name("gzip")),
    ("pull time, dockerd: zstd / gzip", pull_name("zstd"), pull_name("gzip")),
    ("pull time, dockerd: with unpigz / without", UNPIGZ, pull_name("gzip")),
    ("pull time, dockerd: uncompressed / gzip (ngcx push)", pull_name("none"), pull_name("gzip")),
    ("bytes: uncompressed / gzip (ngcx push)", pushed_name("none"), pushed_name("gzip")),
    ("push time: uncompressed / gzip (ngcx push)", push_name("none"), push_name("gzip")),
    ("second image pull / first pull: time", SECOND_PULL, pull_name("gzip")),
    ("second image pull / first pull: bytes", SECOND_PULLED, pulled_name("gzip")),
]


# ----------------------------------------------------------------------------- small pure helpers


def clearly_lower(alt: Stats, base: Stats, margin: float = CLEAR) -> bool:
    """alt beats base clearly: its median at most `margin` of base's and, with 3 or more values each,
    its slowest run faster than base's fastest (the ranges do not overlap on this noisy machine)."""
    if alt.median > margin * base.median:
        return False
    return len(alt.values) < 3 or len(base.values) < 3 or alt.max < base.min


def percent_less(num: float, den: float) -> str:
    """'38% less' / '12% more': num against den."""
    change = 1 - num / den
    return f"{abs(change) * 100:.0f}% {'less' if change >= 0 else 'more'}"


def rotated(items: tuple[str, ...], round_: int) -> tuple[str, ...]:
    """The codecs in another order each round, so that no compression always runs after the heaviest."""
    k = round_ % len(items)
    return items[k:] + items[:k]


def new_blob_bytes(first: dict[str, Any], second: dict[str, Any]) -> int:
    """Bytes of the second manifest's layers the first does not have, plus its config: what its push uploads."""
    known = {layer["digest"] for layer in first["layers"]}
    fresh = sum(int(layer["size"]) for layer in second["layers"] if layer["digest"] not in known)
    return fresh + int(second["config"]["size"])


# ----------------------------------------------------------------------------- values per round


@dataclass
class Figures:
    """Values per figure over the rounds, what each figure is, the failures that are findings (zstd on
    dockerd 20.10), and facts about the machines (versions, unpigz)."""

    values: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float | None]] = field(default_factory=dict)
    meta: dict[str, dict[str, str]] = field(default_factory=dict)
    failures: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, value: float, unit: str, tool: str, command: str, note: str = "",
            cpu: float | None = None) -> None:
        self.values.setdefault(name, []).append(value)
        self.cpu.setdefault(name, []).append(cpu)
        self.meta.setdefault(name, {"unit": unit, "tool": tool, "command": command, "note": note})

    def failed(self, name: str, record: dict[str, Any]) -> None:
        self.failures.setdefault(name, []).append(record)

    def stats(self, name: str) -> Stats | None:
        return Stats.of(self.values[name]) if self.values.get(name) else None

    def median(self, name: str) -> float | None:
        found = self.stats(name)
        return found.median if found else None

    def cpu_stats(self, name: str) -> Stats | None:
        """CPU seconds of a timed figure, only where every round has one (a partial set would skew it)."""
        vals = self.cpu.get(name) or []
        return Stats.of(vals) if vals and all(v is not None for v in vals) else None

    def measurements(self) -> list[Measurement]:
        """Every figure measured, in ORDER (rounds rotate the codecs, so arrival order says nothing)."""
        names = sorted(self.values, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
        return [Measurement(name=name, tool=self.meta[name]["tool"], unit=self.meta[name]["unit"], better="lower",
                            wall=Stats.of(self.values[name]), cpu=self.cpu_stats(name),
                            command=self.meta[name]["command"], note=self.meta[name]["note"])
                for name in names]


def ratios(figs: Figures) -> list[Ratio]:
    """Every RATIOS entry whose two figures were measured (none for a pull that failed everywhere)."""
    out = []
    for name, num, den in RATIOS:
        a, b = figs.stats(num), figs.stats(den)
        if a is None or b is None or not b.median:
            continue
        ca, cb = figs.cpu_stats(num), figs.cpu_stats(den)
        cpu = round(ca.median / cb.median, 3) if ca and cb and cb.median else None
        out.append(Ratio(name=name, numerator=num, denominator=den, wall=round(a.median / b.median, 3), cpu=cpu,
                         unit=figs.meta[num]["unit"]))
    return out


# ----------------------------------------------------------------------------- notes


def notes(figs: Figures, image: dict[str, Any]) -> list[str]:
    """Plain sentences computed from the medians: who wins on push, on pull, by how much, and what
    adopting the winner would take. No figure in here is typed in; each comes from this run."""
    out = [_push_note(figs, image)]
    out += _export_note(figs)
    out += _verdicts(figs)
    out += _pull_notes(figs)
    out += _uncompressed_note(figs)
    out += _second_note(figs)
    out += _adoption(figs)
    return [n for n in out if n]


def _cpu(figs: Figures, name: str) -> float | None:
    found = figs.cpu_stats(name)
    return found.median if found else None


def _push_note(figs: Figures, image: dict[str, Any]) -> str:
    t = {c: figs.median(push_name(c)) for c in LABEL}
    b = {c: figs.median(pushed_name(c)) for c in LABEL}
    cpu = {c: _cpu(figs, push_name(c)) for c in LABEL}
    parts = ", ".join(f"{LABEL[c]} {t[c]:.1f} s / {b[c]:,.0f} MB" + (f" / {cpu[c]:.0f} s CPU" if cpu[c] else "")
                      for c in LABEL if t[c] and b[c])
    return (f"Push of {REF} ({image['size'] / 1e9:.2f} GB in the engine, {image['layers']} layers) into an empty "
            f"registry, medians, time / bytes on the wire / CPU on this host (dockerd + the pushing processes; "
            f"dockerd's share also counts any other work the shared engine did meanwhile): {parts}.")


def _export_note(figs: Figures) -> list[str]:
    export = figs.facts.get("export", {})
    secs = [v for c in ("pigz", "zstd") for v in export.get(c, [])]
    if not secs:
        return []
    med = Stats.of(secs).median
    return [f"pigz and zstd start from `docker save`, whose first byte came {med:.1f} s after the call (median; "
            "dockerd 20.10 assembles the whole export in a temporary folder first): part of their push time that "
            "dockerd's own push does not pay (it reads each layer in place). A tool that compresses where the "
            "layers are (BuildKit's image exporter, at build time) would not pay it either."]


def _verdict(figs: Figures, codec: str) -> str:
    alt, base = figs.stats(push_name(codec)), figs.stats(push_name("gzip"))
    size_a, size_b = figs.median(pushed_name(codec)), figs.median(pushed_name("gzip"))
    if not (alt and base and size_a and size_b):
        return ""
    what = f"{alt.median / base.median:.2f}x the time of ngcx push ({percent_less(alt.median, base.median)})"
    size = f"{percent_less(size_a, size_b)} bytes"
    if clearly_lower(alt, base):
        return f"{LABEL[codec]} wins the push clearly: {what}, {size}."
    export = Stats.of(figs.facts.get("export", {}).get(codec) or [0.0]).median
    why = (f"without the export it would take {alt.median - export:.1f} s against {base.median:.1f} s"
           if export else "")
    return (f"{LABEL[codec]} does not win the push clearly here: {what}, {size}"
            + (f"; {why}" if why else "") + ".")


def _verdicts(figs: Figures) -> list[str]:
    out = [_verdict(figs, "zstd"), _verdict(figs, "pigz")]
    pigz, gzip = figs.stats(push_name("pigz")), figs.stats(push_name("gzip"))
    cpu = {c: _cpu(figs, push_name(c)) for c in LABEL}
    if pigz and gzip and not clearly_lower(pigz, gzip):
        spent = (f" (CPU: pigz {cpu['pigz']:.0f} s, dockerd's gzip {cpu['gzip']:.0f} s, zstd {cpu['zstd']:.0f} s)"
                 if all(cpu.values()) else "")
        out.append("pigz runs gzip -6 on every core, but this machine has 2 cores shared with other sessions, "
                   "against dockerd's Go gzip, one stream per layer (up to 5 layers at once); deflate is what costs "
                   f"on CUDA libraries{spent}, so more threads help only where idle cores are.")
    return out


def _pull_notes(figs: Figures) -> list[str]:
    out = []
    versions = figs.facts.get("versions") or {}
    dockerd, containerd = versions.get("dockerd", "20.10"), versions.get("containerd", "?")
    g, p = figs.median(pull_name("gzip")), figs.median(pull_name("pigz"))
    if g and p:
        out.append(f"Pull into an empty dockerd {dockerd} (a fresh machine with its own disk, through the relay): "
                   f"gzip from ngcx push {g:.1f} s, pigz's gzip {p:.1f} s: the same format, so the difference is "
                   "size and noise.")
    failures = figs.failures.get(pull_name("zstd"))
    if failures:
        first = failures[0]
        out.append(f"dockerd {dockerd} cannot pull zstd layers: `docker pull` fails with `{first['error']}` after "
                   f"{first['seconds']:.1f} s ({first['relay_bytes'] / 1e6:,.0f} MB fetched), in {len(failures)} of "
                   f"{len(failures) + len(figs.values.get(pull_name('zstd'), []))} tries. Docker Engine 23.0 added "
                   "zstd pulls (moby/moby#41759); containerd already pulls them (below).")
    cz, cg = figs.stats(pull_name("zstd", CONTAINERD)), figs.stats(pull_name("gzip", CONTAINERD))
    if cz and cg:
        wins = "wins the pull clearly" if clearly_lower(cz, cg) else "does not win the pull clearly"
        cpu_z, cpu_g = _cpu(figs, pull_name("zstd", CONTAINERD)), _cpu(figs, pull_name("gzip", CONTAINERD))
        spent = f"; the machine's CPU {cpu_z:.1f} s against {cpu_g:.1f} s" if cpu_z and cpu_g else ""
        out.append(f"containerd {containerd} (ctr, on the same kind of machine) pulls and unpacks the zstd image in "
                   f"{cz.median:.1f} s against {cg.median:.1f} s for the gzip one ({cz.median / cg.median:.2f}x"
                   f"{spent}): zstd {wins}.")
    u = figs.stats(UNPIGZ)
    base = figs.stats(pull_name("gzip"))
    if u and base:
        have = figs.facts.get("unpigz_on_pull_hosts")
        where = ("The pulling hosts have no unpigz (tests/emulators/host installs Debian's docker.io, which does not "
                 "pull in pigz), so dockerd decompresses gzip with Go's library" if have is False
                 else "The pulling hosts already have unpigz")
        gain = (" Adding the pigz package to the hosts' image is the cheapest pull speed-up: it changes nothing in "
                "the image, the registry or ngcx push; `ngcx hosts bake` installs it in the host images it makes, and "
                "a deploy host that has to install Docker gets it in the same apt transaction (recipes/deploy/)."
                if clearly_lower(u, base, 0.9) else "")
        out.append(f"{where}; with pigz's unpigz on PATH the same gzip pull takes {u.median:.1f} s against "
                   f"{base.median:.1f} s ({u.median / base.median:.2f}x).{gain}")
    return out


def _uncompressed_note(figs: Figures) -> list[str]:
    """What a pull costs with nothing to inflate, against gzip, on the same kind of fresh machine."""
    n, g = figs.stats(pull_name("none")), figs.stats(pull_name("gzip"))
    size_n, size_g = figs.median(pushed_name("none")), figs.median(pushed_name("gzip"))
    if not (n and g and size_n and size_g):
        return []
    cpu_n, cpu_g = _cpu(figs, pull_name("none")), _cpu(figs, pull_name("gzip"))
    spent = f"; the machine's CPU {cpu_n:.1f} s against {cpu_g:.1f} s" if cpu_n and cpu_g else ""
    verdict = ("wins the pull clearly" if clearly_lower(n, g) else "does not win the pull clearly")
    return [f"Uncompressed layers (OCI plain tar, pushed through the registry API) pull into an empty dockerd in "
            f"{n.median:.1f} s against {g.median:.1f} s for ngcx push's gzip ({n.median / g.median:.2f}x{spent}), "
            f"carrying {size_n:,.0f} MB instead of {size_g:,.0f} MB ({percent_less(size_n, size_g)}): uncompressed "
            f"{verdict}. dockerd inflates each gzip layer with Go's library while it registers it, one layer after "
            "another; over a link as fast as this relay the inflating, not the bytes, bounds the pull. The price is "
            "the bytes stored in the registry and carried on every pull: a win only where the hosts' link to the "
            "registry is fast (a registry in the hosts' own region, reached through its VPC endpoint), and a loss "
            "over a slow one. Every engine reads plain tar layers; ngcx push writes gzip (dockerd's push)."]


def _second_note(figs: Figures) -> list[str]:
    t, b = figs.median(SECOND_PULL), figs.median(SECOND_PULLED)
    full, first = figs.median(SECOND_SIZE), figs.median(pull_name("gzip"))
    up, up_t = figs.median(SECOND_PUSHED), figs.median(SECOND_PUSH)
    if not (t and b and full and first):
        return []
    out = (f"A second image FROM {REF} (one {PAYLOAD_MB} MB layer on top) pulled into the engine that already holds "
           f"{REF}: {t:.2f} s and {b:,.1f} MB fetched of its {full:,.0f} MB compressed ({b / full * 100:.1f}%), "
           f"{t / first:.3f}x the first pull's time: the CUDA layers are fetched once per host.")
    if up and up_t:
        out += (f" Its ngcx push uploaded {up:,.1f} MB in {up_t:.1f} s: the registry already had every CUDA layer.")
    return [out]


def _adoption(figs: Figures) -> list[str]:
    out = []
    z, g = figs.stats(push_name("zstd")), figs.stats(push_name("gzip"))
    cz, cg = figs.stats(pull_name("zstd", CONTAINERD)), figs.stats(pull_name("gzip", CONTAINERD))
    if (z and g and clearly_lower(z, g)) or (cz and cg and clearly_lower(cz, cg)):
        out.append("What zstd would take in ngcx: dockerd's push (20.10, and later engines with their classic image "
                   "store) always writes gzip, so `ngcx push` would have to push without it: `skopeo copy "
                   "--dest-compress-format zstd docker-daemon:IMAGE docker://REF` (skopeo 1.9 is in bookworm), the "
                   "registry-API path this suite uses (bench/suites/push_compress.py), or a BuildKit builder "
                   "(buildx with the docker-container driver) whose image exporter writes compression=zstd. Every "
                   "engine that pulls must then read zstd: Docker Engine 23.0 or later, or containerd; ngcx's hosts "
                   "run Debian bookworm's docker.io 20.10, which cannot, so their image would need a newer engine, "
                   "or ngcx would have to keep a gzip copy for such hosts.")
    p = figs.stats(push_name("pigz"))
    if p and g and clearly_lower(p, g):
        out.append("pigz writes the same gzip every engine pulls: ngcx could push with it (docker save | pigz | "
                   "registry API) without any change on the hosts.")
    return out
