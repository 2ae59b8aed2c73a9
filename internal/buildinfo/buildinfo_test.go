package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want Info
		str  string
	}{
		{
			name: "work tree, stamped",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "false"}}},
			want: Info{Version: "devel", Revision: "0123456789ab", Time: "2026-01-02T03:04:05Z", Go: "go1.26.8"},
			str:  "devel (0123456789ab 2026-01-02T03:04:05Z) go1.26.8",
		},
		{
			name: "dirty",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.time", Value: "t"}, {Key: "vcs.modified", Value: "true"}}},
			want: Info{Version: "v1.2.3", Revision: "abc", Time: "t", Modified: true, Go: "go1.26.8"},
			str:  "v1.2.3 (abc, modified t) go1.26.8",
		},
		{
			name: "not stamped",
			bi:   debug.BuildInfo{},
			want: Info{Version: "devel", Go: runtime.Version()},
			str:  "devel " + runtime.Version(),
		},
	} {
		got := fromBuildInfo(&tc.bi)
		if got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
		if s := got.String(); s != tc.str {
			t.Errorf("%s: String() = %q, want %q", tc.name, s, tc.str)
		}
	}
}

func TestRead(t *testing.T) {
	in := Read()
	if in.Version == "" || in.Go != runtime.Version() {
		t.Fatalf("Read() = %+v: want a version and the running Go release %s", in, runtime.Version())
	}
}
