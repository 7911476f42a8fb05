#!/bin/sh
# What the official nginx image does at start with templates: every
# /etc/nginx/templates/NAME.template becomes $NGINX_ENVSUBST_OUTPUT_DIR/NAME
# (default /etc/nginx/conf.d), with only the variables that are set replaced,
# so nginx's own $variables survive. Then run the command.
set -eu
templates=${NGINX_ENVSUBST_TEMPLATE_DIR:-/etc/nginx/templates}
out=${NGINX_ENVSUBST_OUTPUT_DIR:-/etc/nginx/conf.d}
defined=$(env | cut -d= -f1 | grep -E '^[A-Za-z_][A-Za-z0-9_]*$' | sed 's/.*/${&}/' | tr '\n' ' ')
for template in "$templates"/*.template; do
    [ -e "$template" ] || continue
    name=$(basename "$template" .template)
    envsubst "$defined" < "$template" > "$out/$name"
    echo "nginx-entrypoint: rendered $template into $out/$name"
done
exec "$@"
