#!/bin/bash
# The "init" of an emulated ECS instance (a container of tests/emulators/host/Dockerfile, under tini).
#
# What a VM with Docker does at boot, in order: start the Docker Engine on the machine's disk
# (/var/lib/docker, a volume kept across stop/start), wait until it answers, then do cloud-init's
# job: run the instance's user-data once per instance, its output on the console (this container's
# stdout) and in /var/log/cloud-init-output.log. Then stay up as long as dockerd does; SIGTERM
# (`docker stop`, the VM's shutdown) goes to dockerd, which stops its containers cleanly, and
# `--restart unless-stopped` containers come back on the next boot, as on a real VM.
#
# Lines of our own start with "ngcx-host: " (tests and the emulator wait on them); user-data output
# is printed raw. Environment: NGCX_INSTANCE_ID (set by DockerHosts), NGCX_DOCKERD_WAIT (seconds,
# default 60), NGCX_METADATA_ROUTES (space-separated ADDRESS:PORT=TARGET:PORT: the cloud's metadata
# address, e.g. 100.100.100.200:80, and where the emulator serves it).
set -u

CLOUD_DIR=/var/lib/cloud
USER_DATA=$CLOUD_DIR/user-data
DONE=$CLOUD_DIR/instance-done
CLOUD_LOG=/var/log/cloud-init-output.log
DOCKERD_LOG=/var/log/dockerd.log
SOCKET=/run/docker.sock
INSTANCE_ID=${NGCX_INSTANCE_ID:-unknown}
DOCKERD_WAIT=${NGCX_DOCKERD_WAIT:-60}
BOOT_START=$EPOCHREALTIME

dockerd_pid=
idle_pid=
user_data_pid=
stopping=0

say() { printf 'ngcx-host: %s\n' "$*"; }

since_boot() { awk -v a="$BOOT_START" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

# shellcheck disable=SC2329  # called by the trap below
on_term() {
    # Trapped, because signals without a handler never reach PID-1-like processes; a VM's shutdown
    # stops the engine (and so its containers) before the power goes.
    stopping=1
    say "shutting down"
    [ -n "$dockerd_pid" ] && kill -TERM "$dockerd_pid" 2>/dev/null
    [ -n "$idle_pid" ] && kill -TERM "$idle_pid" 2>/dev/null
    # A shutdown ends a running user-data too (what is left of it dies with this container).
    [ -n "$user_data_pid" ] && kill -TERM "$user_data_pid" 2>/dev/null
    return 0
}
trap on_term TERM INT

wait_child() {
    # `wait` returns early when a trapped signal arrives; keep waiting until the child is really gone,
    # then return its own exit status (bash remembers it for a reaped background job).
    local pid=$1
    while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done
    wait "$pid"
}

clean_run_state() {
    # /run is not a tmpfs in a container: last boot's pid files and sockets survive `docker stop`.
    # A stale docker.pid stops dockerd from starting, and a stale containerd.pid naming a pid that
    # is alive in this boot (pids restart at 1) makes dockerd wait on the wrong process.
    rm -rf /run/docker /run/docker.pid /run/docker.sock /run/containerd
}

cgroup_parent() {
    # The host's cgroup (v1) tree is bind-mounted here; by default the inner containers would land
    # beside the host's own containers. Nesting them under this machine's cgroup makes its memory
    # limit and `docker pause` (a consistent snapshot) cover them too. On cgroup v2, leave the default.
    local path
    path=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3; exit }' /proc/self/cgroup)
    if [ -n "$path" ] && [ "$path" != / ]; then printf '%s/ngcx-vm' "$path"; fi
}

start_dockerd() {
    # Start dockerd with storage driver $1; 0 once it answers, 1 when it died or never answered.
    local driver=$1 parent deadline
    parent=$(cgroup_parent)
    say "starting dockerd (storage driver $driver)"
    dockerd --storage-driver "$driver" ${parent:+--cgroup-parent "$parent"} \
        >>"$DOCKERD_LOG" 2>&1 </dev/null &
    dockerd_pid=$!
    deadline=$(( ${EPOCHREALTIME%.*} + DOCKERD_WAIT ))
    while [ "${EPOCHREALTIME%.*}" -lt "$deadline" ] && [ "$stopping" = 0 ]; do
        if ! kill -0 "$dockerd_pid" 2>/dev/null; then
            wait_child "$dockerd_pid"
            say "dockerd ($driver) exited $?"
            dockerd_pid=
            return 1
        fi
        if curl -fs -o /dev/null --max-time 2 --unix-socket "$SOCKET" http://docker/_ping \
                && docker info >/dev/null 2>&1; then
            say "dockerd up (storage driver $driver) $(since_boot) s after boot"
            return 0
        fi
        sleep 0.1
    done
    say "dockerd ($driver) did not answer within ${DOCKERD_WAIT} s"
    return 1
}

start_engine() {
    # overlay2 where the kernel allows it on this disk; else vfs (slow, but works anywhere). A disk
    # that already holds vfs data (an earlier fallback) keeps vfs, or its images would vanish.
    local drivers="overlay2 vfs"
    if [ -d /var/lib/docker/vfs ] && [ ! -d /var/lib/docker/overlay2 ]; then drivers=vfs; fi
    for driver in $drivers; do
        start_dockerd "$driver" && return 0
        [ "$stopping" = 1 ] && return 1
        if [ -n "$dockerd_pid" ]; then kill -TERM "$dockerd_pid" 2>/dev/null; wait_child "$dockerd_pid"; fi
        dockerd_pid=
    done
    say "dockerd did not start; last lines of $DOCKERD_LOG:"
    tail -n 15 "$DOCKERD_LOG"
    return 1
}

run_user_data() {
    # cloud-init's scripts-user, once per instance: the marker names the instance it ran for, so a
    # machine made from a snapshot of another instance runs its own user-data. The marker is written
    # BEFORE the script runs (cloud-init takes its semaphore first), so a failed or interrupted run
    # is never repeated on a later boot.
    if [ ! -s "$USER_DATA" ]; then say "no user-data"; return 0; fi
    if [ -f "$DONE" ] && [ "$(cat "$DONE")" = "$INSTANCE_ID" ]; then
        say "user-data already ran on this instance; not again"
        return 0
    fi
    printf '%s\n' "$INSTANCE_ID" >"$DONE"
    chmod 0700 "$USER_DATA"
    local runner=(sh "$USER_DATA")
    if [ "$(head -c 2 "$USER_DATA")" = '#!' ]; then runner=("$USER_DATA"); fi
    say "running user-data"
    ( set -o pipefail; cd / && HOME=/root "${runner[@]}" </dev/null 2>&1 | tee -a "$CLOUD_LOG" ) &
    user_data_pid=$!
    wait_child "$user_data_pid"
    local rc=$?
    user_data_pid=
    say "user-data exited $rc"
}

route_metadata() {
    # The cloud's metadata service at the address it has on the cloud (ECS 100.100.100.200, EC2
    # 169.254.169.254): DNAT to the emulator's server on the bridge gateway, so software on the machine
    # calls the real address and the emulator sees the machine's own IP (which instance is asking).
    # Every boot: a started container gets a fresh network namespace.
    local route from to
    for route in ${NGCX_METADATA_ROUTES:-}; do
        from=${route%%=*}; to=${route#*=}
        set -- -t nat -p tcp -d "${from%:*}" --dport "${from##*:}" -j DNAT --to-destination "$to"
        iptables -C OUTPUT "$@" 2>/dev/null || iptables -A OUTPUT "$@" || say "could not route metadata $from"
    done
}

idle() {
    # Keep the machine on (console and Cloud Assistant still work) when the engine is gone.
    sleep infinity &
    idle_pid=$!
    wait_child "$idle_pid"
}

say "booting $INSTANCE_ID"
clean_run_state
route_metadata
mkdir -p "$CLOUD_DIR" /var/log
if start_engine; then engine_up=1; else engine_up=0; fi
[ "$stopping" = 1 ] && exit 0
run_user_data
if [ "$engine_up" = 1 ]; then
    wait_child "$dockerd_pid"
    rc=$?
    [ "$stopping" = 1 ] && { say "dockerd stopped"; exit 0; }
    say "dockerd exited $rc unexpectedly (see $DOCKERD_LOG)"
fi
[ "$stopping" = 1 ] && exit 0
idle
exit 0
