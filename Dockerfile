# One image for the saga engine and the demo services (see docker-compose.yml).

# The demo's shipping service is written in Go (services_demo/shipping_go, with the
# participant kit in kits/go): built here, copied into the image as saga-demo-shipping.
FROM golang:1.26 AS shipping
WORKDIR /src
COPY kits/go ./kits/go
COPY services_demo/shipping_go ./services_demo/shipping_go
RUN cd services_demo/shipping_go && CGO_ENABLED=0 go build -trimpath -o /out/saga-demo-shipping .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY saga_engine ./saga_engine
COPY services_demo ./services_demo
COPY --from=shipping /out/saga-demo-shipping /usr/local/bin/saga-demo-shipping
RUN pip install '.[instrumentation]' && useradd --create-home --uid 10001 saga

USER saga
CMD ["saga", "--help"]
