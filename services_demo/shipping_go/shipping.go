package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5"

	kit "github.com/saga-engine/saga-engine/kits/go"
)

// ddl is the service's table, created in its schema (as the Python shipping
// service that this one replaced created it).
const ddl = `
CREATE TABLE IF NOT EXISTS shipments (
    order_id    text PRIMARY KEY,
    shipment_id text NOT NULL UNIQUE,
    customer    text NOT NULL,
    status      text NOT NULL CHECK (status IN ('scheduled', 'cancelled')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
`

// The messages of services_demo/contracts.py.

// Item is a line of an order.
type Item struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// ScheduleShipment books the carrier for an order.
type ScheduleShipment struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Items    []Item `json:"items"`
}

// ShipmentScheduled is ScheduleShipment's reply.
type ShipmentScheduled struct {
	OrderID    string `json:"order_id"`
	ShipmentID string `json:"shipment_id"`
}

// CancelShipment cancels an order's shipment, if one was scheduled.
type CancelShipment struct {
	OrderID string `json:"order_id"`
}

// ShipmentCancelled is CancelShipment's reply.
type ShipmentCancelled struct {
	OrderID   string `json:"order_id"`
	Cancelled bool   `json:"cancelled"`
}

// lockKey is the advisory lock of services_demo._service.prepare_schema: the
// first 8 bytes of sha256("demo:{schema}"), a signed big-endian integer.
func lockKey(schema string) int64 {
	sum := sha256.Sum256([]byte("demo:" + schema))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// prepareSchema creates the schema and the shipments table (idempotent, under
// the same lock as the Python services' prepare_schema).
func prepareSchema(ctx context.Context, dsn, schema string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	quoted := pgx.Identifier{schema}.Sanitize()
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, stmt := range []string{
			fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", lockKey(schema)),
			"CREATE SCHEMA IF NOT EXISTS " + quoted,
			"SET LOCAL search_path TO " + quoted,
			ddl,
			labelsDDL,
		} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
}

// shipmentID is the id of a new shipment: "shp-" and the first 12 characters
// of the command id.
func shipmentID(commandID string) string {
	if len(commandID) > 12 {
		commandID = commandID[:12]
	}
	return "shp-" + commandID
}

// register adds the service's handlers to the participant.
func (s *service) register(k *kit.Kit) {
	k.Handle("ScheduleShipment", s.schedule, kit.WithModel(validateScheduleShipment))
	k.Handle("CancelShipment", s.cancel, kit.WithModel(validateCancelShipment))
	k.Handle("PrintLabel", s.printLabel, kit.WithModel(validatePrintLabel))
	k.Handle("VoidLabel", s.voidLabel, kit.WithModel(validateVoidLabel))
	// Sorted, as the Python kit lists them.
	s.commands = []string{"CancelShipment", "PrintLabel", "ScheduleShipment", "VoidLabel"}
}

func (s *service) schedule(ctx context.Context, tx pgx.Tx, cmd kit.Command) (any, error) {
	var body ScheduleShipment
	if err := cmd.Decode(&body); err != nil {
		return nil, err
	}
	if s.unshippable[body.Customer] {
		return nil, kit.Reject(fmt.Sprintf("cannot ship to %s: the address is outside our area", body.Customer), nil)
	}
	var id string
	err := tx.QueryRow(ctx,
		"INSERT INTO shipments (order_id, shipment_id, customer, status) "+
			"VALUES ($1, $2, $3, 'scheduled') "+
			"ON CONFLICT (order_id) DO UPDATE SET updated_at = now() RETURNING shipment_id",
		body.OrderID, shipmentID(cmd.CommandID), body.Customer,
	).Scan(&id)
	if err != nil {
		return nil, err
	}
	return ShipmentScheduled{OrderID: body.OrderID, ShipmentID: id}, nil
}

func (s *service) cancel(ctx context.Context, tx pgx.Tx, cmd kit.Command) (any, error) {
	var body CancelShipment
	if err := cmd.Decode(&body); err != nil {
		return nil, err
	}
	tag, err := tx.Exec(ctx,
		"UPDATE shipments SET status = 'cancelled', updated_at = now() "+
			"WHERE order_id = $1 AND status = 'scheduled'",
		body.OrderID,
	)
	if err != nil {
		return nil, err
	}
	return ShipmentCancelled{OrderID: body.OrderID, Cancelled: tag.RowsAffected() == 1}, nil
}
