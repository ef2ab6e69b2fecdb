package kit

import (
	"strings"
	"testing"
)

type modelBody struct {
	Key    string  `json:"key"`
	Count  int64   `json:"count"`
	Note   string  `json:"note,omitempty"`
	Ref    *string `json:"ref"`
	hidden int
}

func TestValidateModel(t *testing.T) {
	for body, want := range map[string]string{
		`{"key":"k","count":1}`:                       "",
		`{"key":"k","count":1,"note":"n","ref":null}`: "",
		`{"key":"k"}`:                                 `field "count": required`,
		`{"key":5,"count":1}`:                         `field "key": expected string`,
		`{"key":null,"count":1}`:                      `field "key": must not be null`,
		`{"key":"k","count":1,"other":1}`:             `field "other": unknown field`,
		`{"KEY":"k","count":1}`:                       `field "KEY": unknown field`,
		`{"key":"k","count":18446744073709551615}`:    `field "count": expected int64`,
		`[1]`:    "the body must be a JSON object",
		`null`:   "the body must be a JSON object",
		`"text"`: "the body must be a JSON object",
	} {
		err := validateModel[modelBody]([]byte(body))
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v", body, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}

func TestPayloadObject(t *testing.T) {
	for v, want := range map[any]string{nil: "{}", "s": "", 5: ""} {
		got, err := payloadObject(v)
		if (want == "") != (err != nil) || (want != "" && string(got) != want) {
			t.Errorf("payloadObject(%v) = %s, %v", v, got, err)
		}
	}
	got, err := payloadObject(struct {
		N uint64 `json:"n"`
	}{18446744073709551615})
	if err != nil || string(got) != `{"n":18446744073709551615}` {
		t.Errorf("%s %v", got, err)
	}
}
