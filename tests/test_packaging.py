"""An installed wheel (not the checkout) still finds registry.yaml, images/, recipes/ and runtime/.

Builds the real wheel with pip, installs it into a temp folder, and runs `ngcx` from outside the
repository with that folder first on the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(out), str(REPO)], check=True, capture_output=True)
    wheel = next(out.glob("ngcx-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "ngcx/_data/registry.yaml" in names
    assert "ngcx/_data/recipes/Dockerfile.j2" in names
    assert "ngcx/_data/recipes/deploy/role_login.py" in names            # cloud hosts run it to log in
    assert "ngcx/_data/recipes/deploy/balancer/haproxy.cfg.j2" in names  # --cloud local services' balancer
    assert "ngcx/_data/recipes/deploy/kubernetes/deployment.yaml.j2" in names  # --cloud kubernetes manifests
    assert "ngcx/deploy/kubernetes/nodes.yaml" in names                       # their node labels per GPU kind
    assert {"ngcx/deploy/aliyun/offers.yaml", "ngcx/deploy/aws/offers.yaml"} <= set(names)  # instance types
    assert "ngcx/dashboard/static/favicon.svg" in names                       # no page logs a 404 for its icon
    assert "ngcx/clouds/aliyun_models.yaml" in names                          # every Alibaba request is checked
    assert "ngcx/_data/images/pytorch/image.yaml" in names
    assert any(n.startswith("ngcx/_data/images/cuda/tests/") for n in names)
    assert "ngcx_runtime/cli.py" in names
    assert {"ngcx/catalog/registry.seed", "ngcx/render/recipes.seed", "ngcx/render/dockerfiles.seed",
            "ngcx/render/compiled/cuda_j2.py"} <= set(names)
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    return target


def _ngcx(installed: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    env.pop("NGCX_DATA_DIR", None)
    return subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_installed_wheel_uses_its_own_data(installed, tmp_path):
    where = subprocess.run([sys.executable, "-c", "import ngcx.core.paths as p; print(p.registry_file())"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(installed)}).stdout.strip()
    assert where.startswith(str(installed)) and where.endswith("ngcx/_data/registry.yaml")
    check = _ngcx(installed, "catalog", "check", cwd=tmp_path)
    assert check.returncode == 0 and "all compatibility rules hold" in check.stdout


def test_installed_wheel_renders_a_full_context(installed, tmp_path):
    result = _ngcx(installed, "render", "pytorch:24.11", "--context", str(tmp_path / "ctx"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "torch==2.5.1" in (tmp_path / "ctx" / "Dockerfile").read_text()
    assert (tmp_path / "ctx" / "ngcx-runtime" / "ngcx_runtime" / "cli.py").is_file()
    assert (tmp_path / "ctx" / "tests").is_dir()


def test_installed_wheel_renders_cold_from_what_it_ships(installed, tmp_path):
    """A first render from the wheel (empty cache) uses its seeds and compiled recipes: no validator, no YAML,
    no template compiled (cli/catalog/cache.py, cli/render/recipe.py, cli/render/precompiled.py)."""
    probe = ("import sys, jinja2; compiled = []; orig = jinja2.Environment.compile\n"
             "jinja2.Environment.compile = lambda self, *a, **k: compiled.append(a[1]) or orig(self, *a, **k)\n"
             "import ngcx.main\ntry: ngcx.main.main(['render', 'pytorch:24.11'])\nexcept SystemExit: pass\n"
             "print(sorted({'pydantic_core', 'yaml'} & set(sys.modules)), compiled, file=sys.stderr)")
    env = {**os.environ, "PYTHONPATH": str(installed), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("NGCX_DATA_DIR", None)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "torch==2.5.1" in proc.stdout, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "[] []"
