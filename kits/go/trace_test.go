package kit

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

const parentTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func traceCmd(tp, ts string) *Command {
	hs := map[string]string{}
	if tp != "" {
		hs["traceparent"] = tp
	}
	if ts != "" {
		hs["tracestate"] = ts
	}
	return &Command{Type: "Apply", Headers: hs}
}

// The reply continues the command's trace in a span of its own (section 4),
// with or without an OpenTelemetry SDK.
func TestReplyContinuesTrace(t *testing.T) {
	for name, tracer := range map[string]trace.Tracer{
		"no-op": noop.NewTracerProvider().Tracer("t"),
		"sdk":   sdktrace.NewTracerProvider().Tracer("t"),
	} {
		t.Run(name, func(t *testing.T) {
			ctx, span := startSpan(context.Background(), tracer, traceCmd(parentTP, "congo=t61rcWkgMzE"))
			defer span.End()
			tp, ts := traceHeaders(ctx)
			parts := strings.Split(tp, "-")
			if len(parts) != 4 || parts[0] != "00" || parts[1] != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Fatalf("traceparent %q does not continue the trace", tp)
			}
			if parts[2] == "00f067aa0ba902b7" || parts[2] == "0000000000000000" {
				t.Fatalf("traceparent %q reuses the parent span id", tp)
			}
			if parts[3] != "01" {
				t.Fatalf("flags %q", parts[3])
			}
			if ts != "congo=t61rcWkgMzE" {
				t.Fatalf("tracestate %q", ts)
			}
		})
	}
}

func TestInvalidTraceparentIsIgnored(t *testing.T) {
	for _, tp := range []string{"", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"} {
		ctx, span := startSpan(context.Background(), noop.NewTracerProvider().Tracer("t"), traceCmd(tp, ""))
		if got, _ := traceHeaders(ctx); got != "" {
			t.Errorf("%q: traceparent %q from no trace", tp, got)
		}
		span.End()
		// With an SDK, an invalid parent starts a new trace.
		ctx, span = startSpan(context.Background(), sdktrace.NewTracerProvider().Tracer("t"), traceCmd(tp, ""))
		if got, _ := traceHeaders(ctx); len(got) != 55 {
			t.Errorf("%q: traceparent %q, want a new trace", tp, got)
		}
		span.End()
	}
}
