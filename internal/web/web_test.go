package web

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
