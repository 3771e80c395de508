# syntax=docker/dockerfile:1
# skilljobs: one image for every role (web, worker, migrate, up).
#
#   docker build -t skilljobs .
#   docker run --rm skilljobs doctor
#
# The builder turns the checkout into a wheel (migrations, bundled skills and the demo
# schedule are inside it); the runtime stage installs that wheel, not editable, into
# /opt/venv, so the image holds no source tree. Only the runtime stage ends up in the image.

# Build tools (apt build-essential, pip/setuptools/wheel) follow the base image's release;
# the project's own dependencies are bounded in pyproject.toml.
# hadolint global ignore=DL3008,DL3013

ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: the wheel ------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY jobs ./jobs
COPY chains ./chains
COPY delivery ./delivery
COPY dashboard ./dashboard
COPY skills ./skills
RUN pip wheel --no-deps -w /dist .

# --- deps: a virtualenv with the wheel and its dependencies -------------------------------
FROM ${PYTHON_IMAGE} AS deps

RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY --from=builder /dist /dist
# with the otel extra: traces stay off unless OTEL_EXPORTER_OTLP_ENDPOINT is set
RUN pip install /dist/*.whl \
 && pip install "$(ls /dist/*.whl)[otel]" \
 && skilljobs --version

# --- runtime ----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SKILLJOBS_DATA_DIR=/data \
    SKILLJOBS_WORKSPACE_ROOT=/data/workspaces

# The sandbox of untrusted skills: bubblewrap, and slirp4netns for their network.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap slirp4netns \
 && rm -rf /var/lib/apt/lists/*

# A fixed non-root uid/gid, so volume ownership is predictable across hosts. The data
# directories exist in the image, owned by that user: a named volume mounted there starts
# with that ownership.
RUN groupadd --system --gid 10001 skilljobs \
 && useradd --system --uid 10001 --gid skilljobs --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin skilljobs \
 && mkdir -p /data/workspaces \
 && chown -R skilljobs:skilljobs /data

# The venv stays owned by root: the service cannot rewrite itself.
COPY --from=deps /opt/venv /opt/venv
WORKDIR /data

USER 10001:10001
EXPOSE 8000

# Only the web role serves HTTP: for any other role (worker, migrate, doctor) the check
# passes without a request. The port comes from the command line (default 8000).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request\nargs = open('/proc/1/cmdline', 'rb').read().decode().split('\\0')\nif 'web' not in args and 'up' not in args:\n    sys.exit(0)\nport = '8000'\nfor i, a in enumerate(args):\n    if a == '--port' and i + 1 < len(args):\n        port = args[i + 1]\n    elif a.startswith('--port='):\n        port = a.split('=', 1)[1]\nurllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4)"]

ENTRYPOINT ["skilljobs"]
CMD ["web", "--host", "0.0.0.0", "--port", "8000"]
