# syntax=docker/dockerfile:1
# Fairgate: the gateway only (runtime dependencies, no dev extras), run as a non-root user.
#   docker build -t fairgate .
#   docker run -p 8080:8080 -v ./fairgate.yaml:/etc/fairgate/fairgate.yaml:ro \
#     -v fairgate-usage:/var/lib/fairgate fairgate
# docker-compose.yml runs it with Ollama, Redis, Prometheus and Grafana.

# Build a wheel in a throwaway stage so that the source tree and the build tools stay out of
# the final image.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Installing the wheel pulls in the [project] dependencies only, not [dev]. The wheel is
# mounted for this one step (BuildKit), so it never becomes a layer of the image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir /wheels/*.whl

RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin fairgate \
    && install -d -o fairgate -g fairgate -m 0700 /var/lib/fairgate
# Root-owned and read-only to the gateway: the policy file is mounted here.
WORKDIR /etc/fairgate
USER fairgate

ENV FAIRGATE_LISTEN=0.0.0.0:8080 \
    FAIRGATE_CONFIG=/etc/fairgate/fairgate.yaml \
    FAIRGATE_LOG_FORMAT=json \
    FAIRGATE_USAGE_DB=/var/lib/fairgate/usage.db
EXPOSE 8080

# GET / answers "Ollama is running" without a key (clients probe it the same way); the port
# follows FAIRGATE_LISTEN if a deployment changes it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('FAIRGATE_LISTEN', ':8080').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=4)"]

ENTRYPOINT ["fairgate"]
CMD ["serve"]
