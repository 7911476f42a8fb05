# Prometheus from Debian's package, for machines that cannot pull prom/prometheus
# (make test-docker builds it from the local Debian base; elsewhere compose.yaml
# uses the official image). Same entry point, working directory and user as
# the official image, so compose.yaml's command and volumes work unchanged.
#   docker build -f docker/local/prometheus.Dockerfile -t pagode-prometheus:local docker/local
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# policy-rc.d (exit 101): the package's postinst must not start a daemon here.
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \
    && apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
    && install -d -o prometheus -g prometheus /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
