# vllm-router (the Rust cache-aware router, shipped as a Python wheel) for
# compose.replicas.yaml, which builds it. Its entry point expands a scaled
# service's DNS name into one worker URL per replica (router-entrypoint.py).
#   docker build -f docker/router.Dockerfile -t pagode-router docker
# The context is docker/; router.Dockerfile.dockerignore keeps it to the
# entry point and docker/certs (CA certificates for pip behind a TLS-re-signing
# proxy, trusted in the builder stage only, as in pagode's Dockerfile).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# Pinned: the router's flags and the endpoints it calls on the replicas change
# between releases (docs/deploy.md says what this one calls).
ARG VLLM_ROUTER_VERSION=0.1.17
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
COPY certs/ /usr/local/share/ca-certificates/
RUN if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then update-ca-certificates; fi
RUN python3 -m venv /opt/router \
    && /opt/router/bin/pip install --no-cache-dir "vllm-router==${VLLM_ROUTER_VERSION}" \
    && /opt/router/bin/vllm-router --help >/dev/null

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/router/bin:$PATH
COPY --from=builder /opt/router /opt/router
COPY router-entrypoint.py /usr/local/bin/router-entrypoint
USER 10001:10001
EXPOSE 8000 29000
STOPSIGNAL SIGTERM
ENTRYPOINT ["python3", "/usr/local/bin/router-entrypoint"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--worker-urls", "http://pagode:8000", "--policy", "cache_aware"]
