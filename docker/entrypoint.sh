#!/bin/sh
# First start: copy the container config into the volume, so the operator can edit it there.
set -e
if [ ! -f "$WEIR_CONFIG" ]; then
    cp /app/docker/config.toml "$WEIR_CONFIG"
    echo "weir: wrote a default config to $WEIR_CONFIG; set server_name there" >&2
fi
exec python /app/app.py --config "$WEIR_CONFIG" "$@"
