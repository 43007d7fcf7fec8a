# Rill, one node per container. Build: docker build -t rill .   Run: docker run -p 127.0.0.1:4437:4437 rill
# A 3-node cluster with MinIO: see compose.yaml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /build
# Only what `pip install .` needs (pyproject names README.md as the readme); .dockerignore keeps the rest out.
COPY pyproject.toml README.md ./
COPY app ./app
COPY openapi ./openapi
# app/server.py serves /openapi.yaml from ../openapi/rill.yaml beside the app package, which a
# non-editable install leaves behind: put it beside the installed package too.
RUN pip install . \
    && cp -r openapi "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/" \
    && rm -rf /build

# Not root; /data is owned by rill so a fresh named volume mounted there is writable.
RUN useradd --system --uid 10001 --no-create-home --home-dir /data --shell /usr/sbin/nologin rill \
    && mkdir -p /data && chown rill:rill /data
USER rill
WORKDIR /data
VOLUME ["/data"]

EXPOSE 4437
# The slim image has no curl; Python is there anyway.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:4437/healthz', timeout=2)"]

# Flags given to `docker run IMAGE ...` or compose's `command:` are appended (a later flag wins).
# SIGTERM (docker stop) lets a leader hand over to a caught-up follower before it exits.
ENTRYPOINT ["rill", "serve", "--host", "0.0.0.0", "--port", "4437", "--data-dir", "/data"]
CMD []
