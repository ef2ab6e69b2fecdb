package kit

import (
	"context"
	"crypto/rand"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// mapCarrier adapts a header map to OpenTelemetry's TextMapCarrier.
type mapCarrier map[string]string

func (m mapCarrier) Get(key string) string { return m[key] }
func (m mapCarrier) Set(key, value string) { m[key] = value }
func (m mapCarrier) Keys() []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

var traceContext = propagation.TraceContext{}

// startSpan extracts the W3C trace context of a command (section 4) and
// starts the handler's span as its child. Invalid or missing trace headers
// only mean the span starts a new trace.
func startSpan(ctx context.Context, tracer trace.Tracer, cmd *Command) (context.Context, trace.Span) {
	carrier := mapCarrier{}
	for _, k := range []string{hTraceparent, hTracestate} {
		if v, ok := cmd.Headers[k]; ok {
			carrier[k] = v
		}
	}
	parent := traceContext.Extract(ctx, carrier)
	ctx, span := tracer.Start(parent, "saga.command "+cmd.Type,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.destination.name", cmd.Topic),
			attribute.String("saga.id", cmd.SagaID),
			attribute.String("saga.command_id", cmd.CommandID),
			attribute.String("saga.step", cmd.Step),
		))
	// Without an OpenTelemetry SDK the tracer is a no-op and its span is the
	// parent's context itself; the reply must still name a span of its own,
	// so make a child span context by hand (same trace, new span id).
	parentSC := trace.SpanContextFromContext(parent)
	if sc := span.SpanContext(); parentSC.IsValid() && sc.Equal(parentSC) {
		ctx = trace.ContextWithSpanContext(ctx, childSpanContext(parentSC))
	}
	return ctx, span
}

// childSpanContext returns a span context in parent's trace with a new span id.
func childSpanContext(parent trace.SpanContext) trace.SpanContext {
	var id trace.SpanID
	for !id.IsValid() {
		_, _ = rand.Read(id[:])
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    parent.TraceID(),
		SpanID:     id,
		TraceFlags: parent.TraceFlags(),
		TraceState: parent.TraceState(),
		Remote:     false,
	})
}

// traceHeaders returns the traceparent and tracestate of the span in ctx, for
// the reply (section 7.4); both are "" when ctx holds no valid span.
func traceHeaders(ctx context.Context) (traceparent, tracestate string) {
	carrier := mapCarrier{}
	traceContext.Inject(ctx, carrier)
	return carrier[hTraceparent], carrier[hTracestate]
}
