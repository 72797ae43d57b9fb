# One image for every PARFusion service; compose.yaml picks the service by command.
# Any Debian-based image with Python >= 3.11 and its venv module works as the base
# (--build-arg PYTHON_IMAGE=...): everything is installed into a virtual environment, so a
# distribution Python that forbids system-wide pip installs (PEP 668) is fine too.
ARG PYTHON_IMAGE=python:3.11-slim

# --- build: the project and its dependencies into /opt/venv --------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first (from pyproject.toml alone), so a code change reuses this layer.
# The `ros` extra brings ROS 2 (rclpy) for the bridge; pip only warns where it is not defined.
COPY pyproject.toml README.md LICENSE ./
COPY parfusion/__init__.py parfusion/__init__.py
RUN mkdir -p services experiments && touch services/__init__.py experiments/__init__.py \
    && pip install --quiet --upgrade pip \
    && pip install --quiet '.[ros]' \
    && pip uninstall --quiet --yes parfusion
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
RUN useradd --create-home --uid 10001 --user-group parfusion
# The dependencies' layer (most of the image) changes only with pyproject.toml; the project's
# own wheel goes on top of it, so a code change ships a few MB, not the whole venv again.
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
