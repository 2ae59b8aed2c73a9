package httpapi

import (
	_ "embed"
	"net/http"
	"strconv"
)

// openAPI is the OpenAPI 3.1 description of every HTTP endpoint of a node
// (the Server's routes and the WebSocket upgrade), served at
// GET /v1/openapi.json. The tests check it against Patterns and validate
// the node's real answers against it.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3.1 description of the node's HTTP API
// (JSON). The caller must not modify it.
func OpenAPI() []byte { return openAPI }

func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(openAPI)))
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(openAPI)
	}
}
