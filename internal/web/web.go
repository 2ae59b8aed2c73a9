// Package web serves presenced's browser side, embedded in the binary: the
// demo page at /, the operator page at /admin, and their files under
// /static/, among them presence.js, the
// dependency-free JavaScript client of the WebSocket protocol
// (docs/protocol.md) that apps may load from /static/presence.js. The
// client and its timer worker come from js/presence, the npm package
// @presenced/presence, so the binary serves the very files the package holds.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"

	presencejs "github.com/presenced/presenced/js/presence"
)

// static holds the demo page (index.html, app.js, style.css).
//
//go:embed static
var static embed.FS

// types are the content types of the embedded files, fixed here rather than
// read from the system's MIME tables (a module script needs a JavaScript type).
var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// file is one embedded file, ready to serve.
type file struct {
	body  []byte
	ctype string
	etag  string
}

// Handler serves GET and HEAD of / (the demo page), /admin (the operator
// page) and /static/<name>.
// Anything else is a 404. Files are revalidated by ETag on every load, so
// a new binary is picked up at once. It is safe for concurrent use.
type Handler struct {
	files map[string]file // "/static/app.js" → file; "/" → index.html; "/admin" → admin.html
}

// New returns the Handler over the embedded files.
func New() *Handler {
	h := &Handler{files: map[string]file{}}
	h.add(static, "static")
	h.add(presencejs.Files, ".")
	h.files["/"] = h.files["/static/index.html"]
	h.files["/admin"] = h.files["/static/admin.html"]
	return h
}

// add serves every file under dir of fsys at /static/ plus its path below dir.
func (h *Handler) add(fsys fs.FS, dir string) {
	err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ctype, ok := types[path.Ext(p)]
		if !ok {
			ctype = http.DetectContentType(b)
		}
		rel := strings.TrimPrefix(p, dir+"/")
		if dir == "." {
			rel = p
		}
		h.files["/static/"+rel] = file{body: b, ctype: ctype, etag: `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	if err != nil {
		panic("web: reading embedded files: " + err.Error()) // cannot happen: they are compiled in
	}
}

// csp keeps the page to its own origin: no inline script, nothing from the
// network but this service (its WebSocket included).
const csp = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; object-src 'none'"

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f, ok := h.files[r.URL.Path]
	if !ok || r.URL.Path == "/static/index.html" || r.URL.Path == "/static/admin.html" { // each page has one address
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", f.ctype)
	hd.Set("ETag", f.etag)
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	if f.ctype == types[".html"] {
		hd.Set("Content-Security-Policy", csp)
	}
	// ServeContent answers If-None-Match with 304 and handles HEAD and ranges.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
}
