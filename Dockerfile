# One image for the saga engine and the demo services (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY saga_engine ./saga_engine
COPY services_demo ./services_demo
RUN pip install '.[instrumentation]' && useradd --create-home --uid 10001 saga

USER saga
CMD ["saga", "--help"]
