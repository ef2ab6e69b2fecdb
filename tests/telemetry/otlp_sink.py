"""An OTLP/HTTP receiver for tests: what other processes export with ``configure_from_env``."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, Response
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class ExportedSpan:
    """A span as received: ids in hex, ``parent`` empty for a root."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent: str
    start_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


def _attributes(items: Any) -> dict[str, Any]:
    pairs: list[KeyValue] = list(items)
    return {kv.key: _value(kv.value) for kv in pairs}


class OtlpSink:
    def __init__(self) -> None:
        self.spans: list[ExportedSpan] = []

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/traces")
        async def traces(request: Request) -> Response:
            body = await request.body()
            if request.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            export = ExportTraceServiceRequest.FromString(body)
            for resource_spans in export.resource_spans:
                service = _attributes(resource_spans.resource.attributes).get("service.name", "")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            ExportedSpan(
                                service=str(service),
                                name=span.name,
                                kind=span.kind,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent=span.parent_span_id.hex(),
                                start_ns=span.start_time_unix_nano,
                                attributes=_attributes(span.attributes),
                            )
                        )
            return Response(ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF)

        @app.post("/v1/metrics")
        async def metrics() -> Response:
            return Response(ExportMetricsServiceResponse().SerializeToString(), media_type=PROTOBUF)

        return app
