"""The two example projects, for real: export -> ngcx build -> ngcx test -> ngcx run -> a client's inference.

What a user notices (issue 9, "Done when"): in examples/resnet-classifier an image's bytes go in
and its top-5 labels come out, through curl and through stock tritonclient, from the image that
`ngcx run` serves on localhost; examples/onnx-zero-code serves FP16 and INT8 (calibrated) plans
with no code at all; `ngcx init` turns the exported model into a project that builds and tests;
and Ctrl-C (SIGTERM) on `ngcx run` leaves no container behind. Everything is built on the real
engine FROM the CI matrix's onnxruntime:25.08 image (built by test_images.py, or here if absent).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ngcx.core.engine import containers
from ngcx.project.serving import free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 1200


def ngcx(cwd: Path, *args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ngcx", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NGCX_BASE": "offline"})
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def exported(tmp_path_factory, name: str) -> Path:
    """A copy of examples/NAME with its model exported by the example's own script."""
    root = tmp_path_factory.mktemp("examples") / name
    shutil.copytree(REPO / "examples" / name, root, ignore=shutil.ignore_patterns("model", "calib.npz"))
    done = subprocess.run([sys.executable, "export.py"], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return root


@pytest.fixture(scope="module")
def resnet(base_image, tmp_path_factory) -> Path:
    root = exported(tmp_path_factory, "resnet-classifier")
    built = ngcx(root, "build", "--progress", "plain")
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    return root


@pytest.fixture(scope="module")
def zero_code(base_image, tmp_path_factory) -> Path:
    return exported(tmp_path_factory, "onnx-zero-code")


def passed_test(root: Path, *args: str) -> dict:
    """`ngcx test --json` in root: every check passed or was skipped with its reason."""
    done = ngcx(root, "test", "--json", *args)
    report = json.loads(done.stdout)
    bad = [c for c in report["checks"] if c["status"] not in ("✓", "skipped")]
    assert done.returncode == 0 and report["ok"] and not bad, (bad, done.stderr[-2000:])
    assert [e["ok"] for e in report["examples"]] == [True] * len(report["examples"]) and report["examples"]
    return report


def expected_top5(root: Path) -> list[str]:
    from ngcx.project.examples import load_examples

    [example] = load_examples(root / "examples.yaml")
    return json.loads(example.outputs["labels"].array.reshape(-1)[0])


def test_classifier_test_passes_with_its_examples_and_latency(resnet):
    report = passed_test(resnet, "--repeats", "5")
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["example cat"]["status"] == "✓"
    assert checks["latency"]["found"].startswith("p50 ") and len(report["examples"][0]["latencies_ms"]) == 6
    assert checks["onnxruntime"]["status"] == "✓"            # the release's checks ran on the project image


def test_run_serves_the_classifier_to_curl_and_tritonclient_then_stops_on_sigterm(resnet, docker_client):
    httpclient = pytest.importorskip("tritonclient.http")
    label = {"label": "ai.ngcx.project.run=resnet-classifier"}
    before = {c.id for c in containers(docker_client, label)}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ngcx", "run", "--port", str(port)], cwd=resnet,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()                         # printed once, when the model is ready
        assert line.startswith(f"ready: http://127.0.0.1:{port}/v2/models/resnet-classifier"), (
            line, proc.stderr.read() if proc.poll() is not None else "")
        image = (resnet / "samples" / "cat.png").read_bytes()
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
        inp = httpclient.InferInput("image", [1], "BYTES")
        inp.set_data_from_numpy(np.array([image], dtype=object), binary_data=True)
        result = client.infer("resnet-classifier", [inp])
        assert json.loads(result.as_numpy("labels")[0]) == expected_top5(resnet)
        header = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                                         "parameters": {"binary_data_size": len(image) + 4}}]})
        body = resnet / "body.bin"
        body.write_bytes(header.encode() + len(image).to_bytes(4, "little") + image)
        curl = subprocess.run(["curl", "-sf", "--data-binary", f"@{body}", "-H",
                               f"Inference-Header-Content-Length: {len(header)}",
                               f"http://127.0.0.1:{port}/v2/models/resnet-classifier/infer"],
                              capture_output=True, text=True, timeout=60)
        labels = json.loads(curl.stdout)["outputs"][0]
        assert labels["name"] == "labels" and json.loads(labels["data"][0]) == expected_top5(resnet)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, proc.stderr.read()[-2000:]
    left = [c for c in containers(docker_client, label) if c.id not in before]
    assert left == [], [c.name for c in left]


@pytest.mark.parametrize("config", ["ngcx.yaml", "ngcx.fp16.yaml"], ids=["int8", "fp16"])
def test_zero_code_plans_build_and_match_the_fp32_reference(zero_code, config):
    built = ngcx(zero_code, "build", "-f", config, "--progress", "plain")
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    report = passed_test(zero_code, "-f", config, "--repeats", "3")
    assert report["ready_s"] > 0


def test_run_serves_the_int8_plan_to_tritonclient(zero_code, docker_client):
    """The zero-code project through `ngcx run --detach`: a client's answer within the INT8 tolerance."""
    httpclient = pytest.importorskip("tritonclient.http")
    from ngcx.project.examples import load_examples

    assert ngcx(zero_code, "build").returncode == 0
    port = free_port()
    done = ngcx(zero_code, "run", "--detach", "--port", str(port))
    assert done.returncode == 0 and done.stdout.startswith(f"ready: http://127.0.0.1:{port}/v2/models/convnet")
    container = done.stdout.split("container ")[1].split(":")[0]
    try:
        [example] = load_examples(zero_code / "examples.yaml")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
        image = httpclient.InferInput("image", [1, 3, 32, 32], "FP32")
        image.set_data_from_numpy(example.inputs["image"], binary_data=True)
        got = client.infer("convnet", [image]).as_numpy("logits")
        want = example.outputs["logits"]
        np.testing.assert_allclose(got.reshape(-1), want.array.reshape(-1), rtol=want.rtol, atol=want.atol)
    finally:
        docker_client.containers.get(container).remove(force=True)


def test_init_turns_the_exported_model_into_a_project_that_builds_and_serves(zero_code, tmp_path):
    """`ngcx init` sniffs the real signature; its examples stub (zeros) is sent for real."""
    model = next((zero_code / "model").glob("*.onnx"))
    made = ngcx(tmp_path, "init", "demo", "--model", str(model), "--name", "init-demo")
    assert made.returncode == 0, made.stderr
    project = tmp_path / "demo"
    assert (project / "ngcx.yaml").is_file() and (project / "examples.yaml").is_file()
    built = ngcx(project, "build", "--progress", "plain")
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    started = time.monotonic()
    done = ngcx(project, "test", "--repeats", "0")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "example " in done.stdout and time.monotonic() - started < 300


def test_a_handler_that_fails_to_import_and_examples_off_the_signature_are_one_line_each(zero_code, tmp_path,
                                                                                         docker_client):
    """Bad input from the project itself: `ngcx test` says what and where in one line, exit 2, nothing left."""
    project = tmp_path / "broken"
    shutil.copytree(zero_code, project)
    (project / "broken.py").write_text("import numpy as np\nfrom not_a_package import thing\n\n\nclass H:\n"
                                       "    def load(self, context): ...\n")
    text = (project / "ngcx.fp16.yaml").read_text().replace("name: onnx-zero-code-fp16", "name: broken-handler")
    (project / "ngcx.yaml").write_text(text + "handler: broken:H\nfiles: [broken.py]\n")
    assert ngcx(project, "build").returncode == 0
    done = ngcx(project, "test", "--repeats", "0")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "broken.py:2" in lines[0] and "not_a_package" in lines[0], lines[0]
    left = containers(docker_client, {"label": "ai.ngcx.project.run=broken-handler"})
    assert left == []

    (project / "ngcx.yaml").write_text(text)                  # a working project again, examples broken
    examples = project / "examples.fp16.yaml"
    examples.write_text(examples.read_text().replace("datatype: FP32", "datatype: INT64", 1))
    assert ngcx(project, "build").returncode == 0
    done = ngcx(project, "test", "--repeats", "0")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "INT64" in done.stderr and "FP32" in done.stderr, done.stderr
