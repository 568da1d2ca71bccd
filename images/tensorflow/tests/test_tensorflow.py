"""Runs inside the tensorflow image (ngcx test -> ngcx-runtime selftest). Plain functions, no pytest.

What a user of this image relies on: the pinned tensorflow imports, it was built for the image's
CUDA/cuDNN, every CUDA wheel its [and-cuda] extra asks for is installed at exactly that version
(pip replaced nothing), a Keras model trains and predicts on CPU, and ngcx-runtime in this image
says clearly what it cannot serve. Tensor-core matmuls, cuDNN convs and NCCL all-reduce need a GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from ngcx_runtime.selftest import pin as _pin, require_gpu, same_version as _same

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")




def test_tensorflow_is_the_pin():
    import tensorflow as tf

    assert tf.__version__ == _pin("tensorflow"), f"tensorflow {tf.__version__} vs pin {_pin('tensorflow')}"
    assert tf.test.is_built_with_cuda(), "a CPU-only tensorflow wheel is installed"


def test_tensorflow_built_for_image_cuda_and_cudnn():
    """tf.sysconfig.get_build_info(): the CUDA/cuDNN TF was compiled against vs the image's pins."""
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    cuda, cudnn = str(info.get("cuda_version", "")), str(info.get("cudnn_version", ""))
    image_cuda, cudnn_pin = os.environ["NGCX_CUDA"], _pin("nvidia-cudnn")
    assert cuda and _same(cuda, image_cuda), f"TF built for CUDA {cuda!r}, image is {image_cuda}"
    assert cudnn and _same(cudnn, cudnn_pin), f"TF built for cuDNN {cudnn!r}, image pins {cudnn_pin}"


def test_and_cuda_requirements_installed_exactly():
    """Every nvidia-* wheel tensorflow[and-cuda] requires is installed at that exact version."""
    from importlib.metadata import distribution, version

    wanted = []
    for req in distribution("tensorflow").requires or []:
        m = re.match(r"(nvidia-[\w-]+)\s*\(?==\s*([\w.]+)\)?\s*;.*extra\s*==\s*['\"]and-cuda['\"]", req)
        if m:
            wanted.append((m.group(1), m.group(2)))
    assert wanted, "tensorflow declares no [and-cuda] CUDA wheels"
    wrong = [f"{name} {version(name)} (wants {want})" for name, want in wanted if version(name) != want]
    assert not wrong, "CUDA wheels differ from what tensorflow[and-cuda] asks for: " + ", ".join(wrong)


def test_keras_model_trains_and_predicts_on_cpu():
    """Conv2D + Dense: predict() equals the numpy computation of the same weights; fit lowers loss."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 3)),
        tf.keras.layers.Conv2D(4, 3, padding="valid", activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(3),
    ])
    x = np.random.default_rng(0).normal(size=(16, 8, 8, 3)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 3, size=16)
    out = model.predict(x, verbose=0)
    (k, kb), (w, wb) = model.layers[0].get_weights(), model.layers[2].get_weights()
    patches = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(1, 2))  # N,6,6,C,3,3
    conv = np.maximum(np.einsum("nhwcij,ijco->nhwo", patches, k) + kb, 0)
    np.testing.assert_allclose(out, conv.mean((1, 2)) @ w + wb, rtol=1e-4, atol=1e-5)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(x, y, epochs=5, batch_size=16, verbose=0).history["loss"]
    assert hist[-1] < hist[0], f"loss did not drop: {hist}"


def test_ngcx_runtime_reports_tensorflow_and_refuses_onnx_clearly():
    """`ngcx-runtime info` sees TF; serving an .onnx here fails with one line naming the fix."""
    import json

    proc = subprocess.run(["ngcx-runtime", "info", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    tf_info = json.loads(proc.stdout)["frameworks"]["tensorflow"]
    assert tf_info.get("version") == _pin("tensorflow"), tf_info
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "m.onnx"
        model.write_bytes(b"not really onnx")
        proc = subprocess.run(["ngcx-runtime", "optimize", str(model), "-o", str(Path(tmp) / "plan")],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert "onnxruntime" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_fp16_and_bf16_matmul_on_gpu():
    """With a GPU: half/bfloat16 matmuls (tensor-core path) agree with an fp32 reference."""
    require_gpu()
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    assert gpus, "a GPU is visible to the driver but not to tensorflow (CUDA libraries not found?)"
    with tf.device("/GPU:0"):
        a = tf.random.normal((512, 512), seed=1)
        b = tf.random.normal((512, 512), seed=2)
        ref = tf.matmul(a, b)
        for dtype in (tf.float16, tf.bfloat16):
            got = tf.cast(tf.matmul(tf.cast(a, dtype), tf.cast(b, dtype)), tf.float32)
            rel = float(tf.norm(got - ref) / tf.norm(ref))
            assert rel < 1e-2, f"{dtype.name} matmul relative error {rel}"


def test_cudnn_conv_on_gpu():
    """With a GPU: a Conv2D through cuDNN matches the CPU result."""
    require_gpu()
    import tensorflow as tf

    x = tf.random.normal((4, 32, 32, 3), seed=3)
    k = tf.random.normal((3, 3, 3, 8), seed=4)
    with tf.device("/CPU:0"):
        cpu = tf.nn.conv2d(x, k, 1, "SAME")
    with tf.device("/GPU:0"):
        gpu = tf.nn.conv2d(x, k, 1, "SAME")
    np.testing.assert_allclose(gpu.numpy(), cpu.numpy(), rtol=1e-3, atol=1e-3)


def test_nccl_all_reduce_across_visible_gpus():
    """With a GPU: MirroredStrategy with NcclAllReduce sums one value per GPU."""
    require_gpu()
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    strategy = tf.distribute.MirroredStrategy([f"/GPU:{i}" for i in range(len(gpus))],
                                              cross_device_ops=tf.distribute.NcclAllReduce())
    per_replica = strategy.run(
        lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    n = len(gpus)
    assert float(total) == n * (n + 1) / 2, (float(total), n)
