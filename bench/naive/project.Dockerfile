# ngcx-release: onnxruntime:25.08 (the bench's project suite builds this FROM ngcx/onnxruntime:25.08-runtime)
# Hand-written Dockerfile for the same model + handler + requirements.txt as the suite's ngcx.yaml project,
# written the way most people write one: the whole project folder copied in one COPY, then
# `pip install -r requirements.txt`, then the serve command. Nothing is wrong in it and it serves
# the same model; what it lacks is layer order: the model, the code and the requirements share one
# COPY, so any edit re-copies the model and re-runs pip. The suite copies this file into the project
# folder as ./Dockerfile and runs `docker build .` there, as a user would.
# The CA comes in as a BuildKit secret only because this machine's proxy re-signs TLS.
# The base's ENTRYPOINT is ngcx-runtime, so CMD holds its arguments (`serve ...`), and WORKDIR /app
# is where `serve --handler` imports handler.py from (its default --app-dir is the current folder).
FROM ngcx/onnxruntime:25.08-runtime
WORKDIR /app
COPY . /app
RUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca pip install -r requirements.txt
EXPOSE 8000
CMD ["serve", "/app/model.onnx", "--host", "0.0.0.0", "--port", "8000", "--name", "mlp", "--handler", "handler:Handler"]
