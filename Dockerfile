# Weir production image.
#   docker build -t weir .
#   docker run -p 8008:8008 -p 8448:8448 -v weir-data:/data --ulimit nofile=65536:65536 weir
# deploy/ has a docker-compose.yml with a TLS-terminating load balancer and PostgreSQL.
#
# Open files: every client connection, federation connection, outbound call and database
# file is a file descriptor. Raise the limit (--ulimit nofile=..., or ulimits: in compose)
# well above server.http.main_pool_size plus the federation pool; /metrics shows
# process_open_fds against process_max_fds.

# One exact base for both stages: the virtualenv made in the first runs on the second's
# Python, and the same Dockerfile builds the same image. Move it on deliberately (a newer
# 3.11.x patch release, or a digest: python:3.11.14-slim-bookworm@sha256:...).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN python -m venv /venv
COPY requirements.txt /tmp/requirements.txt
RUN /venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt

FROM ${PYTHON_IMAGE}
# /data/media exists in the image so that a volume mounted there (deploy/) starts out
# owned by weir, as /data does.
RUN useradd --system --uid 10001 --user-group --home-dir /data weir \
    && mkdir -p /data/media && chown -R weir:weir /data
COPY --from=build /venv /venv
WORKDIR /app
COPY app.py ./
COPY budget ./budget
COPY homeserver ./homeserver
COPY docker/config.toml docker/entrypoint.sh ./docker/
# Compiled now: the app folder belongs to root, so the weir user could not write the cache
# and every start would compile everything again.
RUN /venv/bin/python -m compileall -q /app
ENV PATH=/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    WEIR_CONFIG=/data/config.toml \
    WEIR_HEALTH_URL=http://127.0.0.1:8008/health
USER weir
VOLUME /data
EXPOSE 8008 8448
# /health answers 200 once the server is ready. Set WEIR_HEALTH_URL if the config moves the
# client listener off port 8008.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(os.environ['WEIR_HEALTH_URL'], timeout=4)"
# SIGTERM (docker stop) first fails /health for server.http.shutdown_drain_delay (5 s in
# docker/config.toml and deploy/weir.toml) while Weir still serves, then drains in-flight
# requests for up to 10 s: give it longer than both (docker stop -t 20, or
# stop_grace_period: 20s in compose, as deploy/docker-compose.yml does).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/app/docker/entrypoint.sh"]
