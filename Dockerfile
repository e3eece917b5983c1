# Weir production image. Build: docker build -t weir .
# Run:   docker run -p 8008:8008 -p 8448:8448 -v weir-data:/data --ulimit nofile=65536:65536 weir
# Each open client connection holds a file descriptor; raise the open-files limit
# (--ulimit nofile=...) to at least main_pool_size plus media and federation connections.

FROM python:3.11-slim AS build
RUN python -m venv /venv
COPY requirements.txt /tmp/requirements.txt
RUN /venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt

FROM python:3.11-slim
RUN useradd --system --uid 10001 --user-group --home-dir /data weir \
    && mkdir -p /data && chown weir:weir /data
COPY --from=build /venv /venv
WORKDIR /app
COPY app.py ./
COPY budget ./budget
COPY homeserver ./homeserver
COPY docker/config.toml docker/entrypoint.sh ./docker/
ENV PATH=/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    WEIR_CONFIG=/data/config.toml
USER weir
VOLUME /data
EXPOSE 8008 8448
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8008/health', timeout=4)"
ENTRYPOINT ["/app/docker/entrypoint.sh"]
