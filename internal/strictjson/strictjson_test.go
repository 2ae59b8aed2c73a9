package strictjson

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

type msg struct {
	Type   string   `json:"type"`
	Status *string  `json:"status"`
	Active *bool    `json:"active"`
	N      float64  `json:"n"`
	IDs    []string `json:"ids"`
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		open bool
		want string // a word of the error; "" for none
	}{
		{`{"type":"a","status":"busy"}`, false, ""},
		{` {"type":"a"} `, false, ""},
		{`{"ty\u0070e":"a"}`, false, ""},                    // an escaped key is its name
		{`{"type":"a","x":{"type":1,"Type":2}}`, true, ""},  // nested keys are not the object's
		{`{"type":"a","ids":["\"type\":","}"]}`, false, ""}, // strings are no keys
		{`{"type":"a","claim":1,"other":[1,2]}`, true, ""},  // open: unknown keys ignored
		{``, false, "empty"},
		{"  \n", false, "empty"},
		{`null`, false, "not a JSON object"},
		{`[1]`, false, "not a JSON object"},
		{"{\"type\":\"a\xffb\"}", false, "UTF-8"},
		{`{"type":"a"`, false, "not valid JSON"},
		{`{"type":"a",}`, false, "not valid JSON"},
		{`{"type":"a"}{}`, false, "after the JSON object"},
		{`{"type":"a"} x`, false, "after the JSON object"},
		{`{"type":"a","x":1}`, false, `unknown field "x"`},
		{`{"type":"a","Status":"busy"}`, false, `"Status"`},
		{`{"type":"a","Status":"busy"}`, true, `"Status", which is not "status"`},
		{`{"TYPE":"a"}`, true, `"TYPE"`},
		{`{"type":"a","type":"b"}`, false, `"type" twice`},
		{`{"type":"a","claim":1,"claim":2}`, true, `"claim" twice`},
		{`{"type":"a","ty\u0070e":"b"}`, false, `"type" twice`},
		{`{"type":"a","n":"5"}`, false, `gives the field "n" a string: it takes a number`},
		{`{"type":"a","active":"yes"}`, false, `"active" a string: it takes true or false`},
		{`{"type":7}`, false, `"type" a number: it takes a string`},
		{`{"type":"a","ids":"x"}`, false, `an array of strings`},
		{`{"type":"a","n":1e400}`, false, `"n"`},
	} {
		var m msg
		var err error
		if tc.open {
			err = DecodeOpen([]byte(tc.in), &m)
		} else {
			err = Decode([]byte(tc.in), &m)
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s (open %v): %v", tc.in, tc.open, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s (open %v): got %v, want an error with %q", tc.in, tc.open, err, tc.want)
		}
		if _, ok := err.(*Error); err != nil && !ok {
			t.Errorf("%s: error %T, want *Error", tc.in, err)
		}
	}
}

// Many keys: duplicates are found past the first eight.
func TestDecodeManyKeys(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"type":"a"`)
	for i := range 20 {
		b.WriteString(`,"k` + string(rune('a'+i)) + `":1`)
	}
	b.WriteString(`,"kt":2}`)
	var m msg
	if err := DecodeOpen([]byte(b.String()), &m); err == nil || !strings.Contains(err.Error(), `"kt" twice`) {
		t.Fatalf("got %v", err)
	}
}

func TestNumbersAsStringsAreAMistake(t *testing.T) {
	for _, v := range []any{
		&struct {
			N int `json:"n,string"`
		}{},
		&struct {
			N json.Number `json:"n"`
		}{},
		&struct{ N int }{},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%T: no panic", v)
				}
			}()
			_ = Decode([]byte(`{"n":1}`), v)
		}()
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"type":"a","status":"busy","active":true,"n":1.5,"ids":["x"]}`,
		`{"type":"a","type":"b"}`, `{"TYPE":"a"}`, `{"x":{"y":[1,{"z":"}"}]}}`,
		`{"ty\u0070e":"a"}`, "{\"\\", `{"a\"b":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, open := range []bool{false, true} {
			var m msg
			var err error
			if open {
				err = DecodeOpen(b, &m)
			} else {
				err = Decode(b, &m)
			}
			if err != nil {
				if err.Error() == "" {
					t.Fatal("empty error")
				}
				continue
			}
			// Whatever is taken is one object whose keys are distinct.
			var keys map[string]json.RawMessage
			if json.Unmarshal(b, &keys) != nil {
				t.Fatalf("took %q, which is no JSON object", b)
			}
		}
	})
}

// BenchmarkCheckKeys1000: the walk over a batch read's body of 1,000 ids
// that the exact-key check adds to encoding/json's decoding.
func BenchmarkCheckKeys1000(b *testing.B) {
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = strconv.Itoa(100000000 + i*7919)
	}
	body, _ := json.Marshal(map[string]any{"user_ids": ids, "viewer_id": "42"})
	fields := []string{"user_ids", "viewer_id"}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := checkKeys(body, fields, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenManyKeys: an open object of 5,000 keys (a token of 32 KiB
// of claims, decoded before its signature is checked) costs linear time.
func BenchmarkOpenManyKeys(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"type":"a"`)
	for i := range 5000 {
		sb.WriteString(`,"k` + strconv.Itoa(i) + `":0`)
	}
	sb.WriteString(`}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var m msg
		if err := DecodeOpen(body, &m); err != nil {
			b.Fatal(err)
		}
	}
}
