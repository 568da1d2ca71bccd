# ngcx-release: tensorflow:25.03 (bench/image_sizes.py compares this with ngcx/tensorflow:25.03-runtime)
# Naive one-stage Dockerfile, written the way most people write one: same base and the same
# pins as ngcx's tensorflow image, but apt with recommends, pip into the system Python, no cache
# cleanup, no venv, no layer care. bench/image_sizes.py builds it to compare image sizes.
# The CA comes in as a BuildKit secret only because this machine's proxy re-signs TLS.
FROM ngcx/base:bookworm
RUN apt-get update && apt-get install -y python3-pip
RUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca \
    pip install --break-system-packages 'tensorflow[and-cuda]==2.18.1'
