package main

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/jackc/pgx/v5"

	kit "github.com/saga-engine/saga-engine/kits/go"
)

// labelsDDL is the table of the fulfilment saga's labels, beside the shipments.
const labelsDDL = `
CREATE TABLE IF NOT EXISTS labels (
    order_id   text PRIMARY KEY,
    tracking   text NOT NULL UNIQUE,
    customer   text NOT NULL,
    parcel_id  text NOT NULL,
    invoice_id text NOT NULL,
    status     text NOT NULL CHECK (status IN ('printed', 'void')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
`

// PrintLabel prints a parcel's shipping label (the fulfilment saga's label node).
type PrintLabel struct {
	OrderID   string `json:"order_id"`
	Customer  string `json:"customer"`
	ParcelID  string `json:"parcel_id"`
	InvoiceID string `json:"invoice_id"`
}

// LabelPrinted is PrintLabel's reply.
type LabelPrinted struct {
	OrderID  string `json:"order_id"`
	Tracking string `json:"tracking"`
}

// VoidLabel voids an order's label, if one was printed (PrintLabel's compensation).
type VoidLabel struct {
	OrderID string `json:"order_id"`
}

// LabelVoided is VoidLabel's reply.
type LabelVoided struct {
	OrderID string `json:"order_id"`
	Voided  bool   `json:"voided"`
}

// trackingNumber is the tracking number of a new label: "trk-" and the first
// 12 characters of the command id.
func trackingNumber(commandID string) string {
	if len(commandID) > 12 {
		commandID = commandID[:12]
	}
	return "trk-" + commandID
}

// printLabel prints the label once per order: the same order again answers the
// label it has (printed again, same tracking number, if it was voided).
func (s *service) printLabel(ctx context.Context, tx pgx.Tx, cmd kit.Command) (any, error) {
	var body PrintLabel
	if err := cmd.Decode(&body); err != nil {
		return nil, err
	}
	var tracking string
	err := tx.QueryRow(ctx,
		"INSERT INTO labels (order_id, tracking, customer, parcel_id, invoice_id, status) "+
			"VALUES ($1, $2, $3, $4, $5, 'printed') "+
			"ON CONFLICT (order_id) DO UPDATE SET parcel_id = $4, invoice_id = $5, "+
			"status = 'printed', updated_at = now() RETURNING tracking",
		body.OrderID, trackingNumber(cmd.CommandID), body.Customer, body.ParcelID, body.InvoiceID,
	).Scan(&tracking)
	if err != nil {
		return nil, err
	}
	return LabelPrinted{OrderID: body.OrderID, Tracking: tracking}, nil
}

func (s *service) voidLabel(ctx context.Context, tx pgx.Tx, cmd kit.Command) (any, error) {
	var body VoidLabel
	if err := cmd.Decode(&body); err != nil {
		return nil, err
	}
	tag, err := tx.Exec(ctx,
		"UPDATE labels SET status = 'void', updated_at = now() "+
			"WHERE order_id = $1 AND status = 'printed'",
		body.OrderID,
	)
	if err != nil {
		return nil, err
	}
	return LabelVoided{OrderID: body.OrderID, Voided: tag.RowsAffected() == 1}, nil
}

func validatePrintLabel(body json.RawMessage) error {
	return checkBody(body, func(c *checker, members map[string]json.RawMessage) {
		for _, name := range []string{"order_id", "customer", "parcel_id", "invoice_id"} {
			c.str(members, name, name)
		}
	})
}

func validateVoidLabel(body json.RawMessage) error {
	return checkBody(body, func(c *checker, members map[string]json.RawMessage) {
		c.str(members, "order_id", "order_id")
	})
}

type labelRow struct {
	OrderID   string `json:"order_id"`
	Tracking  string `json:"tracking"`
	Customer  string `json:"customer"`
	ParcelID  string `json:"parcel_id"`
	InvoiceID string `json:"invoice_id"`
	Status    string `json:"status"`
}

// label answers GET /labels/{order_id}.
func (s *service) label(w http.ResponseWriter, r *http.Request) {
	orderID := r.PathValue("order_id")
	var row labelRow
	err := s.pool.QueryRow(r.Context(),
		"SELECT order_id, tracking, customer, parcel_id, invoice_id, status FROM labels WHERE order_id = $1",
		orderID,
	).Scan(&row.OrderID, &row.Tracking, &row.Customer, &row.ParcelID, &row.InvoiceID, &row.Status)
	writeFound(w, "label", orderID, row, err)
}
