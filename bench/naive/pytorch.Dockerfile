# ngcx-release: pytorch:24.11 (bench/image_sizes.py compares this with ngcx/pytorch:24.11-runtime)
# Naive one-stage Dockerfile, written the way most people write one: same base and the same
# pins as ngcx's pytorch image, but apt with recommends, pip into the system Python, no cache
# cleanup, no venv, no layer care. bench/image_sizes.py builds it to compare image sizes.
# The CA comes in as a BuildKit secret only because this machine's proxy re-signs TLS.
FROM ngcx/base:bookworm
RUN apt-get update && apt-get install -y python3-pip
RUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca \
    pip install --break-system-packages torch==2.5.1 torchvision==0.20.1
