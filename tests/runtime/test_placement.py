"""Where serve puts its instances (runtime/placement.py), and how one batcher feeds them (issue 50, part 3).

What a user notices: on a host with four GPUs, `serve` runs an instance on each of the four without being told
(Triton's KIND_GPU default); --gpus and --instances-per-gpu say otherwise; a GPU that is not there is one line
before listening; CUDA_VISIBLE_DEVICES is read as CUDA reads it; --mps/--processes children share the GPUs out
instead of piling on the first; the default never turns a server that worked into one that fails (a backend that
cannot use a GPU falls back); the batcher hands each batch to the least busy instance, so every GPU works; and
/metrics says so per device (device="cuda:N").

All of it on the CPU: no GPU and no torch here. The engines below are small real classes that record which
batch ran where (the dispatch is what is under test, not a model). GPU proof: tests/gpu/test_multi_gpu_serve.py.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import pytest

from ngcx_runtime import mps
from ngcx_runtime.batching import Batcher, Stats
from ngcx_runtime.engine import TensorSpec
from ngcx_runtime.errors import RuntimeUserError
from ngcx_runtime.metrics import ModelSample, render
from ngcx_runtime.placement import (
    PlacementError,
    Spread,
    describe,
    expand_config,
    gpus_of,
    is_soft,
    load_instances,
    parse_gpus,
    parse_visible,
    place,
    split_for_processes,
    visible_gpu_count,
)

WAIT = 10.0


# -- which GPUs are visible --

@pytest.mark.parametrize(("env", "nvml", "nodes", "seen"), [
    ({}, 4, 4, 4),                                           # docker --gpus all on a g5.12xlarge
    ({}, 1, 1, 1),
    ({}, 0, 0, 0),
    ({}, None, 2, 2),                                        # no NVML library in the container: the device nodes
    ({}, None, 0, None),                                     # nothing tells: the backend's default, as before
    ({"CUDA_VISIBLE_DEVICES": "1,3"}, 4, 4, 2),
    ({"CUDA_VISIBLE_DEVICES": ""}, 4, 4, 0),                 # CUDA: an empty list hides every GPU
    ({"CUDA_VISIBLE_DEVICES": "0,5,1"}, 2, 2, 1),            # CUDA stops at the first index past the last GPU
    ({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, 4, 4, 1),
    ({"CUDA_VISIBLE_DEVICES": "2,2"}, 4, 4, 1),              # a repeat ends the list
    ({"CUDA_VISIBLE_DEVICES": "GPU-8a1b2c3d-aaaa-bbbb-cccc-0123456789ab,MIG-x1"}, 8, 8, 2),
    ({"CUDA_VISIBLE_DEVICES": "0,nope,1"}, 4, 4, 1),
    ({"CUDA_VISIBLE_DEVICES": "7"}, None, 0, 1),             # no NVML to check the index against: CUDA's word
])
def test_visible_gpus_are_what_cuda_would_enumerate(env, nvml, nodes, seen):
    assert visible_gpu_count(env, nvml, nodes) == seen


def test_cuda_visible_devices_parsing_stops_at_the_first_invalid_entry():
    assert parse_visible("0, 1 ,2", 4) == 3
    assert parse_visible("3,0", 4) == 2
    assert parse_visible("4", 4) == 0


# -- where the instances go --

def test_by_default_every_visible_gpu_gets_the_per_gpu_count():
    assert place(1, None, 4) == (0, 1, 2, 3)
    assert place(2, None, 2) == (0, 0, 1, 1)
    assert all(isinstance(d, Spread) for d in place(1, None, 4)), "the default is soft"
    assert describe(place(1, None, 4)) == "4 instances on GPUs 0,1,2,3 (every visible GPU)"


def test_without_a_visible_gpu_the_instances_go_where_they_always_went():
    assert place(1, None, 0) == (None,)
    assert place(3, None, None) == (None, None, None)
    assert describe(place(3, None, None)) == "3 instances on the default device"


def test_explicit_gpus_override_the_default_and_are_not_soft():
    devices = place(2, [0, 2], 4)
    assert devices == (0, 0, 2, 2) and not is_soft(devices)
    assert describe(devices) == "4 instances on GPUs 0,2"
    assert place(1, [3], None) == (3,), "no GPU count known: the backend says whether GPU 3 exists"


def test_a_gpu_that_is_not_visible_is_one_line_before_listening():
    with pytest.raises(PlacementError, match=r"--gpus 0,5: GPU 5 is not visible here \(this process sees GPUs 0-3\)"):
        place(1, [0, 5], 4)
    with pytest.raises(PlacementError, match="sees no GPU"):
        place(1, [0], 0)


@pytest.mark.parametrize(("text", "gpus"), [(None, None), ("all", None), ("ALL", None), ("0,2", [0, 2]), ("3", [3])])
def test_gpus_flag_parses(text, gpus):
    assert parse_gpus(text) == gpus


@pytest.mark.parametrize("text", ["zero", "0,0", "-1", "", "1,,2"])
def test_bad_gpus_flag_is_refused_with_the_fix(text):
    with pytest.raises(PlacementError, match="give distinct GPU indices separated by commas"):
        parse_gpus(text)


def test_instance_counts_are_bounded():
    with pytest.raises(PlacementError, match="must be at least 1"):
        place(0, None, 4)
    with pytest.raises(PlacementError, match="at most 64"):
        place(9, None, 8)


def test_a_config_instance_group_of_kind_auto_spreads_and_explicit_ones_stay():
    assert expand_config((None, None), 2) == (0, 1, 0, 1)           # KIND_AUTO count 2 -> each GPU, twice
    assert expand_config((1, 1, "cpu"), 4) == (1, 1, "cpu")         # KIND_GPU gpus [1], KIND_CPU: as written
    assert expand_config((None,), None) == (None,)                  # no GPU known: the backend's default
    assert expand_config(None, 4) is None
    assert expand_config(("gpu", "gpu"), 2) == (0, 1, 0, 1)         # KIND_GPU count 2, no gpus: every GPU
    assert not is_soft(expand_config(("gpu",), 2)), "KIND_GPU is the config's word, not a default"
    assert expand_config(("gpu",), None) == (0,), "no GPU count known: GPU 0, refused where there is none"


def test_a_kind_gpu_group_without_gpus_reads_as_every_gpu():
    from ngcx_runtime.repository import instance_devices

    assert instance_devices([{"count": 2, "kind": "KIND_GPU"}], "config.json") == ("gpu", "gpu")
    assert instance_devices([{"count": 1, "kind": "KIND_GPU", "gpus": [1]}], "config.json") == (1,)
    assert instance_devices([{"count": 1}], "config.json") == (None,)


# -- several server processes (--mps N / --processes N) --

@pytest.mark.parametrize(("gpus", "n", "shares"), [
    ([0, 1, 2, 3], 4, [[0], [1], [2], [3]]),
    ([0, 1, 2, 3], 8, [[0], [1], [2], [3], [0], [1], [2], [3]]),   # MPS: two processes per GPU
    ([0, 1, 2, 3], 2, [[0, 2], [1, 3]]),
    ([0, 1, 2, 3], 3, [[0, 3], [1], [2]]),
    ([1], 3, [[1], [1], [1]]),
    ([], 2, [[], []]),
])
def test_processes_share_the_gpus_out(gpus, n, shares):
    assert split_for_processes(gpus, n) == shares
    used = {g for share in shares for g in share}
    assert used == set(gpus), "every GPU serves"


def test_the_supervisor_hands_each_child_its_share_and_keeps_the_default_soft():
    soft = argparse.Namespace(devices=place(1, None, 4))
    assert mps.gpu_shares(soft, 2) == [["--spread-gpus", "0,2"], ["--spread-gpus", "1,3"]]
    hard = argparse.Namespace(devices=place(1, [1, 3], 4))
    assert mps.gpu_shares(hard, 2) == [["--gpus", "1"], ["--gpus", "3"]]
    cpu = argparse.Namespace(devices=place(2, None, None))
    assert mps.gpu_shares(cpu, 3) == [[], [], []]
    assert place(1, [0, 2], 4, soft_gpus=True) == (0, 2) and is_soft(place(1, [0, 2], 4, soft_gpus=True))


# -- loading: an explicit placement is the load's; the default falls back --

class Placed:
    """An engine that says where it runs, as the backends' engines do (engine.device)."""

    def __init__(self, device: str):
        self.device = device


def loader(gpu_ok: set[int] | None = None, cpu_only: bool = False):
    calls: list[object] = []

    def load(d):
        calls.append(d)
        if cpu_only:
            if isinstance(d, int):
                raise RuntimeUserError(f"an instance on GPU {int(d)} needs a GPU, and torch sees none here")
            return Placed("cpu")
        if isinstance(d, int) and gpu_ok is not None and int(d) not in gpu_ok:
            raise RuntimeUserError(f"the tensorrt backend runs instances on GPU 0 only, not on {int(d)}")
        return Placed("cuda:0" if d is None else f"cuda:{int(d)}")
    return load, calls


def test_the_default_spread_loads_one_engine_per_gpu():
    load, calls = loader()
    engines = load_instances(load, place(2, None, 3), print)
    assert [e.device for e in engines] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cuda:2", "cuda:2"]
    assert all(type(d) is int for d in calls), "the backends get plain GPU indices, never the mark"
    assert [f"cuda:{d}" for d in place(1, None, 2)] == ["cuda:0", "cuda:1"], "the mark spells as an int"


def test_the_default_spread_keeps_the_gpus_a_backend_can_use_and_says_which_it_cannot():
    load, _ = loader(gpu_ok={0})
    lines: list[str] = []
    engines = load_instances(load, place(2, None, 4), lines.append)
    assert [e.device for e in engines] == ["cuda:0", "cuda:0"]
    assert len(lines) == 3 and all("cannot place an instance on GPU" in line for line in lines), lines


def test_a_backend_without_the_gpu_serves_on_the_cpu_as_before():
    load, calls = loader(cpu_only=True)
    lines: list[str] = []
    engines = load_instances(load, place(2, None, 4), lines.append)
    assert [e.device for e in engines] == ["cpu", "cpu"], "per-GPU count on the default device, not 8 CPU engines"
    assert calls[0] == 0 and calls[1:] == [None, None] and "default device" in lines[0]


def test_an_explicit_placement_that_cannot_load_fails_the_load():
    load, _ = loader(gpu_ok={0})
    with pytest.raises(RuntimeUserError, match="GPU 0 only"):
        load_instances(load, place(1, [0, 1], 4), print)


# -- one batcher, the least busy instance --

class Gated:
    """A pipelined engine (infer_async, as the PyTorch engine on a GPU): its batches finish only when released,
    so the test holds a GPU busy and sees where the next batch goes."""

    name, backend, precision, max_batch = "gated", "pytorch", "fp32", 8
    inputs = [TensorSpec("x", "FP32", (-1, 1))]
    outputs = [TensorSpec("y", "FP32", (-1, 1))]

    def __init__(self, device: str):
        self.device = device
        self.launched: list[float] = []
        self.release = threading.Semaphore(0)

    def infer(self, feeds):
        return {"y": feeds["x"] * 2}

    def infer_async(self, feeds):
        self.launched.append(float(feeds["x"][0, 0]))
        x = feeds["x"].copy()

        def finish():
            assert self.release.acquire(timeout=WAIT), "the test never released this batch"
            return {"y": x * 2}
        return finish


def _submit(batcher: Batcher, value: float, out: dict) -> threading.Thread:
    def go():
        out[value] = batcher.submit({"x": np.full((1, 1), value, np.float32)}, 1)["y"][0, 0]
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_each_batch_goes_to_the_least_busy_instance():
    """GPU 0's instance is pipelined: free to take another batch while its first computes. The next batch must
    still go to GPU 1, which has none, and the third to whichever has fewer in flight."""
    a, b = Gated("cuda:0"), Gated("cuda:1")
    stats = Stats()
    batcher = Batcher([a, b], 8, 0.0, stats, True, "gated")
    out: dict = {}
    try:
        threads = [_submit(batcher, 1.0, out)]
        _until(lambda: a.launched == [1.0], "the first batch runs on GPU 0 (lowest index on a tie)")
        threads.append(_submit(batcher, 2.0, out))
        _until(lambda: b.launched == [2.0], "the second batch goes to the idle GPU 1, not to busy GPU 0")
        assert a.launched == [1.0]
        a.release.release()                         # GPU 0 answers: it is the less busy one now
        _until(lambda: 1.0 in out, "GPU 0's answer arrives")
        threads.append(_submit(batcher, 3.0, out))
        _until(lambda: a.launched == [1.0, 3.0], "the third batch goes to GPU 0 (0 in flight against 1)")
        a.release.release()
        b.release.release()
        for t in threads:
            t.join(WAIT)
        assert out == {1.0: 2.0, 2.0: 4.0, 3.0: 6.0}
        devices = stats.snapshot()["devices"]
        assert {d: row["engine_calls"] for d, row in devices.items()} == {"cuda:0": 2, "cuda:1": 1}
        assert batcher.busy() == {"cuda:0": 0, "cuda:1": 0}
    finally:
        for engine in (a, b):
            for _ in range(4):
                engine.release.release()
        batcher.stop(WAIT)


def test_a_steady_load_is_spread_over_every_instance():
    """Four instances on four 'GPUs', 64 concurrent requests: every device runs batches, and every answer is
    the request's own."""
    class Quick(Gated):
        def infer_async(self, feeds):
            self.launched.append(float(feeds["x"][0, 0]))
            x = feeds["x"].copy()

            def finish():
                time.sleep(0.01)                     # a GPU's compute time, while the others take batches
                return {"y": x * 2}
            return finish

    engines = [Quick(f"cuda:{i}") for i in range(4)]
    stats = Stats()
    batcher = Batcher(engines, 4, 1.0, stats, True, "quick")
    out: dict = {}
    try:
        threads = [_submit(batcher, float(v), out) for v in range(64)]
        for t in threads:
            t.join(WAIT)
        assert out == {float(v): 2.0 * v for v in range(64)}
        calls = {d: row["engine_calls"] for d, row in stats.snapshot()["devices"].items()}
        assert set(calls) == {"cuda:0", "cuda:1", "cuda:2", "cuda:3"} and min(calls.values()) >= 2, calls
    finally:
        batcher.stop(WAIT)


def test_metrics_carry_a_device_label_per_gpu():
    from prometheus_client import parser

    stats = {"success": 3, "devices": {"cuda:0": {"engine_calls": 2, "inferences": 5, "compute_ns": 4_000},
                                       "cuda:1": {"engine_calls": 1, "inferences": 3, "compute_ns": 2_000}}}
    text = render([ModelSample("resnet", "1", stats, 0, {"cuda:0": 1, "cuda:1": 0})])
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    calls = {s.labels["device"]: s.value for s in fams["nv_inference_instance_exec_count"].samples}
    assert calls == {"cuda:0": 2, "cuda:1": 1}
    count = {s.labels["device"]: s.value for s in fams["nv_inference_instance_count"].samples}
    assert count == {"cuda:0": 5, "cuda:1": 3}
    busy = {s.labels["device"]: s.value for s in fams["nv_inference_instance_batches_in_flight"].samples}
    assert busy == {"cuda:0": 1, "cuda:1": 0}
    assert all(s.labels["model"] == "resnet" for s in fams["nv_inference_instance_compute_duration_us"].samples)


def test_gpus_of_lists_each_gpu_once_in_order():
    assert gpus_of((Spread(2), Spread(2), 0, "cpu", None)) == [2, 0]


# -- the command, end to end on this CPU host (CUDA_VISIBLE_DEVICES makes it count GPUs it does not have) --

def _serve(tmp_path, env_gpus: str, *flags: str, wait_for: str = "serving model 'm'"):
    import os
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import models

    pytest.importorskip("onnxruntime")
    path = models.mlp(tmp_path / "m.onnx")
    env = {k: v for k, v in os.environ.items() if k != "NGCX_RUNTIME_MPS"}
    env.update(CUDA_VISIBLE_DEVICES=env_gpus, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "ngcx_runtime.serve", str(path), "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if wait_for in line:
                break
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    return proc.returncode, lines, err


def test_a_default_spread_the_backend_cannot_place_still_serves(tmp_path):
    """Four 'visible' GPUs and no GPU for the backend: the default does not fail the load, it serves on the
    default device with the per-GPU count and says why, where an explicit --gpus would have failed."""
    code, lines, err = _serve(tmp_path, "0,1,2,3", "--instances-per-gpu", "2")
    ready = [line for line in lines if "serving model 'm'" in line]
    assert ready and "2 instances on cpu" in ready[0], (lines, err)
    assert any("cannot place an instance on GPU 0" in line for line in lines), lines


def test_a_named_gpu_past_the_visible_ones_is_one_line_and_nothing_starts(tmp_path):
    code, lines, err = _serve(tmp_path, "0,1", "--gpus", "0,5")
    assert code == 2 and lines == [], lines
    assert err.strip().splitlines() == ["ngcx-runtime serve: error: --gpus 0,5: GPU 5 is not visible here (this "
                                        "process sees GPUs 0-1); drop --gpus to serve on every visible GPU"]
