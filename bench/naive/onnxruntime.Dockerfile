# ngcx-release: onnxruntime:25.08 (bench/image_sizes.py compares this with ngcx/onnxruntime:25.08-runtime)
# Naive one-stage Dockerfile, written the way most people write one: same base and the same
# pins as ngcx's onnxruntime image, but apt with recommends, pip into the system Python, no cache
# cleanup, no venv, no layer care: the app (ngcx-runtime and the image's tests, from the
# build context `ngcx render --context` writes) is copied before the pip install, so
# any app edit reinstalls everything. bench/image_sizes.py and the bench's build suite build it.
# The CA comes in as a BuildKit secret only because this machine's proxy re-signs TLS.
FROM ngcx/base:bookworm
RUN apt-get update && apt-get install -y python3-pip
COPY . /opt/app
RUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca \
    pip install --break-system-packages onnxruntime-gpu==1.22.0 onnx==1.18.0 \
        nvidia-cuda-runtime-cu12==12.8.90 nvidia-cublas-cu12==12.8.4.1 \
        nvidia-cudnn-cu12==9.10.2.21 nvidia-nccl-cu12==2.27.3 \
        nvidia-cufft-cu12==11.3.3.83 nvidia-curand-cu12==10.3.9.90 \
        nvidia-cuda-nvrtc-cu12==12.8.93 nvidia-nvjitlink-cu12==12.8.93 \
        /opt/app/ngcx-runtime
ENTRYPOINT ["ngcx-runtime"]
