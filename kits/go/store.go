package kit

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Table names, created under Config.Schema.
const (
	processedTable = "saga_go_processed_commands"
	outboxTable    = "saga_go_reply_outbox"
	// ledgerTable is the drill's ledger (Config.DrillLedger): the Python kit's
	// table, same name and columns. No uniqueness on command_id: a second
	// application must show as a second row.
	ledgerTable = "drill_ledger"
)

// tombstoneError is the stored answer of a forward command whose compensation
// came first (section 7.2, step 3a).
const tombstoneError = "compensated before it arrived"

// store holds the kit's SQL.
type store struct {
	pool      *pgxpool.Pool
	schema    string
	processed string // quoted schema.table
	outbox    string
	ledger    string
}

func newStore(pool *pgxpool.Pool, schema string) *store {
	return &store{
		pool:      pool,
		schema:    schema,
		processed: pgx.Identifier{schema, processedTable}.Sanitize(),
		outbox:    pgx.Identifier{schema, outboxTable}.Sanitize(),
		ledger:    pgx.Identifier{schema, ledgerTable}.Sanitize(),
	}
}

// migrateLedger creates the drill's ledger if absent.
func (s *store) migrateLedger(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.ledger+` (
		command_id   text        NOT NULL,
		command_type text        NOT NULL,
		saga_id      text        NOT NULL,
		step         text        NOT NULL,
		compensation boolean     NOT NULL,
		at           timestamptz NOT NULL DEFAULT clock_timestamp(),
		seq          bigserial
	)`)
	if err != nil {
		return fmt.Errorf("migrate the drill ledger: %w", err)
	}
	return nil
}

// recordApplication writes cmd's ledger row in tx, the transaction applying it.
func (s *store) recordApplication(ctx context.Context, tx pgx.Tx, cmd *Command) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+s.ledger+
		` (command_id, command_type, saga_id, step, compensation) VALUES ($1, $2, $3, $4, $5)`,
		cmd.CommandID, cmd.Type, cmd.SagaID, cmd.Step, cmd.Compensation)
	return err
}

// migrate creates the schema and tables if absent, under an advisory lock so
// that instances starting together do not race on CREATE TABLE.
func (s *store) migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		stmts := []string{
			`SELECT pg_advisory_xact_lock(hashtext('saga_go_kit_migrate'))`,
			`CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{s.schema}.Sanitize(),
			`CREATE TABLE IF NOT EXISTS ` + s.processed + ` (
				command_id   text PRIMARY KEY,
				saga_id      text NOT NULL,
				step         text NOT NULL DEFAULT '',
				command_type text NOT NULL DEFAULT '',
				outcome      text,
				reply        bytea,
				created_at   timestamptz NOT NULL DEFAULT now(),
				answered_at  timestamptz
			)`,
			`CREATE TABLE IF NOT EXISTS ` + s.outbox + ` (
				id            bigserial PRIMARY KEY,
				command_id    text NOT NULL,
				topic         text NOT NULL,
				key           bytea,
				header_names  text[] NOT NULL,
				header_values bytea[] NOT NULL,
				value         bytea NOT NULL,
				created_at    timestamptz NOT NULL DEFAULT now(),
				published_at  timestamptz
			)`,
			`CREATE INDEX IF NOT EXISTS ` + pgx.Identifier{outboxTable + "_unpublished"}.Sanitize() +
				` ON ` + s.outbox + ` (id) WHERE published_at IS NULL`,
		}
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
		}
		return nil
	})
}

// claim inserts the command id (step 2). claimed is false when the id was
// answered before; the stored reply is then returned.
func (s *store) claim(ctx context.Context, tx pgx.Tx, cmd *Command) (claimed bool, stored []byte, err error) {
	tag, err := tx.Exec(ctx, `INSERT INTO `+s.processed+` (command_id, saga_id, step, command_type)
		VALUES ($1, $2, $3, $4) ON CONFLICT (command_id) DO NOTHING`,
		cmd.CommandID, cmd.SagaID, cmd.Step, cmd.Type)
	if err != nil {
		return false, nil, fmt.Errorf("claim: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil, nil
	}
	err = tx.QueryRow(ctx, `SELECT reply FROM `+s.processed+` WHERE command_id = $1`, cmd.CommandID).Scan(&stored)
	if err != nil {
		return false, nil, fmt.Errorf("read the stored reply: %w", err)
	}
	if stored == nil {
		return false, nil, fmt.Errorf("command %s is claimed without a reply", cmd.CommandID)
	}
	return false, stored, nil
}

// record inserts the outcome of cmd with its reply, and the reply's outbox
// row, in one statement: the claim of an optimistic pass (process.go). It
// reports false, having written nothing, when the command id is stored
// already: a copy answered before, or meanwhile by another transaction (the
// primary key makes the insert wait for that transaction to end).
func (s *store) record(ctx context.Context, tx pgx.Tx, cmd *Command, outcome string, row *outboxRow) (bool, error) {
	names, values := headerColumns(row.headers)
	err := tx.QueryRow(ctx, `WITH claimed AS (
			INSERT INTO `+s.processed+` (command_id, saga_id, step, command_type, outcome, reply, answered_at)
			VALUES ($1, $2, $3, $4, $5, $6, now()) ON CONFLICT (command_id) DO NOTHING
			RETURNING command_id)
		INSERT INTO `+s.outbox+` (command_id, topic, key, header_names, header_values, value)
		SELECT command_id, $7, $8, $9, $10, $6 FROM claimed RETURNING id`,
		cmd.CommandID, cmd.SagaID, cmd.Step, cmd.Type, outcome, row.value,
		row.topic, row.key, names, values).Scan(&row.id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store the reply: %w", err)
	}
	return true, nil
}

// stored reports whether cmd's outcome is stored (committed). A read that
// fails proves nothing: true.
func (s *store) stored(ctx context.Context, cmd *Command) bool {
	var found bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.processed+` WHERE command_id = $1)`,
		cmd.CommandID).Scan(&found)
	return err != nil || found
}

// tombstones records the forward command ids a compensation undoes as
// answered with a failure (step 3a), then reports whether one of them has a
// stored success (section 7.3).
func (s *store) tombstones(ctx context.Context, tx pgx.Tx, cmd *Command) (forwardApplied bool, err error) {
	if len(cmd.Compensates) == 0 {
		return false, nil
	}
	body, err := failureBody(tombstoneError, map[string]any{"compensated_by": cmd.CommandID}).encode()
	if err != nil {
		return false, err
	}
	for _, id := range cmd.Compensates {
		if strings.ContainsRune(id, 0) || id == cmd.CommandID {
			continue
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+s.processed+`
			(command_id, saga_id, step, command_type, outcome, reply, answered_at)
			VALUES ($1, $2, $3, '', 'failure', $4, now()) ON CONFLICT (command_id) DO NOTHING`,
			id, cmd.SagaID, cmd.Step, body)
		if err != nil {
			return false, fmt.Errorf("tombstone: %w", err)
		}
	}
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.processed+`
		WHERE command_id = ANY($1) AND outcome = 'success')`, cmd.Compensates).Scan(&forwardApplied)
	if err != nil {
		return false, fmt.Errorf("read the forward outcomes: %w", err)
	}
	return forwardApplied, nil
}

// outboxRow is one reply waiting in the outbox.
type outboxRow struct {
	id      int64
	topic   string
	key     []byte
	headers []Header
	value   []byte
}

// answer stores the reply in the claimed row and writes the outbox row, in
// tx (step 6), in one statement.
func (s *store) answer(ctx context.Context, tx pgx.Tx, cmd *Command, outcome string, row *outboxRow) error {
	names, values := headerColumns(row.headers)
	err := tx.QueryRow(ctx, `WITH answered AS (
			UPDATE `+s.processed+` SET outcome = $2, reply = $3, answered_at = now()
			WHERE command_id = $1 RETURNING command_id)
		INSERT INTO `+s.outbox+` (command_id, topic, key, header_names, header_values, value)
		SELECT command_id, $4, $5, $6, $7, $3 FROM answered RETURNING id`,
		cmd.CommandID, outcome, row.value, row.topic, row.key, names, values).Scan(&row.id)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("store the reply: command %s is not claimed", cmd.CommandID)
	}
	if err != nil {
		return fmt.Errorf("store the reply and its outbox row: %w", err)
	}
	return nil
}

// headerColumns splits headers into the outbox's name and value columns.
func headerColumns(headers []Header) (names []string, values [][]byte) {
	names = make([]string, len(headers))
	values = make([][]byte, len(headers))
	for i, h := range headers {
		names[i], values[i] = h.Key, h.Value
	}
	return names, values
}

// unpublished returns the outbox rows not marked published, oldest first.
func (s *store) unpublished(ctx context.Context, limit int) ([]outboxRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, topic, key, header_names, header_values, value
		FROM `+s.outbox+` WHERE published_at IS NULL ORDER BY id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		var names []string
		var values [][]byte
		if err := rows.Scan(&r.id, &r.topic, &r.key, &names, &values, &r.value); err != nil {
			return nil, err
		}
		for i := range names {
			if i < len(values) {
				r.headers = append(r.headers, Header{Key: names[i], Value: values[i]})
			}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func (s *store) markPublished(ctx context.Context, id int64) error {
	_, err := s.pool.Exec(ctx, `UPDATE `+s.outbox+` SET published_at = now() WHERE id = $1`, id)
	return err
}

// transient reports whether a database error is worth waiting out (the
// connection, a serialization failure or deadlock, the server shutting down)
// rather than a bug.
func transient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "40", "53", "57", "58":
			return true
		}
		return pgErr.Code == "55P03" // lock_not_available
	}
	return true // not a server error: the connection, the network, a timeout
}
