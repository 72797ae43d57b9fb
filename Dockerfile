# One image for every PARFusion service; compose.yaml picks the service by command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PARFUSION_HOME=/app \
    PARFUSION_HOST=0.0.0.0

WORKDIR /app

# Dependencies first, so code changes do not invalidate the install layer.
COPY pyproject.toml README.md LICENSE ./
COPY parfusion/__init__.py parfusion/__init__.py
RUN mkdir -p services experiments && touch services/__init__.py experiments/__init__.py \
    && pip install --upgrade pip \
    && pip install .

COPY proto ./proto
COPY parfusion ./parfusion
COPY services ./services
COPY experiments ./experiments
COPY configs ./configs
RUN pip install --no-deps . \
    && mkdir -p run logs results \
    && useradd --create-home --uid 10001 parfusion \
    && chown -R parfusion /app

USER parfusion

# allocator, nodeagent, gpulane (gRPC) + their metrics; extender, bridge, dashboard (HTTP)
EXPOSE 50051 50052 50053 19101 19102 19103 18082 18083 18080

HEALTHCHECK --interval=10s --timeout=3s --retries=6 \
    CMD ["python", "-m", "parfusion.healthcheck", "grpc", "127.0.0.1:50051"]

CMD ["python", "-m", "services.allocator", "--host", "0.0.0.0"]
