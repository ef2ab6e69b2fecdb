package main

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	kit "github.com/saga-engine/saga-engine/kits/go"
)

func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func TestDefaultsAreThePythonServicesDefaults(t *testing.T) {
	c, err := loadConfig(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Port != 8105 || c.Schema != "saga_participant" || c.TopicPrefix != "saga" ||
		c.DSN != defaultDSN || !reflect.DeepEqual(c.Brokers, []string{"127.0.0.1:19092"}) ||
		c.HandlerAttempts != 5 || c.SessionTimeout != 6*time.Second ||
		!reflect.DeepEqual(c.Unshippable, map[string]bool{"erin": true}) {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestTheDemoEnvironment(t *testing.T) {
	c, err := loadConfig(env(map[string]string{
		"SAGA_PG__DSN":                      "postgresql://engine/db",
		"SAGA_PARTICIPANT__DSN":             "postgresql://participant/db",
		"SAGA_PARTICIPANT__DB_SCHEMA":       "t1_shipping",
		"SAGA_KAFKA__BOOTSTRAP_SERVERS":     "a:1, b:2",
		"SAGA_KAFKA__TOPIC_PREFIX":          "t1",
		"SAGA_KAFKA__PARTITIONS":            "4",
		"SAGA_KAFKA__SESSION_TIMEOUT_MS":    "6000",
		"SAGA_KAFKA__HEARTBEAT_INTERVAL_MS": "500",
		"SAGA_KAFKA__GROUP_ID":              "t1-engines", // the engine's, not the participant's
		"SAGA_DEMO_BASE_PORT":               "23000",
		"SAGA_DEMO_UNSHIPPABLE":             " erin, zed ,,",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.DSN != "postgresql://participant/db" || c.Schema != "t1_shipping" || c.Port != 23005 ||
		!reflect.DeepEqual(c.Brokers, []string{"a:1", "b:2"}) || c.TopicPrefix != "t1" ||
		c.Partitions != 4 || c.HeartbeatInterval != 500*time.Millisecond ||
		!reflect.DeepEqual(c.UnshippableList(), []string{"erin", "zed"}) {
		t.Fatalf("config: %+v", c)
	}
	// The participant's DSN follows the engine's when unset; an empty list ships to all.
	c, err = loadConfig(env(map[string]string{"SAGA_PG__DSN": "postgresql://engine/db", "SAGA_DEMO_UNSHIPPABLE": ""}))
	if err != nil || c.DSN != "postgresql://engine/db" || len(c.Unshippable) != 0 {
		t.Fatalf("config: %+v, %v", c, err)
	}
}

func TestBadSettingsAreRefused(t *testing.T) {
	_, err := loadConfig(env(map[string]string{"SAGA_KAFKA__PARTITIONS": "x", "SAGA_PARTICIPANT__DB_SCHEMA": "Bad-Schema"}))
	if err == nil || !strings.Contains(err.Error(), "SAGA_KAFKA__PARTITIONS") || !strings.Contains(err.Error(), "SAGA_PARTICIPANT__DB_SCHEMA") {
		t.Fatalf("err = %v", err)
	}
}

func TestLockKeyIsThePythonServicesKey(t *testing.T) {
	// services_demo._service._lock_key("demo_shipping")
	if got := lockKey("demo_shipping"); got != 5371401870065320118 {
		t.Fatalf("lockKey = %d", got)
	}
}

func TestShipmentID(t *testing.T) {
	if got := shipmentID("0123456789abcdef"); got != "shp-0123456789ab" {
		t.Fatal(got)
	}
	if got := shipmentID("short"); got != "shp-short" {
		t.Fatal(got)
	}
}

func TestTrackingNumber(t *testing.T) {
	if got := trackingNumber("0123456789abcdef"); got != "trk-0123456789ab" {
		t.Fatal(got)
	}
}

func TestBodies(t *testing.T) {
	ok := []string{
		`{"order_id": "o1", "customer": "alice", "items": [{"sku": "book", "qty": 2}]}`,
		`{"order_id": "o1", "customer": "alice", "items": [], "extra": 1}`, // extras ignored, as pydantic does
	}
	for _, body := range ok {
		if err := validateScheduleShipment(json.RawMessage(body)); err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
	bad := map[string]string{
		`{"customer": "alice", "items": []}`:                                            `field "order_id": required`,
		`{"order_id": 1, "customer": "alice", "items": []}`:                             `field "order_id": expected a string`,
		`{"order_id": "o", "customer": null, "items": []}`:                              `field "customer": must not be null`,
		`{"order_id": "o", "customer": "c", "items": {}}`:                               `field "items": expected a list`,
		`{"order_id": "o", "customer": "c", "items": [{"sku": "b", "qty": 0}]}`:         `field "items.0.qty": must be from 1 to 1000`,
		`{"order_id": "o", "customer": "c", "items": [{"sku": "b", "qty": 1.5}]}`:       `field "items.0.qty": expected an integer`,
		`{"order_id": "o", "customer": "c", "items": [{"sku": "b c", "qty": 1}]}`:       `field "items.0.sku": must match`,
		`{"order_id": "o", "customer": "c", "items": [{"sku": "b", "qty": 1, "x": 1}]}`: `field "items.0.x": unknown field`,
		`{"order_id": "o", "customer": "c", "items": [3]}`:                              `field "items.0": expected an object`,
	}
	for body, want := range bad {
		err := validateScheduleShipment(json.RawMessage(body))
		var be *kit.BodyError
		if !errors.As(err, &be) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %s", body, err, want)
		}
	}
	label := `{"order_id": "o1", "customer": "alice", "parcel_id": "pcl-1", "invoice_id": "inv-1"}`
	if err := validatePrintLabel(json.RawMessage(label)); err != nil {
		t.Error(err)
	}
	if err := validatePrintLabel(json.RawMessage(`{"order_id": "o1", "customer": "alice", "parcel_id": 1}`)); err == nil ||
		!strings.Contains(err.Error(), `field "invoice_id": required`) || !strings.Contains(err.Error(), `field "parcel_id": expected a string`) {
		t.Errorf("PrintLabel: %v", err)
	}
	if err := validateVoidLabel(json.RawMessage(`{}`)); err == nil {
		t.Error("VoidLabel without order_id accepted")
	}
	if err := validateCancelShipment(json.RawMessage(`{"order_id": "o1"}`)); err != nil {
		t.Error(err)
	}
	if err := validateCancelShipment(json.RawMessage(`{}`)); err == nil {
		t.Error("CancelShipment without order_id accepted")
	}
}

func TestHealthWaitsForTheGroupAndUnknownRoutesAnswerAsFastAPI(t *testing.T) {
	svc := &service{name: "shipping", schema: "s"}
	routes := svc.routes()
	for _, tc := range []struct {
		method, path string
		status       int
		detail       string
	}{
		{"GET", "/health", 503, "the participant has not joined its group yet"},
		{"POST", "/health", 405, "Method Not Allowed"},
		{"DELETE", "/shipments/o1", 405, "Method Not Allowed"},
		{"POST", "/labels/o1", 405, "Method Not Allowed"},
		{"GET", "/nothing", 404, "Not Found"},
	} {
		rec := httptest.NewRecorder()
		routes.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		var body map[string]string
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != tc.status || body["detail"] != tc.detail || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, rec.Code, rec.Body)
		}
	}
}
