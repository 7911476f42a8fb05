# nginx from Debian's package, for machines that cannot pull the official nginx
# image (make test-docker builds it from the local Debian base; elsewhere
# compose.replicas.yaml uses nginx:1.27). Like the official image, it renders
# /etc/nginx/templates/*.template with envsubst at start (nginx-entrypoint.sh),
# so compose.replicas.yaml's template, variables and command work unchanged.
#   docker build -f docker/local/nginx.Dockerfile -t pagode-nginx:local docker/local
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# policy-rc.d (exit 101): the package's postinst must not start a daemon here.
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \
    && apt-get update \
    && apt-get install -y --no-install-recommends nginx gettext-base \
    && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d /etc/nginx/sites-enabled/*
COPY nginx-entrypoint.sh /usr/local/bin/nginx-entrypoint.sh
EXPOSE 80
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/bin/sh", "/usr/local/bin/nginx-entrypoint.sh"]
CMD ["nginx", "-g", "daemon off;"]
