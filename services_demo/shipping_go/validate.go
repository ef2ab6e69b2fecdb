package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"

	kit "github.com/saga-engine/saga-engine/kits/go"
)

// The bodies' checks (check 18 of PROTOCOL.md section 7.5), as the pydantic
// models of services_demo/contracts.py make them: required fields of the right
// JSON type, unknown top-level fields ignored, an Item's fields exactly sku (a
// name) and qty (an integer from 1 to 1000).

var namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`) // contracts.NAME_PATTERN

func validateScheduleShipment(body json.RawMessage) error {
	return checkBody(body, func(c *checker, members map[string]json.RawMessage) {
		c.str(members, "order_id", "order_id")
		c.str(members, "customer", "customer")
		raw, ok := c.required(members, "items", "items")
		if !ok {
			return
		}
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			c.fail("items", "expected a list")
			return
		}
		for i, item := range items {
			c.item(item, fmt.Sprintf("items.%d", i))
		}
	})
}

func validateCancelShipment(body json.RawMessage) error {
	return checkBody(body, func(c *checker, members map[string]json.RawMessage) {
		c.str(members, "order_id", "order_id")
	})
}

type checker struct{ problems []string }

func checkBody(body json.RawMessage, check func(*checker, map[string]json.RawMessage)) error {
	c := &checker{}
	members, ok := object(body)
	if !ok {
		c.problems = append(c.problems, "the body must be a JSON object")
	} else {
		check(c, members)
	}
	if len(c.problems) == 0 {
		return nil
	}
	sort.Strings(c.problems)
	return &kit.BodyError{Problems: c.problems}
}

func (c *checker) fail(path, problem string) {
	c.problems = append(c.problems, fmt.Sprintf("field %q: %s", path, problem))
}

func (c *checker) required(members map[string]json.RawMessage, name, path string) (json.RawMessage, bool) {
	raw, ok := members[name]
	switch {
	case !ok:
		c.fail(path, "required")
		return nil, false
	case bytes.Equal(bytes.TrimSpace(raw), []byte("null")):
		c.fail(path, "must not be null")
		return nil, false
	}
	return raw, true
}

func (c *checker) str(members map[string]json.RawMessage, name, path string) (string, bool) {
	raw, ok := c.required(members, name, path)
	if !ok {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		c.fail(path, "expected a string")
		return "", false
	}
	return s, true
}

// item checks an Item (extra="forbid", sku a name, qty from 1 to 1000).
func (c *checker) item(raw json.RawMessage, path string) {
	members, ok := object(raw)
	if !ok {
		c.fail(path, "expected an object")
		return
	}
	for name := range members {
		if name != "sku" && name != "qty" {
			c.fail(path+"."+name, "unknown field")
		}
	}
	if sku, ok := c.str(members, "sku", path+".sku"); ok && !namePattern.MatchString(sku) {
		c.fail(path+".sku", "must match "+namePattern.String())
	}
	if q, ok := c.required(members, "qty", path+".qty"); ok {
		var n int64
		switch err := json.Unmarshal(q, &n); {
		case err != nil:
			c.fail(path+".qty", "expected an integer")
		case n < 1 || n > 1000:
			c.fail(path+".qty", "must be from 1 to 1000")
		}
	}
}

func object(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil || members == nil {
		return nil, false
	}
	return members, true
}
