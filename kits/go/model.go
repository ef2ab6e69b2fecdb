package kit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// BodyError lists why a command's body is not what its command type takes
// (check 18 of section 7.5); each problem names its field.
type BodyError struct{ Problems []string }

func (e *BodyError) Error() string { return strings.Join(e.Problems, "; ") }

// HandlerOption configures one command type's handler.
type HandlerOption func(*handler)

// WithModel sets the check of a command type's body (check 18): validate
// returns an error naming the wrong fields, or nil. The body given is always a
// JSON object.
func WithModel(validate func(body json.RawMessage) error) HandlerOption {
	return func(h *handler) { h.validate = validate }
}

// WithBody makes T, a struct, the model of the command type's body: the body
// must be a JSON object whose member names are exactly T's JSON field names
// (unknown members refused), holding every field not tagged omitempty or
// omitzero and not a pointer (null refused for those), each of the type T
// declares.
func WithBody[T any]() HandlerOption {
	return WithModel(func(body json.RawMessage) error { return validateModel[T](body) })
}

// Effects says where a handler's effects are: all in the kit's transaction
// (EffectsTransaction, the default), or some outside it (EffectsOutside).
type Effects int

const (
	// EffectsTransaction: every effect of the handler is a write through its
	// tx. Its command is claimed by the insert of its outcome, at the end of
	// its transaction: a copy answered before, or meanwhile on another
	// instance, may thus run the handler in a transaction that is then rolled
	// back (its writes with it), and is answered from the stored reply.
	EffectsTransaction Effects = iota
	// EffectsOutside: the handler acts outside its transaction too (an HTTP
	// call, a message, a file). Its command is claimed before it runs, under
	// a lock a copy waits on: a copy answered before never runs it.
	EffectsOutside
)

func (e Effects) String() string {
	switch e {
	case EffectsTransaction:
		return "transaction"
	case EffectsOutside:
		return "outside"
	}
	return fmt.Sprintf("Effects(%d)", int(e))
}

// WithEffects says where the handler's effects are (EffectsTransaction when
// not given). Register a handler that calls another service, sends a message
// or writes a file WithEffects(EffectsOutside).
func WithEffects(e Effects) HandlerOption {
	return func(h *handler) { h.effects = e }
}

type modelField struct {
	name     string
	required bool
}

func modelFields(t reflect.Type) []modelField {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []modelField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		optional := f.Type.Kind() == reflect.Pointer
		for _, o := range strings.Split(opts, ",") {
			if o == "omitempty" || o == "omitzero" {
				optional = true
			}
		}
		out = append(out, modelField{name: name, required: !optional})
	}
	return out
}

func validateModel[T any](body json.RawMessage) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil || members == nil {
		return &BodyError{Problems: []string{"the body must be a JSON object"}}
	}
	fields := modelFields(reflect.TypeFor[T]())
	known := map[string]modelField{}
	for _, f := range fields {
		known[f.name] = f
	}
	var problems []string
	if fields != nil {
		for name := range members {
			if _, ok := known[name]; !ok {
				problems = append(problems, fmt.Sprintf("field %q: unknown field", name))
			}
		}
		for _, f := range fields {
			raw, ok := members[f.name]
			switch {
			case !ok && f.required:
				problems = append(problems, fmt.Sprintf("field %q: required", f.name))
			case ok && f.required && bytes.Equal(bytes.TrimSpace(raw), []byte("null")):
				problems = append(problems, fmt.Sprintf("field %q: must not be null", f.name))
			}
		}
	}
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			problems = append(problems, fmt.Sprintf("field %q: expected %s, got JSON %s", te.Field, te.Type, te.Value))
		} else {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems)
	return &BodyError{Problems: problems}
}

// isJSONObject reports whether a valid JSON text is an object.
func isJSONObject(body []byte) bool {
	t := bytes.TrimLeft(body, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}
