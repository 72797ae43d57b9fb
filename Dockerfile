# One image for every PARFusion service; compose.yaml picks the service by command.
# Any Debian-based image with Python >= 3.11 and its venv module works as the base
# (--build-arg PYTHON_IMAGE=...): everything is installed into a virtual environment, so a
# distribution Python that forbids system-wide pip installs (PEP 668) is fine too.
ARG PYTHON_IMAGE=python:3.11-slim

# --- requirements: the runtime dependencies (and the `ros` extra) named in pyproject.toml --------
# Their layer below is cached on this list alone, so a change elsewhere in pyproject.toml (a dev
# tool, the version) does not install every dependency again.
FROM ${PYTHON_IMAGE} AS requirements
COPY pyproject.toml /src/pyproject.toml
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p.get('optional-dependencies', {}).get('ros', [])))" \
    > /requirements.txt

# --- build: the dependencies into /opt/venv, the project as a wheel -------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
# The `ros` extra brings ROS 2 (rclpy with Fast DDS, PyPI wheels) for the bridge.
COPY --from=requirements /requirements.txt /src/requirements.txt
RUN pip install --quiet --upgrade pip && pip install --quiet -r /src/requirements.txt
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY parfusion ./parfusion
COPY services ./services
COPY experiments ./experiments
RUN pip wheel --quiet --no-deps --wheel-dir /wheels .

# --- run: the venv and the configuration, nothing else --------------------------------------
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    PARFUSION_HOME=/app \
    PARFUSION_HOST=0.0.0.0
# jemalloc: the allocator's and the node agent's malloc (services/common/malloc.py), so that
# their memory goes back after thousands of intents are deleted
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libjemalloc2 \
        >/dev/null \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 --user-group parfusion
# The dependencies' layer (most of the image) changes only with the runtime dependencies; the
# project's own wheel goes on top of it, so a code change ships a few MB, not the whole venv.
COPY --from=build /opt/venv /opt/venv
COPY --from=build /wheels /wheels
RUN PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    pip install --quiet --no-deps /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY configs ./configs
# run/ holds each service's state; compose.yaml mounts a named volume there, which the engine
# fills from this empty, parfusion-owned folder (so no host chown is needed). Services log to
# stdout (`docker compose logs`); logs/ and results/ exist for the CLI commands that write there.
RUN mkdir run logs results && chown parfusion:parfusion run logs results

USER parfusion

# allocator, nodeagent, gpulane (gRPC) + their metrics; extender, bridge, dashboard (HTTP)
EXPOSE 50051 50052 50053 19101 19102 19103 18082 18083 18080

HEALTHCHECK --interval=10s --timeout=3s --retries=6 \
    CMD ["python", "-m", "parfusion.healthcheck", "grpc", "127.0.0.1:50051"]

CMD ["python", "-m", "services.allocator", "--host", "0.0.0.0"]
