package kit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
)

// handlerError is a handler's unexpected failure (section 7.2 step 5): the
// transaction is rolled back and the handler tried again, up to
// Config.HandlerAttempts times, before the command is answered retryable.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// engineError is a failure of the kit's own on a record that waiting will
// not cure: the record is dead-lettered as engine_error.
type engineError struct{ err error }

func (e *engineError) Error() string { return e.err.Error() }
func (e *engineError) Unwrap() error { return e.err }

// process runs steps 2-6 of section 7.2 for a command that passed checks 1-15
// (v.kind is verdictProcess, or verdictAnswer with the failure reply of check
// 16, 17 or 18). It returns the reply to publish: an outbox row (id set) for
// a new answer, or the stored reply built for this copy (id 0) for a
// duplicate. It waits out an unreachable database; it returns an error only
// when ctx ends, or an *engineError.
func (k *Kit) process(ctx context.Context, v verdict) (*outboxRow, error) {
	cmd := v.cmd
	if err := k.ensureTopic(ctx, cmd.ReplyTo); err != nil {
		return nil, err
	}
	spanCtx, span := startSpan(ctx, k.tracer, cmd)
	defer span.End()

	var lastErr error
	failures := 0
	for retry := 0; ; retry++ {
		v.attempt = failures + 1
		row, err := k.attempt(spanCtx, v)
		if err == nil {
			if v.kind == verdictAnswer {
				span.SetStatus(codes.Error, v.detail)
			}
			return row, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var he *handlerError
		switch {
		case errors.As(err, &he) && v.answer == nil:
			// Only a handler's run counts as an attempt: a command answered by
			// check 16, 17 or 18 keeps that answer, however often its
			// transaction has to be tried again.
			failures++
			lastErr = he.err
			span.RecordError(he.err)
			k.log.Warn("handler failed", "command_id", cmd.CommandID, "type", cmd.Type, "attempt", failures, "error", he.err)
		case transient(err):
			k.log.Warn("database unavailable; waiting", "command_id", cmd.CommandID, "error", err)
		default:
			return nil, &engineError{err}
		}
		if failures >= k.cfg.HandlerAttempts {
			break
		}
		// A handler's failure waits the handler pace; the database away, the
		// outage pace.
		d := paceOutage.delay(retry + 1)
		if errors.As(err, &he) {
			d = k.handlerDelay(failures)
		}
		if !sleep(ctx, d) {
			return nil, ctx.Err()
		}
	}
	// Still failing: answer retryable, in a transaction of its own, and never
	// apply this command id afterwards (section 7.3).
	span.SetStatus(codes.Error, lastErr.Error())
	msg := truncateRunes(fmt.Sprintf("%s failed %d times: %v", cmd.Type, failures, lastErr), 2000)
	body := replyBody{Outcome: OutcomeRetryable, Error: &msg}
	for retry := 0; ; retry++ {
		row, err := k.attemptAnswer(spanCtx, cmd, body)
		if err == nil {
			return row, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !transient(err) {
			return nil, &engineError{err}
		}
		k.log.Warn("database unavailable; waiting", "command_id", cmd.CommandID, "error", err)
		if !sleep(ctx, paceOutage.delay(retry+1)) {
			return nil, ctx.Err()
		}
	}
}

// attempt is one transaction: claim, tombstones, the handler (or the answer
// of a failed check), the stored reply and its outbox row.
func (k *Kit) attempt(ctx context.Context, v verdict) (*outboxRow, error) {
	cmd := v.cmd
	tx, err := k.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	claimed, stored, err := k.store.claim(ctx, tx, cmd)
	if err != nil {
		return nil, err
	}
	if !claimed {
		if err := tx.Commit(ctx); err != nil {
			return nil, err
		}
		row := k.replyRow(ctx, cmd, stored)
		row.headers = append(row.headers, timingHeaders(cmd, handlerTimes{}, time.Now())...)
		return row, nil
	}
	if cmd.ForwardApplied, err = k.store.tombstones(ctx, tx, cmd); err != nil {
		return nil, err
	}
	var body replyBody
	var ran handlerTimes
	if v.answer != nil {
		body = *v.answer
	} else if body, err = k.runHandler(ctx, tx, v.handler, k.withProgress(*cmd, v.attempt), &ran); err != nil {
		return nil, err
	} else if k.cfg.DrillLedger && body.Outcome == OutcomeSuccess {
		// In this transaction: the ledger row commits with the handler's effects.
		if err := k.store.recordApplication(ctx, tx, cmd); err != nil {
			return nil, err
		}
	}
	value, err := body.encode()
	if err != nil {
		return nil, &handlerError{err}
	}
	if k.blobs != nil {
		// A large reply by reference: its blob kept before this transaction
		// commits, so the reply stored and sent never names a missing blob.
		if value, _, err = k.blobs.seal(ctx, cmd.SagaID, value); err != nil {
			return nil, err
		}
	}
	row := k.replyRow(ctx, cmd, value)
	if err := k.store.answer(ctx, tx, cmd, body.Outcome, row); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		// The handler's deferred constraints are checked here; a lost
		// connection is retried too (a commit that did happen shows as a
		// duplicate next time).
		return nil, &handlerError{fmt.Errorf("commit: %w", err)}
	}
	// After the commit, for the reply sent now (the outbox row stored has none).
	row.headers = append(row.headers, timingHeaders(cmd, ran, time.Now())...)
	return row, nil
}

// attemptAnswer stores body as the answer of cmd without running a handler
// (the retryable answer of section 7.3), unless cmd was answered meanwhile.
func (k *Kit) attemptAnswer(ctx context.Context, cmd *Command, body replyBody) (*outboxRow, error) {
	return k.attempt(ctx, verdict{kind: verdictAnswer, cmd: cmd, answer: &body})
}

// runHandler runs h in a savepoint of tx (section 7.2 step 5). A *Rejected
// rolls back to the savepoint and gives a failure reply; any other error (or
// a panic) is a *handlerError, after which the caller rolls everything back.
func (k *Kit) runHandler(ctx context.Context, tx pgx.Tx, h *handler, cmd Command, ran *handlerTimes) (replyBody, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return replyBody{}, err
	}
	ran.start = time.Now()
	payload, herr := callHandler(ctx, h.fn, sp, cmd)
	ran.end = time.Now()
	if herr != nil {
		var rej *Rejected
		if errors.As(herr, &rej) {
			if err := sp.Rollback(ctx); err != nil {
				return replyBody{}, err
			}
			return failureBody(rej.Reason, rej.Details), nil
		}
		return replyBody{}, &handlerError{herr}
	}
	obj, err := payloadObject(payload)
	if err != nil {
		return replyBody{}, &handlerError{err}
	}
	if k.blobs != nil && len(obj) > k.blobs.cfg.MaxBytes {
		// A reply by reference larger than any reference may name: refused once,
		// the handler's writes undone, as a Rejected (the Python kit's rule).
		if err := sp.Rollback(ctx); err != nil {
			return replyBody{}, err
		}
		msg := fmt.Sprintf("the reply of the %s handler is %d bytes, over the limit of %d bytes (SAGA_CODEC__BLOBS__MAX_BYTES): nothing was applied; return a smaller result", cmd.Type, len(obj), k.blobs.cfg.MaxBytes)
		return failureBody(msg, map[string]any{"size_bytes": len(obj), "limit_bytes": k.blobs.cfg.MaxBytes}), nil
	}
	if err := sp.Commit(ctx); err != nil { // RELEASE SAVEPOINT
		return replyBody{}, &handlerError{fmt.Errorf("release the handler's savepoint: %w", err)}
	}
	return replyBody{Outcome: OutcomeSuccess, Payload: obj}, nil
}

func callHandler(ctx context.Context, fn HandlerFunc, tx pgx.Tx, cmd Command) (payload any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return fn(ctx, tx, cmd)
}

// replyRow builds the reply record answering the copy cmd with value: topic
// ce_replyto, key the saga id, headers of section 7.4.
func (k *Kit) replyRow(ctx context.Context, cmd *Command, value []byte) *outboxRow {
	traceparent, tracestate := traceHeaders(ctx)
	headers := replyHeaders(k.source, cmd, time.Now(), traceparent, tracestate)
	if isRefValue(value) {
		headers = append(headers, Header{Key: hCodec, Value: []byte(refCodec)})
	}
	return &outboxRow{
		topic:   cmd.ReplyTo,
		key:     []byte(cmd.SagaID),
		headers: headers,
		value:   value,
	}
}
