package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/buildinfo"
)

// TestBuildInfo: /metrics carries presenced_build_info with the labels of
// the build information -version prints.
func TestBuildInfo(t *testing.T) {
	r := New(Sources{})
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	in := buildinfo.Read()
	want := `presenced_build_info{go="` + in.Go + `",revision="` + in.Revision + `",version="` + in.Version + `"} 1`
	if !strings.Contains(rec.Body.String(), want+"\n") {
		t.Fatalf("no %s in\n%s", want, rec.Body.String())
	}
}
