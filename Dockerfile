# Two images from one file; the last stage is the default.
#   Rill, one node per container:  docker build -t rill .    Run: docker run -p 127.0.0.1:4437:4437 rill
#   The Spark pipeline (`rill pipeline`, Spark in local mode):  docker build --target pipeline -t rill-pipeline .
# A 3-node cluster with MinIO and the pipeline beside it: see compose.yaml.

# --- pipeline: `rill pipeline export` with pyspark and a JRE -------------------------------------------
# bookworm, not python:3.11-slim's current Debian (trixie): openjdk-17 is packaged for Debian 12 only, and
# Spark 4 wants Java 17 or 21. Python 3.11: the `apache/spark` images have 3.10, below requires-python.
FROM python:3.11-slim-bookworm AS pipeline

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPARK_LOCAL_IP=127.0.0.1

# The slim images drop /usr/share/man, where the JRE's postinst registers its man pages as alternatives.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /build
COPY pyproject.toml README.md ./
COPY app ./app
# The `pipeline` extra is pyspark (with its own Spark jars); the data source reads the cold store with boto3.
RUN pip install '.[pipeline]' \
    && rm -rf /build

# Not root. Spark keeps its scratch files in /tmp; exports go to /export (a volume in compose.yaml),
# owned by rill so a fresh named volume mounted there is writable.
RUN useradd --system --uid 10001 --create-home --home-dir /home/rill --shell /usr/sbin/nologin rill \
    && mkdir -p /export && chown rill:rill /export
USER rill
WORKDIR /home/rill
VOLUME ["/export"]

# `docker run rill-pipeline export --store s3://... --bucket B --out /export/B`
ENTRYPOINT ["rill", "pipeline"]
CMD ["--help"]

# --- the Rill server (default) ---------------------------------------------------------------------------
FROM python:3.11-slim AS server

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
