"""Image size: ngcx's images vs a naive one-stage Dockerfile with the same pins on the same base.

Why: ngcx's recipes claim to be slim (venv, no pip cache in layers, no headers/static libs in
the runtime variant, apt without recommends). This measures that claim against what people
usually write (bench/naive/IMAGE.Dockerfile), built here for real with BuildKit.

Usage: python bench/image_sizes.py [--out bench/results/image_sizes.md] [--keep] [IMAGE ...]
Each naive Dockerfile's first line names the ngcx release it mirrors (`# ngcx-release: X:Y`);
an image whose ngcx build is not present locally is listed as such, not guessed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAIVE_DIR = ROOT / "bench" / "naive"


def release_of(dockerfile: Path) -> str:
    """The ngcx release a naive Dockerfile mirrors, from its `# ngcx-release: X:Y` first line."""
    first = dockerfile.read_text().splitlines()[0]
    if not first.startswith("# ngcx-release:"):
        sys.exit(f"{dockerfile}: first line must be '# ngcx-release: IMAGE:RELEASE'")
    return first.removeprefix("# ngcx-release:").split()[0]


def image_size(tag: str) -> int | None:
    """Bytes of a local image (docker's uncompressed size), None when it is not there."""
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", tag],
                          capture_output=True, text=True)
    return int(proc.stdout.strip()) if proc.returncode == 0 else None


def ca_bundle() -> str:
    """The CA the proxy re-signs with: only a BuildKit secret, never in a layer."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return os.environ[var]
    return "/etc/ssl/certs/ca-certificates.crt"


def build_naive(dockerfile: Path, tag: str, ref: str) -> float:
    """Build with BuildKit in the build context ngcx renders for `ref` (ngcx-runtime/, tests/: the
    app the naive Dockerfile copies in); seconds taken."""
    from ngcx.engine import docker_cli  # the CLI that drives BuildKit without buildx

    cli = docker_cli()
    if cli is None:
        sys.exit("no docker CLI able to build with BuildKit (see `ngcx doctor`)")
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp) / "context"
        ngcx = Path(sys.executable).parent / "ngcx"
        subprocess.run([str(ngcx), "render", ref, "--base", "offline", "--context", str(ctx)],
                       check=True, capture_output=True, text=True)
        (ctx / "Dockerfile").unlink()  # not part of the app: the naive COPY . must not see ngcx's file
        started = time.monotonic()
        proc = subprocess.run(
            [cli, "build", "--progress", "plain", "--secret", f"id=ca,src={ca_bundle()}",
             "-f", str(dockerfile), "-t", tag, str(ctx)],
            env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"naive build of {dockerfile.name} failed:\n{proc.stderr[-2000:]}")
    return time.monotonic() - started


def gb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def measure(names: list[str], keep: bool) -> list[dict]:
    rows = []
    for dockerfile in sorted(NAIVE_DIR.glob("*.Dockerfile")):
        name = dockerfile.name.removesuffix(".Dockerfile")
        if names and name not in names:
            continue
        ref = release_of(dockerfile)
        ngcx_tag = f"ngcx/{ref}-runtime"
        ours = image_size(ngcx_tag)
        if ours is None:
            rows.append({"ref": ref, "ngcx": None, "naive": None, "note": f"{ngcx_tag} not built here"})
            continue
        naive_tag = f"ngcx-naive/{name}:{ref.split(':')[1]}"
        print(f"building {naive_tag} from {dockerfile.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
        seconds = build_naive(dockerfile, naive_tag, ref)
        rows.append({"ref": ref, "ngcx": ours, "naive": image_size(naive_tag),
                     "note": f"naive build {seconds:.0f}s"})
        if not keep:
            subprocess.run(["docker", "rmi", naive_tag], capture_output=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| image | ngcx size | naive size | difference | note |", "|---|---:|---:|---:|---|"]
    for r in rows:
        if r["ngcx"] is None or r["naive"] is None:
            diff = "-"
        else:
            d = r["naive"] - r["ngcx"]
            diff = f"{d / 1e9:+.2f} GB ({d / r['naive'] * 100:+.0f}% of naive saved)" if d >= 0 else \
                f"{d / 1e9:+.2f} GB (ngcx larger)"
        lines.append(f"| {r['ref']} | {gb(r['ngcx'])} | {gb(r['naive'])} | {diff} | {r['note']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="*", help="naive Dockerfiles to build (default: all)")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    parser.add_argument("--keep", action="store_true", help="keep the naive images (default: removed)")
    args = parser.parse_args()
    text = table(measure(args.images, args.keep))
    print(text)
    if args.out:
        header = ("# Image sizes: ngcx vs a naive one-stage Dockerfile\n\n"
                  "Same base (ngcx/base:bookworm), same pins; sizes are `docker image inspect .Size` "
                  "(uncompressed). Naive Dockerfiles: bench/naive/. Command: "
                  "`python bench/image_sizes.py --out bench/results/image_sizes.md`\n\n")
        args.out.write_text(header + text + "\n")


if __name__ == "__main__":
    main()
