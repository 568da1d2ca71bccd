# ngcx-release: pytorch:24.11 (bench/suites/build.py: the naive image beside cuda.Dockerfile, for the bytes the two share)
# Naive one-stage Dockerfile, written the way most people write one: same base and the same
# pins as ngcx's pytorch image, but apt with recommends, pip into the system Python, no cache
# cleanup, no venv, no layer care: the app (ngcx-runtime and the image's tests, from the
# build context `ngcx render --context` writes) is copied before the pip install, so
# any app edit reinstalls everything. bench/image_sizes.py and the bench's build suite build it.
# The CA comes in as a BuildKit secret only because this machine's proxy re-signs TLS.
FROM ngcx/base:bookworm
RUN apt-get update && apt-get install -y python3-pip
COPY . /opt/app
RUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca \
    pip install --break-system-packages torch==2.5.1 torchvision==0.20.1 \
        /opt/app/ngcx-runtime
ENTRYPOINT ["ngcx-runtime"]
