package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/sandcell/sandcell/supervisor/wire"
)

// FuzzDecode feeds fuzzed bodies to the strict JSON decoder of every request body
// (runs, SQL statements and their parameters, sessions and their cells). It must
// never panic, and a body it accepts is one encoding/json reads as the same value.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		`{"code":"print(1)"}`, `{"code":"x","limits":{"timeout_ms":1000}}`, `{"code":"x","CODE":"y"}`,
		`{"code":"x","code":"y"}`, `{"code":"\ud800"}`, `{"sql":"select ?","params":[1,"a",{"base64":"AA=="},null]}`,
		`{"sql":"select :a","params":{"a":9007199254740993}}`, `{"workspace":"w"}`, `{"code":"1"} {}`, `[]`, `{`,
		"{\"code\":\"\xff\"}", `{"code":1}`, `{"limits":{"memory_bytes":-1}}`,
	} {
		f.Add([]byte(seed))
	}
	s := &Server{o: Options{MaxBodyBytes: 1 << 20}}
	e := echo.New()
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, v := range []any{&wire.RunRequest{}, &wire.SQLRequest{}, &wire.SessionRequest{}, &wire.CellRequest{}} {
			req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			err := s.decode(e.NewContext(req, httptest.NewRecorder()), v)
			if err != nil {
				if code := problemOf(err).code; code == wire.CodeInternal {
					t.Fatalf("%T: %q: %v is an internal error, not a stable code", v, body, err)
				}
				continue
			}
			plain := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			if err := json.Unmarshal(body, plain); err != nil {
				t.Fatalf("%T: accepted %q, which encoding/json refuses: %v", v, body, err)
			}
			if !reflect.DeepEqual(v, plain) {
				t.Fatalf("%T: %q decoded as %+v, encoding/json reads %+v", v, body, v, plain)
			}
		}
	})
}

// FuzzLoadTokens reads fuzzed tokens files: never a panic, and a file accepted holds
// only well-formed tokens.
func FuzzLoadTokens(f *testing.F) {
	f.Add([]byte("[[token]]\nname = \"a\"\nsha256 = \"" + string(bytes.Repeat([]byte("0"), 64)) + "\"\nroles = [\"run\"]\n"))
	f.Add([]byte("[[token]]\nname = \"a\"\nsha256 = \"x\"\n"))
	f.Add([]byte("[[token]]\nname = 1\n"))
	f.Add([]byte("token = 3\n[x]\n"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, file []byte) {
		p := filepath.Join(dir, "tokens")
		if err := os.WriteFile(p, file, 0o600); err != nil {
			t.Fatal(err)
		}
		toks, err := LoadTokens(p)
		if err != nil {
			return
		}
		for _, tok := range toks {
			if tok.Name == "" || len(tok.SHA256) != 64 {
				t.Fatalf("accepted a malformed token %+v from %q", tok, file)
			}
		}
	})
}
