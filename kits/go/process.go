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

// errClaimLost: an optimistic pass's outcome insert found the command id
// stored by another transaction (a copy answered before, or meanwhile on
// another instance). The pass is rolled back, the handler's writes with it,
// and the locked way answers the copy from the stored reply.
var errClaimLost = errors.New("the command's outcome is stored already")

// refusal is a handler's refusal (a *Rejected, or a reply too large) on a
// pass without a savepoint (an optimistic one): the whole transaction is
// rolled back, and the locked way records the refusal as it was given.
type refusal struct {
	body replyBody
	ran  handlerTimes
}

func (r *refusal) Error() string { return "refused: " + *r.body.Error }

// optimistic reports whether a pass at cmd may be claimed by the insert of
// its outcome alone (process): BEGIN, the handler, one statement inserting
// the outcome and its outbox row (ON CONFLICT DO NOTHING), COMMIT; no claim
// before the handler, no savepoint. Not when its handler acts outside its
// transaction (it would have acted for a copy before the insert finds the
// copy), nor for a compensation (its tombstones are claimed under the lock
// before any handler runs, as a late forward command claims itself), nor for
// an attempt after the handler failed (it would run twice per attempt if it
// failed again: the optimistic pass and the locked one).
func optimistic(cmd *Command, h *handler, attempt int) bool {
	if cmd.Compensation || len(cmd.Compensates) > 0 || attempt > 1 {
		return false
	}
	return h == nil || h.effects != EffectsOutside
}

// process runs steps 2-6 of section 7.2 for a command that passed checks 1-15
// (v.kind is verdictProcess, or verdictAnswer with the failure reply of check
// 16, 17 or 18). It returns the reply to publish: an outbox row (id set) for
// a new answer, or the stored reply built for this copy (id 0) for a
// duplicate. It waits out an unreachable database; it returns an error only
// when ctx ends, or an *engineError.
//
// The first pass is optimistic when it may be (optimistic): claimed by its
// outcome's insert alone. One that fails goes again the locked way (claim,
// tombstones, the handler in a savepoint, the reply stored), which answers a
// copy from its stored reply, and records a refusal heard on the optimistic
// pass without asking the handler again. A handler that failed on it failed
// as on the locked way (its attempt counted, the next after the handler's
// pause), unless the command's outcome is stored: it may have failed for
// being a copy (a business key the first one wrote), and the locked way tells.
func (k *Kit) process(ctx context.Context, v verdict) (*outboxRow, error) {
	cmd := v.cmd
	if err := k.ensureTopic(ctx, cmd.ReplyTo); err != nil {
		return nil, err
	}
	spanCtx, span := startSpan(ctx, k.tracer, cmd)
	defer span.End()

	var lastErr error
	failures := 0
	byInsert := optimistic(cmd, v.handler, 1)
	for retry := 0; ; retry++ {
		v.attempt = failures + 1
		row, err := k.attempt(spanCtx, v, byInsert)
		if err == nil {
			if v.kind == verdictAnswer {
				span.SetStatus(codes.Error, v.detail)
			}
			return row, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		wasByInsert := byInsert
		byInsert = false // every pass after a failed one goes the locked way
		var he *handlerError
		var refused *refusal
		switch {
		case errors.Is(err, errClaimLost):
			k.claimsLost.Add(1)
			continue
		case errors.As(err, &refused):
			v.refused = refused
			continue
		case errors.As(err, &he) && v.answer == nil:
			if wasByInsert && k.store.stored(ctx, cmd) {
				continue
			}
			// Only a handler's run counts as an attempt: a command answered by
			// check 16, 17 or 18 keeps that answer, however often its
			// transaction has to be tried again.
			failures++
			lastErr = he.err
			span.RecordError(he.err)
			k.log.Warn("handler failed", "command_id", cmd.CommandID, "type", cmd.Type, "attempt", failures, "error", he.err)
		case transient(err):
			k.log.Warn("database unavailable; waiting", "command_id", cmd.CommandID, "error", err)
		case wasByInsert:
			// A statement of the optimistic pass failed (the handler's
			// transaction aborted by an error it swallowed, say): the locked
			// way tells whether the command is to blame.
			k.log.Info("the optimistic pass failed; going the locked way", "command_id", cmd.CommandID, "error", err)
			continue
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

// attempt is one transaction. Locked (byInsert false): claim, tombstones, the
// handler in a savepoint (or the answer of a failed check), the stored reply
// and its outbox row. Optimistic (byInsert): the handler, then the outcome
// and its outbox row inserted in one statement, which is the claim
// (errClaimLost when it finds the command stored).
func (k *Kit) attempt(ctx context.Context, v verdict, byInsert bool) (*outboxRow, error) {
	cmd := v.cmd
	tx, err := k.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if !byInsert {
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
	}
	body, ran, err := k.answerOf(ctx, tx, v, !byInsert)
	if err != nil {
		return nil, err
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
	if byInsert {
		inserted, err := k.store.record(ctx, tx, cmd, body.Outcome, row)
		if err != nil {
			return nil, err
		}
		if !inserted {
			return nil, errClaimLost
		}
		// Inserted, not committed: a death here undoes the outcome and the
		// handler's writes, and a copy then finds nothing stored.
		k.checkpoint(CrashAfterOptimisticInsert)
	} else if err := k.store.answer(ctx, tx, cmd, body.Outcome, row); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		// The handler's deferred constraints are checked here; a lost
		// connection is retried too (a commit that did happen shows as a
		// duplicate next time).
		return nil, &handlerError{fmt.Errorf("commit: %w", err)}
	}
	k.checkpoint(CrashAfterCommit)
	// After the commit, for the reply sent now (the outbox row stored has none).
	row.headers = append(row.headers, timingHeaders(cmd, ran, time.Now())...)
	return row, nil
}

// answerOf is the answer of a command in tx: the answer of its failed check,
// the refusal heard on an optimistic pass, or its handler's (in a savepoint
// when savepoint is set), with the drill's ledger row of a success.
func (k *Kit) answerOf(ctx context.Context, tx pgx.Tx, v verdict, savepoint bool) (replyBody, handlerTimes, error) {
	var ran handlerTimes
	switch {
	case v.answer != nil:
		return *v.answer, ran, nil
	case v.refused != nil:
		return v.refused.body, v.refused.ran, nil
	}
	body, err := k.runHandler(ctx, tx, v.handler, k.withProgress(*v.cmd, v.attempt), &ran, savepoint)
	if err != nil {
		return replyBody{}, ran, err
	}
	if k.cfg.DrillLedger && body.Outcome == OutcomeSuccess {
		// In this transaction: the ledger row commits with the handler's effects.
		if err := k.store.recordApplication(ctx, tx, v.cmd); err != nil {
			return replyBody{}, ran, err
		}
	}
	return body, ran, nil
}

// attemptAnswer stores body as the answer of cmd without running a handler
// (the retryable answer of section 7.3), unless cmd was answered meanwhile.
func (k *Kit) attemptAnswer(ctx context.Context, cmd *Command, body replyBody) (*outboxRow, error) {
	return k.attempt(ctx, verdict{kind: verdictAnswer, cmd: cmd, answer: &body}, false)
}

// runHandler runs h in tx (section 7.2 step 5): in a savepoint of it when
// savepoint is set, so that a *Rejected rolls back to the savepoint and gives
// a failure reply; without one (an optimistic pass), a refusal is a
// *refusal, after which the caller rolls everything back. Any other error (or
// a panic) is a *handlerError, after which the caller rolls everything back.
func (k *Kit) runHandler(ctx context.Context, tx pgx.Tx, h *handler, cmd Command, ran *handlerTimes, savepoint bool) (replyBody, error) {
	if savepoint {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return replyBody{}, err
		}
		tx = sp
	}
	ran.start = time.Now()
	payload, herr := callHandler(ctx, h.fn, handlerTx{tx}, cmd)
	ran.end = time.Now()
	if herr != nil {
		var rej *Rejected
		if errors.As(herr, &rej) {
			return refuse(ctx, tx, savepoint, failureBody(rej.Reason, rej.Details), *ran)
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
		msg := fmt.Sprintf("the reply of the %s handler is %d bytes, over the limit of %d bytes (SAGA_CODEC__BLOBS__MAX_BYTES): nothing was applied; return a smaller result", cmd.Type, len(obj), k.blobs.cfg.MaxBytes)
		return refuse(ctx, tx, savepoint, failureBody(msg, map[string]any{"size_bytes": len(obj), "limit_bytes": k.blobs.cfg.MaxBytes}), *ran)
	}
	if savepoint {
		if err := tx.Commit(ctx); err != nil { // RELEASE SAVEPOINT
			return replyBody{}, &handlerError{fmt.Errorf("release the handler's savepoint: %w", err)}
		}
	}
	return replyBody{Outcome: OutcomeSuccess, Payload: obj}, nil
}

// refuse undoes a refusing handler's writes: with a savepoint, rolled back to
// it (the claim kept), body is the answer; without one, a *refusal.
func refuse(ctx context.Context, tx pgx.Tx, savepoint bool, body replyBody, ran handlerTimes) (replyBody, error) {
	if !savepoint {
		return replyBody{}, &refusal{body: body, ran: ran}
	}
	if err := tx.Rollback(ctx); err != nil {
		return replyBody{}, err
	}
	return body, nil
}

// handlerTx is the tx a handler is given: the kit's transaction, or a
// savepoint of it, which only the kit commits or rolls back.
type handlerTx struct{ pgx.Tx }

var errHandlerEndsTx = errors.New("kit: the kit commits or rolls back a handler's tx: return a result, a *kit.Rejected or an error instead")

func (handlerTx) Commit(context.Context) error   { return errHandlerEndsTx }
func (handlerTx) Rollback(context.Context) error { return errHandlerEndsTx }

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
