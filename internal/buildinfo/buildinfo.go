// Package buildinfo says which build of presenced is running: the module
// version, the VCS revision and its time, and the Go release, as the Go
// toolchain records them in the binary (runtime/debug.ReadBuildInfo).
// `presenced -version` prints it, the node logs it at start and /metrics
// exports it as presenced_build_info, so all three always agree.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Info describes one build. The zero value is never returned by Read.
type Info struct {
	// Version is the module version ("v1.2.3", a pseudo-version), or
	// "devel" for a build from a work tree (go build, go run).
	Version string
	// Revision is the VCS revision, shortened to 12 characters; empty when
	// the build was not stamped (-buildvcs=false, no .git directory).
	Revision string
	// Time is the revision's commit time (RFC 3339), empty when unknown.
	Time string
	// Modified says the work tree had uncommitted changes.
	Modified bool
	// Go is the Go release the binary was built with ("go1.26.8").
	Go string
}

// Read returns the running binary's build information. It is safe for
// concurrent use.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown", Go: runtime.Version()}
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, Go: bi.GoVersion}
	if in.Version == "" || in.Version == "(devel)" {
		in.Version = "devel"
	}
	if in.Go == "" {
		in.Go = runtime.Version()
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	if len(in.Revision) > 12 {
		in.Revision = in.Revision[:12]
	}
	return in
}

// String is what -version prints after the program's name:
// "devel (0123456789ab 2026-01-02T03:04:05Z) go1.26.8", with ", modified"
// after the revision of a dirty work tree and no parentheses when the
// build has no revision.
func (in Info) String() string {
	v := in.Version
	if in.Revision != "" {
		dirty := ""
		if in.Modified {
			dirty = ", modified"
		}
		v += " (" + in.Revision + dirty + " " + in.Time + ")"
	}
	return v + " " + in.Go
}
