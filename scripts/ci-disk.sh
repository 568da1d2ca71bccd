#!/usr/bin/env bash
# Make room on Docker's disk before the test suite, and say how much there is.
#
# Why: the suite builds the CI matrix's images, pushes them, and boots emulated cloud hosts that each
# pull a 3.9 GB project image into a disk of their own (tests/emulators/docker_hosts.py); a cold run
# on a fresh machine peaked at 34 GB above its start (df sampled every 10 s over `bash .ci/run`,
# 2026-11-22). A machine that kept earlier runs' build cache, images and host disks can have less
# than that left, and the suite then fails late with "no space left on device" in whichever test
# was writing (a CI run on 2026-11-22 lost 11 tests so). This script reclaims space step by step,
# cheapest loss first, and stops as soon as NGCX_CI_NEED_GB (default 45) are free:
#   1. stopped containers and the volumes nothing uses (earlier runs' host disks),
#   2. BuildKit's build cache (the next build downloads its wheels again),
#   3. every image but the offline base (images are rebuilt from the recipes as tests need them).
# Only Docker's own data is touched; the registry's storage and the repository are left alone.
set -euo pipefail

NEED_GB="${NGCX_CI_NEED_GB:-45}"
BASE_TAG="ngcx/base:bookworm"
DOCKER="$(if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker; fi)"

say() { printf '[ci-disk] %s\n' "$*"; }

free_gb() {
    local root; root="$("$DOCKER" info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)"
    df -BG --output=avail "$root" | tail -n 1 | tr -dc '0-9'
}

images_but_base() {
    # Tagged images by name (untagging a name that shares the base's id leaves the base), untagged by id.
    "$DOCKER" images --format '{{.Repository}}:{{.Tag}} {{.ID}}' | while read -r ref id; do
        case "$ref" in
            "$BASE_TAG") ;;
            "<none>:<none>") echo "$id" ;;
            *) echo "$ref" ;;
        esac
    done
}

reclaim() {
    case "$1" in
        1) "$DOCKER" container prune -f >/dev/null && "$DOCKER" volume prune -f >/dev/null ;;
        2) "$DOCKER" builder prune -af >/dev/null ;;
        3) images_but_base | xargs -r "$DOCKER" rmi -f >/dev/null 2>&1 || true
           "$DOCKER" image prune -f >/dev/null ;;
    esac
}

names=("" "stopped containers and unused volumes" "the build cache" "images other than $BASE_TAG")
free="$(free_gb)"
say "${free} GB free on Docker's disk; the suite needs about ${NEED_GB} GB (NGCX_CI_NEED_GB)"
for step in 1 2 3; do
    [ "$free" -ge "$NEED_GB" ] && exit 0
    reclaim "$step"
    free="$(free_gb)"
    say "removed ${names[$step]}: ${free} GB free"
done
if [ "$free" -lt "$NEED_GB" ]; then
    say "WARNING: only ${free} GB free after reclaiming Docker's space; tests that write images may fail with 'no space left on device'"
fi
