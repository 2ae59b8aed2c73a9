// Package strictjson decodes the JSON objects that arrive from outside —
// HTTP request bodies, WebSocket messages, the header and claims of client
// tokens — by one rule, so that every edge of the node, and any proxy or
// verifier in front that reads the same bytes, reads them alike:
//
//   - valid UTF-8 (encoding/json turns invalid bytes into U+FFFD without a
//     word, so two different byte strings would read as one);
//   - exactly one JSON object, and nothing after it but white space;
//   - every key exactly the JSON name of a field (encoding/json matches
//     keys without regard to case: "Status" or "STATUS" would set
//     status);
//   - no key twice (encoding/json keeps the last: {"sub":"a","sub":"b"}
//     would be b);
//   - every value of its field's type, numbers as numbers: the structs
//     decoded into use plain types, and a field that would also take a
//     string of digits (the ",string" option, json.Number) is a mistake
//     refused at its first use.
//
// Decode refuses keys that name no field. DecodeOpen ignores them — token
// claims carry the app's own — but still refuses a key that differs from
// a field's name only in case, and any key given twice.
//
// Both are pure functions of the bytes, safe for concurrent use. An error
// they return is an *Error, whose text completes a sentence whose subject
// is what was decoded: "request body " + err.Error().
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Error is why bytes were refused. Its text is a predicate ("is not
// valid UTF-8", "gives the field \"sub\" twice"): callers put what was
// decoded in front of it.
type Error struct{ msg string }

func (e *Error) Error() string { return e.msg }

func errorf(format string, args ...any) *Error { return &Error{msg: fmt.Sprintf(format, args...)} }

// Decode decodes data, one JSON object, into the struct v points to,
// refusing unknown keys (see the package comment for the whole rule).
func Decode(data []byte, v any) error { return decode(data, v, false) }

// DecodeOpen is Decode for objects that may carry keys of their own (the
// claims of a token): a key that names no field is ignored, unless it is
// a field's name in other case; keys given twice are refused all the same.
func DecodeOpen(data []byte, v any) error { return decode(data, v, true) }

func decode(data []byte, v any, open bool) error {
	fields := fieldsOf(reflect.TypeOf(v))
	// encoding/json decodes null into a struct as a no-op; only an object
	// is one.
	t := bytes.TrimLeft(data, " \t\r\n")
	if len(t) == 0 {
		return errorf("is empty: want a JSON object")
	}
	if t[0] != '{' {
		return errorf("is not a JSON object")
	}
	if !utf8.Valid(data) {
		return errorf("is not valid UTF-8")
	}
	d := json.NewDecoder(bytes.NewReader(data))
	if !open {
		d.DisallowUnknownFields()
	}
	if err := d.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := d.Token(); err != io.EOF {
		return errorf("has data after the JSON object")
	}
	return checkKeys(data, fields, open)
}

// decodeError says what encoding/json refused, in the terms of JSON
// rather than of Go types.
func decodeError(err error) *Error {
	var te *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errorf("is not valid JSON: it ends before the object does")
	case errors.As(err, &te) && te.Field != "":
		return errorf("gives the field %q %s: it takes %s", te.Field, article(te.Value), jsonKind(te.Type))
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return errorf("has the unknown field %s", f)
	}
	return errorf("is not valid JSON: %s", strings.TrimPrefix(msg, "json: "))
}

func article(kind string) string {
	switch {
	case kind == "":
		return "a value"
	case strings.HasPrefix(kind, "array"), strings.HasPrefix(kind, "object"):
		return "an " + kind
	}
	return "a " + kind
}

// jsonKind names the JSON values a Go type takes.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.String {
			return "an array of strings"
		}
		return "an array"
	}
	return "an object"
}

// checkKeys refuses what encoding/json lets through silently: a key of
// the object that is not exactly one of fields (it matches keys without
// regard to case; open: only such a near miss is refused) and a key given
// twice (it keeps the last). data is one valid JSON object (decoded).
func checkKeys(data []byte, fields []string, open bool) error {
	// The keys seen: a few in a slice, more in a set (an open object
	// may hold thousands, before its token's signature is checked).
	var buf [16]string
	seen := buf[:0]
	var many map[string]struct{}
	depth, wantKey := 0, false
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{', '[':
			depth++
			wantKey = depth == 1 && data[i] == '{'
		case '}', ']':
			depth--
		case ',':
			wantKey = depth == 1
		case '"':
			j, esc := i+1, false
			for ; j < len(data) && data[j] != '"'; j++ {
				if data[j] == '\\' {
					j++
					esc = true
				}
			}
			if wantKey {
				wantKey = false
				key := string(data[i+1 : j])
				if esc && json.Unmarshal(data[i:j+1], &key) != nil {
					return errorf("has a malformed key")
				}
				if !slices.Contains(fields, key) {
					if !open {
						return errorf("has the unknown field %q (field names are exact: %s)", key, strings.Join(fields, ", "))
					}
					if i := slices.IndexFunc(fields, func(f string) bool { return strings.EqualFold(f, key) }); i >= 0 {
						return errorf("has the field %q, which is not %q: field names are exact", key, fields[i])
					}
				}
				if many != nil {
					if _, dup := many[key]; dup {
						return errorf("gives the field %q twice", key)
					}
					many[key] = struct{}{}
				} else if slices.Contains(seen, key) {
					return errorf("gives the field %q twice", key)
				} else if len(seen) < cap(buf) {
					seen = append(seen, key)
				} else {
					many = make(map[string]struct{}, 2*len(seen))
					for _, k := range seen {
						many[k] = struct{}{}
					}
					many[key] = struct{}{}
				}
			}
			i = j
		}
	}
	return nil
}

var fieldCache sync.Map // reflect.Type → []string

// fieldsOf returns the JSON names of the fields of the struct p points to.
// It panics on a field that would take a number as a string: that is a
// mistake of the program, not of the input.
func fieldsOf(p reflect.Type) []string {
	if f, ok := fieldCache.Load(p); ok {
		return f.([]string)
	}
	if p.Kind() != reflect.Pointer || p.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("strictjson: decoding into %v, want a pointer to a struct", p))
	}
	t := p.Elem()
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if f.Anonymous || name == "" {
			panic(fmt.Sprintf("strictjson: %v.%s needs a JSON name (and no embedding): names are exact", t, f.Name))
		}
		if slices.Contains(strings.Split(opts, ","), "string") || f.Type == reflect.TypeFor[json.Number]() {
			panic(fmt.Sprintf("strictjson: %v.%s would take a number as a string", t, f.Name))
		}
		out = append(out, name)
	}
	fieldCache.Store(p, out)
	return out
}
