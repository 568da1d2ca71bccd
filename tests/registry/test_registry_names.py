"""Registry addresses and image references as users type them -> what ngcx talks to and stores."""

from __future__ import annotations

import pytest

from ngcx.build.base import check_inputs, public_url
from ngcx.core.errors import UserError
from ngcx.registry.api import registry_base_url, split_registry
from ngcx.registry.login import DOCKER_HUB_KEY, normalize_registry
from ngcx.workstation.host import _direct


@pytest.mark.parametrize(("typed", "host", "namespace"), [
    ("127.0.0.1:5000", "127.0.0.1:5000", ""),
    ("127.0.0.1:5000/team/", "127.0.0.1:5000", "team"),
    ("https://registry.cn-hangzhou.aliyuncs.com/ml/prod", "registry.cn-hangzhou.aliyuncs.com", "ml/prod"),
])
def test_split_registry(typed, host, namespace):
    assert split_registry(typed) == (host, namespace)


def test_split_registry_rejects_empty():
    with pytest.raises(UserError):
        split_registry("https:///")


def test_loopback_is_plain_http_others_https(monkeypatch):
    assert registry_base_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert registry_base_url("localhost:5001") == "http://localhost:5001"
    assert registry_base_url("123456789.dkr.ecr.us-east-1.amazonaws.com") == \
        "https://123456789.dkr.ecr.us-east-1.amazonaws.com"
    assert registry_base_url("docker.io") == "https://registry-1.docker.io"
    monkeypatch.setenv("NGCX_INSECURE_REGISTRIES", "lab-registry:5000")
    assert registry_base_url("lab-registry:5000") == "http://lab-registry:5000"


def test_login_keys_match_docker_login():
    assert normalize_registry("https://127.0.0.1:5000/v2/") == "127.0.0.1:5000"
    assert normalize_registry("docker.io") == DOCKER_HUB_KEY
    assert normalize_registry("index.docker.io") == DOCKER_HUB_KEY


def test_local_reference_maps_to_remote_name_and_tag():
    assert _direct("ngcx/base:bookworm") == ("ngcx/base:bookworm", "base", "bookworm")
    assert _direct("127.0.0.1:5000/x/y") == ("127.0.0.1:5000/x/y", "y", "latest")


def test_mirror_credentials_never_shown():
    assert public_url("http://bob:hunter2@mirror.corp:8080/debian") == "http://mirror.corp:8080/debian"
    assert public_url("http://deb.debian.org/debian") == "http://deb.debian.org/debian"


@pytest.mark.parametrize(("args", "needle"), [
    (("bookworm", "ftp://mirror/debian", "ngcx/base:bookworm", "minbase"), "--mirror"),
    (("bookworm", "http://deb.debian.org/debian", "NoTag", "minbase"), "--tag"),
    (("bookworm", "http://deb.debian.org/debian", "ngcx/base:bookworm", "huge"), "--variant"),
    (("../etc", "http://deb.debian.org/debian", "ngcx/base:bookworm", "minbase"), "suite"),
])
def test_bootstrap_inputs_refused_before_any_work(args, needle):
    import os
    import shutil

    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        pytest.skip("input checks run after the root/debootstrap checks; needs root + debootstrap")
    with pytest.raises(UserError, match=needle.replace("-", r"\-")):
        check_inputs(*args)


def test_finished_rootfs_has_no_mirror_credentials_caches_or_docs(tmp_path):
    """What goes into the image layer: sources.list without user:password, no .debs, slim docs."""
    from ngcx.build.base import finish_rootfs

    mirror = "http://bob:hunter2@mirror.corp/debian"
    root = tmp_path / "rootfs"
    for rel, text in {"etc/apt/sources.list": f"deb {mirror} bookworm main\n",
                      "var/cache/apt/archives/bash_5.2_amd64.deb": "x",
                      "var/lib/apt/lists/deb.debian.org_dists_bookworm_Release": "x",
                      "usr/share/doc/bash/copyright": "GPL", "usr/share/doc/bash/README": "x",
                      "usr/share/man/man1/bash.1.gz": "x", "usr/share/locale/de/LC_MESSAGES/x.mo": "x",
                      "usr/share/locale/locale.alias": "x"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    finish_rootfs(root, slim=True, mirror=mirror)
    assert (root / "etc/apt/sources.list").read_text() == "deb http://mirror.corp/debian bookworm main\n"
    remaining = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert remaining == ["etc/apt/apt.conf.d/docker-clean", "etc/apt/sources.list",
                         "etc/dpkg/dpkg.cfg.d/docker", "usr/share/doc/bash/copyright",
                         "usr/share/locale/locale.alias"]
    assert "hunter2" not in "".join(p.read_text() for p in root.rglob("*") if p.is_file())
