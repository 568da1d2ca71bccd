# ngcx-release: cuda:24.05 (the bench's build suite compares this with ngcx/cuda:24.05-runtime)
# Naive one-stage Dockerfile, written the way most people write one: same base and the same
# pins as ngcx's cuda image, but apt with recommends, pip into the system Python, no cache
# cleanup, no venv, no layer care: the app (ngcx-runtime and the image's tests, from the
# build context `ngcx render --context` writes) is copied before the pip install, so
# any app edit reinstalls everything. The bench's build suite (bench/suites/build.py) builds it.
# The CA comes in as a BuildKit secret only because this machine's proxy re-signs TLS.
FROM ngcx/base:bookworm
RUN apt-get update && apt-get install -y python3-pip
COPY . /opt/app
RUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca \
    pip install --break-system-packages nvidia-cuda-runtime-cu12==12.4.127 nvidia-cublas-cu12==12.4.5.8 \
        nvidia-cudnn-cu12==9.1.0.70 nvidia-nccl-cu12==2.21.5 \
        /opt/app/ngcx-runtime
ENTRYPOINT ["ngcx-runtime"]
