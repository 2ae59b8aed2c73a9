// Package apicontract checks HTTP exchanges with a node against the API
// description (httpapi.OpenAPI, OpenAPI 3.1) with kin-openapi, for tests:
// the contract test of internal/httpapi and the end-to-end test of the Go
// package for backends (client/backend). It records which operation
// answered which status, so a test can tell which documented answers it
// never saw.
//
// kin-openapi validates OpenAPI 3.1 documents' schemas with a JSON Schema
// 2020-12 validator (santhosh-tekuri/jsonschema): types, type arrays with
// "null", enum, const, required, additionalProperties, propertyNames,
// min/max lengths and items, patterns, $ref with sibling keywords,
// oneOf. It validates response headers that the description declares
// (Retry-After, Cache-Control, ETag, the CORS headers), request parameters and bodies. It
// does not validate 304 and 3xx answers (a test checks that they are
// documented), and it treats security requirements as met (every scheme
// is a bearer token; the node's own tests check who may do what).
package apicontract

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/presenced/presenced/internal/httpapi"
)

var registerOnce sync.Once

// registerDecoders lets kin-openapi read the bodies of the web pages (it
// knows JSON and text/plain only): as strings.
func registerDecoders() {
	registerOnce.Do(func() {
		for _, ct := range []string{"text/html", "text/javascript", "text/css"} {
			openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
		}
	})
}

// Contract is the loaded description and what was checked against it. It
// is safe for concurrent use.
type Contract struct {
	Doc *openapi3.T

	mu      sync.Mutex
	routers map[string]routers.Router // by base URL
	seen    map[string]bool           // "operationId status"
}

// Load loads the description and validates it as an OpenAPI 3.1 document.
func Load() (*Contract, error) {
	registerDecoders()
	doc, err := openapi3.NewLoader().LoadFromData(httpapi.OpenAPI())
	if err != nil {
		return nil, fmt.Errorf("loading openapi.json: %w", err)
	}
	if doc.OpenAPI != "3.1.0" || !doc.IsOpenAPI31OrLater() {
		return nil, fmt.Errorf("openapi.json is OpenAPI %q, want 3.1.0", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("openapi.json is not a valid OpenAPI 3.1 document: %w", err)
	}
	return &Contract{Doc: doc, routers: map[string]routers.Router{}, seen: map[string]bool{}}, nil
}

// router returns a router of the description for a node at base.
func (c *Contract) router(base string) (routers.Router, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.routers[base]; ok {
		return r, nil
	}
	doc := *c.Doc
	doc.Servers = openapi3.Servers{{URL: base}}
	r, err := legacy.NewRouter(&doc)
	if err != nil {
		return nil, err
	}
	c.routers[base] = r
	return r, nil
}

var options = &openapi3filter.Options{
	AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	IncludeResponseStatus: true, // an undocumented status is a failure
	MultiError:            true,
}

// Route returns the operation of the description that req is for.
func (c *Contract) Route(req *http.Request) (*routers.Route, map[string]string, error) {
	r, err := c.router(req.URL.Scheme + "://" + req.URL.Host)
	if err != nil {
		return nil, nil, err
	}
	route, params, err := r.FindRoute(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: no operation of openapi.json matches: %w", req.Method, req.URL.Path, err)
	}
	return route, params, nil
}

// CheckRequest validates a request (with its body) against the
// description and returns its operation's id.
func (c *Contract) CheckRequest(req *http.Request, body []byte) (string, error) {
	route, params, err := c.Route(req)
	if err != nil {
		return "", err
	}
	rq := req.Clone(context.Background())
	rq.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.RequestValidationInput{Request: rq, PathParams: params, Route: route, Options: options}
	if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
		return route.Operation.OperationID, fmt.Errorf("%s %s %.200s: the request does not match openapi.json: %w", req.Method, req.URL, body, err)
	}
	return route.Operation.OperationID, nil
}

// CheckResponse validates the answer to req (status, headers, body)
// against the description, records it and returns the operation's id.
func (c *Contract) CheckResponse(req *http.Request, status int, header http.Header, body []byte) (string, error) {
	route, params, err := c.Route(req)
	if err != nil {
		return "", err
	}
	id := route.Operation.OperationID
	c.mu.Lock()
	c.seen[id+" "+strconv.Itoa(status)] = true
	c.mu.Unlock()
	if route.Operation.Responses.Status(status) == nil {
		// Said here too for the answers kin-openapi does not validate (304).
		return id, fmt.Errorf("%s %s: the status %d is not documented for %s", req.Method, req.URL.Path, status, id)
	}
	rq := req.Clone(context.Background())
	rq.Body = http.NoBody
	in := &openapi3filter.RequestValidationInput{Request: rq, PathParams: params, Route: route, Options: options}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header, Options: options}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		return id, fmt.Errorf("%s %s: the answer %d %.300s does not match openapi.json: %w", req.Method, req.URL, status, body, err)
	}
	return id, nil
}

// Seen reports whether operation id answered status.
func (c *Contract) Seen(id string, status int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[id+" "+strconv.Itoa(status)]
}

// Unseen returns every documented "operationId status" that was not
// answered, sorted, but those in excused.
func (c *Contract) Unseen(excused map[string]string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, item := range c.Doc.Paths.Map() {
		for _, op := range item.Operations() {
			for status := range op.Responses.Map() {
				key := op.OperationID + " " + status
				if _, ok := excused[key]; !c.seen[key] && !ok {
					out = append(out, key)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// Operations returns every operation of the description as "METHOD /path"
// → operationId.
func (c *Contract) Operations() map[string]string {
	out := map[string]string{}
	for path, item := range c.Doc.Paths.Map() {
		for m, op := range item.Operations() {
			out[m+" "+path] = op.OperationID
		}
	}
	return out
}

// Transport is an http.RoundTripper that checks every request it sends
// (which must be valid) and every answer against the description, and
// reports a mismatch as the round trip's error. Base sends the requests
// (nil: http.DefaultTransport).
type Transport struct {
	Contract *Contract
	Base     http.RoundTripper
	// AllowInvalidRequests sends requests the description does not allow
	// (a test of the node's refusals) and checks only their operation and
	// the answers.
	AllowInvalidRequests bool
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	if _, err := t.Contract.CheckRequest(req, body); err != nil {
		if _, _, rerr := t.Contract.Route(req); rerr != nil || !t.AllowInvalidRequests {
			return nil, err
		}
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	res, err := base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(b))
	if _, err := t.Contract.CheckResponse(req, res.StatusCode, res.Header, b); err != nil {
		return nil, err
	}
	return res, nil
}
