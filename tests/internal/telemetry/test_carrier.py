"""The W3C trace headers a Kafka record may carry (a trigger's, on the user's own topics),
as ``_telemetry.carrier_from_headers`` takes them: only well-formed ones are kept."""

from __future__ import annotations

import pytest

from saga_engine.telemetry._telemetry import carrier_from_headers

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("traceparent", TRACEPARENT.encode())], {"traceparent": TRACEPARENT}),
        (
            [("traceparent", TRACEPARENT.encode()), ("tracestate", b"k=v")],
            {"traceparent": TRACEPARENT, "tracestate": "k=v"},
        ),
        ([("traceparent", TRACEPARENT.upper().encode())], {}),  # W3C wants lower case
        ([("traceparent", b"00-nonsense")], {}),
        ([("traceparent", b"\xff\xfe")], {}),
        ([("traceparent", None), ("other", b"x")], {}),
        ([], {}),
    ],
)
def test_trace_headers_of_a_record_are_checked(
    headers: list[tuple[str, bytes | None]], expected: dict[str, str]
) -> None:
    assert carrier_from_headers(headers) == expected
