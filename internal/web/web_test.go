package web

import (
	"bytes"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	presencejs "github.com/presenced/presenced/js/presence"
)

func TestHandler(t *testing.T) {
	h := New()
	tests := []struct {
		method, path string
		code         int
		ctype        string
		contains     string
	}{
		{"GET", "/", 200, "text/html; charset=utf-8", `<script type="module" src="/static/app.js">`},
		{"HEAD", "/", 200, "text/html; charset=utf-8", ""},
		{"GET", "/static/presence.js", 200, "text/javascript; charset=utf-8", "export class PresenceClient"},
		{"GET", "/static/presence-timer.js", 200, "text/javascript; charset=utf-8", "postMessage(id)"},
		{"GET", "/static/app.js", 200, "text/javascript; charset=utf-8", "data-status"},
		{"GET", "/static/style.css", 200, "text/css; charset=utf-8", ".dot"},
		{"GET", "/static/index.html", 404, "", ""},
		{"GET", "/admin", 200, "text/html; charset=utf-8", `<script type="module" src="/static/admin.js">`},
		{"GET", "/static/admin.js", 200, "text/javascript; charset=utf-8", "sessionStorage"},
		{"GET", "/static/admin.css", 200, "text/css; charset=utf-8", ".plot"},
		{"GET", "/static/admin.html", 404, "", ""},
		{"GET", "/admin/", 404, "", ""},
		{"GET", "/static/", 404, "", ""},
		{"GET", "/static/nope.js", 404, "", ""},
		{"GET", "/static/../web.go", 404, "", ""},
		{"POST", "/", 405, "", ""},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
		if rec.Code != tt.code {
			t.Errorf("%s %s: code %d, want %d", tt.method, tt.path, rec.Code, tt.code)
			continue
		}
		if tt.code != 200 {
			continue
		}
		if got := rec.Header().Get("Content-Type"); got != tt.ctype {
			t.Errorf("%s %s: Content-Type %q, want %q", tt.method, tt.path, got, tt.ctype)
		}
		if !strings.Contains(rec.Body.String(), tt.contains) {
			t.Errorf("%s %s: body lacks %q", tt.method, tt.path, tt.contains)
		}
		if rec.Header().Get("ETag") == "" || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s %s: headers %v", tt.method, tt.path, rec.Header())
		}
	}
}

// The client is served byte for byte from js/presence, the npm package's
// directory: one source for the package and the binary.
func TestClientFromPackage(t *testing.T) {
	h := New()
	for _, name := range []string{"presence.js", "presence-timer.js"} {
		want, err := fs.ReadFile(presencejs.Files, name)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/static/"+name, nil))
		if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), want) {
			t.Errorf("/static/%s: code %d, %d bytes; want 200 and the %d bytes of js/presence/%s",
				name, rec.Code, rec.Body.Len(), len(want), name)
		}
	}
	// Nothing else of the package's directory (package.json, the
	// declarations, the Go file) is served.
	for _, name := range []string{"package.json", "presence.d.ts", "embed.go", "README.md"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/static/"+name, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("/static/%s: code %d, want 404", name, rec.Code)
		}
	}
}

func TestHandlerRevalidates(t *testing.T) {
	h := New()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/static/presence.js", nil))
	etag := rec.Header().Get("ETag")
	req := httptest.NewRequest("GET", "/static/presence.js", nil)
	req.Header.Set("If-None-Match", etag)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotModified {
		t.Fatalf("If-None-Match %s: code %d, want 304", etag, rec.Code)
	}
}

// The page loads nothing from the network: every src and href is local.
func TestPageIsSelfContained(t *testing.T) {
	for name, f := range New().files {
		body := string(f.body)
		for _, bad := range []string{"http://", "https://", "//cdn", "@import"} {
			if strings.Contains(body, bad) {
				t.Errorf("%s contains %q: the page must work offline", name, bad)
			}
		}
	}
}
