#!/usr/bin/env bash
# Set up a Debian bookworm machine for ngcx development and CI. Idempotent: run it again any time.
#
#   1. apt packages: Docker Engine (docker.io), a real OCI registry (docker-registry),
#      debootstrap (offline base images), apache2-utils (htpasswd for the auth-registry tests),
#      haproxy (the data plane of the emulated load balancers; its system service is stopped and disabled),
#      chromium (the headless browser the `ngcx dashboard` tests drive with playwright)
#   2. dockerd running (started in the background when `docker info` fails; no systemd needed)
#   3. an unauthenticated registry on 127.0.0.1:5000 (own config + storage + log)
#   4. the repo's virtualenv .venv with ngcx installed editable plus test deps
#   5. the offline base image ngcx/base:bookworm (ngcx base bootstrap), unless present
#
# Environment: NGCX_SKIP_APT=1 skips step 1 (no root/apt), NGCX_REGISTRY_PORT (default 5000),
# NGCX_BASE_MIRROR (default http://deb.debian.org/debian), PYTHON (default python3).
# Prints no secrets: nothing here handles any.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

REGISTRY_PORT="${NGCX_REGISTRY_PORT:-5000}"
REGISTRY_ADDR="127.0.0.1:${REGISTRY_PORT}"
REGISTRY_DIR="/var/lib/ngcx-registry"
REGISTRY_CONFIG="${REGISTRY_DIR}/config.yml"
REGISTRY_LOG="/var/log/ngcx-registry.log"
DOCKERD_LOG="/var/log/ngcx-dockerd.log"
BASE_TAG="ngcx/base:bookworm"
BASE_MIRROR="${NGCX_BASE_MIRROR:-http://deb.debian.org/debian}"
PYTHON="${PYTHON:-python3}"

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        die "need root for: $* (run as root or install sudo)"; fi
}

install_packages() {
    if [ "${NGCX_SKIP_APT:-0}" = 1 ]; then say "NGCX_SKIP_APT=1: not installing apt packages"; return; fi
    local pkgs=(docker.io docker-registry debootstrap apache2-utils ca-certificates curl
                python3 python3-venv python3-pip tar haproxy chromium)
    local missing=()
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -eq 0 ]; then say "apt packages present"; return; fi
    say "installing: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# The haproxy package enables (and, where services may start, starts) a system haproxy service; the
# tests' balancer plane (tests/emulators/balancer_plane.py) runs its own haproxy processes instead.
stop_system_haproxy() {
    if [ "${NGCX_SKIP_APT:-0}" = 1 ] || ! command -v haproxy >/dev/null; then return; fi
    if command -v systemctl >/dev/null; then
        as_root systemctl disable haproxy >/dev/null 2>&1 || true
        if [ -d /run/systemd/system ]; then as_root systemctl stop haproxy >/dev/null 2>&1 || true; fi
    fi
    if [ -f /run/haproxy.pid ]; then
        as_root service haproxy stop >/dev/null 2>&1 || as_root kill "$(cat /run/haproxy.pid)" 2>/dev/null || true
    fi
}

# The Debian docker.io CLI drives BuildKit itself; a newer CLI earlier on PATH would want buildx.
docker_cli() { if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker; fi; }

start_dockerd() {
    local docker; docker="$(docker_cli)" || die "no docker CLI after installing docker.io"
    if "$docker" info >/dev/null 2>&1; then say "Docker Engine running"; return; fi
    command -v dockerd >/dev/null || die "dockerd not found (apt-get install docker.io)"
    say "starting dockerd (log: $DOCKERD_LOG)"
    as_root bash -c "nohup dockerd >>'$DOCKERD_LOG' 2>&1 </dev/null &"
    for _ in $(seq 1 60); do
        if "$docker" info >/dev/null 2>&1; then say "Docker Engine up"; return; fi
        sleep 1
    done
    tail -n 20 "$DOCKERD_LOG" >&2 || true
    die "dockerd did not answer 'docker info' within 60 s (see $DOCKERD_LOG)"
}

registry_answers() { curl -fs -o /dev/null --max-time 3 "http://${REGISTRY_ADDR}/v2/"; }

start_registry() {
    if registry_answers; then say "registry answering on http://${REGISTRY_ADDR}/v2/"; return; fi
    command -v docker-registry >/dev/null || die "docker-registry not found (apt-get install docker-registry)"
    as_root mkdir -p "$REGISTRY_DIR/storage"
    as_root tee "$REGISTRY_CONFIG" >/dev/null <<EOF
# Written by ngcx scripts/setup.sh: loopback registry without auth, for development and CI.
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: ${REGISTRY_DIR}/storage
  delete:
    enabled: true
http:
  addr: ${REGISTRY_ADDR}
  headers:
    X-Content-Type-Options: [nosniff]
EOF
    say "starting docker-registry on ${REGISTRY_ADDR} (log: $REGISTRY_LOG)"
    as_root bash -c "nohup docker-registry serve '$REGISTRY_CONFIG' >>'$REGISTRY_LOG' 2>&1 </dev/null &"
    for _ in $(seq 1 30); do
        if registry_answers; then say "registry up"; return; fi
        sleep 1
    done
    tail -n 20 "$REGISTRY_LOG" >&2 || true
    die "registry did not answer http://${REGISTRY_ADDR}/v2/ within 30 s (see $REGISTRY_LOG)"
}

make_venv() {
    if [ ! -x .venv/bin/python ]; then
        say "creating .venv"
        "$PYTHON" -m venv .venv
    fi
    say "installing ngcx (editable) with test deps into .venv"
    local log=.venv/pip-install.log
    if ! { .venv/bin/python -m pip install -q --upgrade pip &&
           .venv/bin/python -m pip install -q -e '.[test]'; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "pip install failed (full log: $REPO_ROOT/$log)"
    fi
}

bootstrap_base() {
    local docker; docker="$(docker_cli)"
    if "$docker" image inspect "$BASE_TAG" >/dev/null 2>&1; then say "$BASE_TAG present"; return; fi
    # shellcheck disable=SC2001  # strip user:password@ from the mirror URL before printing it
    say "bootstrapping $BASE_TAG from $(sed 's#//[^/@]*@#//#' <<<"$BASE_MIRROR") (about 30 s)"
    as_root "$REPO_ROOT/.venv/bin/ngcx" base bootstrap --suite bookworm --mirror "$BASE_MIRROR" --tag "$BASE_TAG"
}

install_packages
stop_system_haproxy
start_dockerd
start_registry
make_venv
bootstrap_base
say "done: engine, registry http://${REGISTRY_ADDR}, .venv, $BASE_TAG"
