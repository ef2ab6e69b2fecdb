package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// service is the running service: what its routes read.
type service struct {
	name        string
	schema      string
	pool        *pgxpool.Pool
	unshippable map[string]bool
	commands    []string
	group       groupWatch
}

// groupWatch is a kgo hook given to both of the kit's Kafka clients: it keeps
// the one that consumes in a group, to tell whether it has joined.
type groupWatch struct{ consumer atomic.Pointer[kgo.Client] }

// OnNewClient implements kgo.HookNewClient.
func (g *groupWatch) OnNewClient(cl *kgo.Client) {
	if group, _ := cl.OptValue(kgo.ConsumerGroup).(string); group != "" {
		g.consumer.Store(cl)
	}
}

// joined reports whether the consumer has had a generation of its group: its
// join completed at least once (a member keeps it while it rejoins).
func (g *groupWatch) joined() bool {
	cl := g.consumer.Load()
	if cl == nil {
		return false
	}
	_, generation := cl.GroupMetadata()
	return generation > 0
}

// routes answers as the demo's FastAPI services do:
// JSON bodies, errors as {"detail": ...}.
func (s *service) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /shipments/{order_id}", s.shipment)
	mux.HandleFunc("GET /labels/{order_id}", s.label)
	notAllowed := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET")
		writeJSON(w, http.StatusMethodNotAllowed, detail("Method Not Allowed"))
	}
	mux.HandleFunc("/health", notAllowed)
	mux.HandleFunc("/shipments/{order_id}", notAllowed)
	mux.HandleFunc("/labels/{order_id}", notAllowed)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, detail("Not Found"))
	})
	return mux
}

type healthBody struct {
	Service  string   `json:"service"`
	Status   string   `json:"status"`
	Schema   string   `json:"schema"`
	Commands []string `json:"commands"`
}

// health answers 200 once the service's schema, pool and participant are up
// (the participant has joined its consumer group), 503 before.
func (s *service) health(w http.ResponseWriter, r *http.Request) {
	if !s.group.joined() {
		writeJSON(w, http.StatusServiceUnavailable, detail("the participant has not joined its group yet"))
		return
	}
	var one int
	if err := s.pool.QueryRow(r.Context(), "SELECT 1").Scan(&one); err != nil {
		slog.Error("health: the database does not answer", "error", err)
		writeJSON(w, http.StatusInternalServerError, detail("Internal Server Error"))
		return
	}
	writeJSON(w, http.StatusOK, healthBody{Service: s.name, Status: "ok", Schema: s.schema, Commands: s.commands})
}

type shipmentRow struct {
	OrderID    string `json:"order_id"`
	ShipmentID string `json:"shipment_id"`
	Customer   string `json:"customer"`
	Status     string `json:"status"`
}

func (s *service) shipment(w http.ResponseWriter, r *http.Request) {
	orderID := r.PathValue("order_id")
	row, err := s.lookup(r.Context(), orderID)
	writeFound(w, "shipment", orderID, row, err)
}

// writeFound answers a GET of an order's row: the row, 404 naming what is not
// there, or 500 (logged) when the database failed.
func writeFound(w http.ResponseWriter, what, orderID string, row any, err error) {
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		writeJSON(w, http.StatusNotFound, detail(fmt.Sprintf("no %s for order %s", what, orderID)))
	case err != nil:
		slog.Error("GET "+what, "order_id", orderID, "error", err)
		writeJSON(w, http.StatusInternalServerError, detail("Internal Server Error"))
	default:
		writeJSON(w, http.StatusOK, row)
	}
}

func (s *service) lookup(ctx context.Context, orderID string) (shipmentRow, error) {
	var row shipmentRow
	err := s.pool.QueryRow(ctx,
		"SELECT order_id, shipment_id, customer, status FROM shipments WHERE order_id = $1",
		orderID,
	).Scan(&row.OrderID, &row.ShipmentID, &row.Customer, &row.Status)
	return row, err
}

func detail(text string) map[string]string { return map[string]string{"detail": text} }

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
