// Package buildinfo says which build of flashsale is running: the module
// version, the VCS commit and the Go version, read from the binary's build
// information (runtime/debug.ReadBuildInfo).
//
// A build without VCS stamping (-buildvcs=false, or a source tree without
// .git) has no commit and the version "(devel)"; those read "unknown" and
// "devel". A release build can stamp both explicitly:
//
//	go build -ldflags "-X github.com/flashsale/flashsale/internal/buildinfo.Version=v1.2.0 \
//	  -X github.com/flashsale/flashsale/internal/buildinfo.Commit=$(git rev-parse HEAD)" ./cmd/flashsale
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Version and Commit, when set at link time (-ldflags -X), take the place of
// what the build information says.
var (
	Version string
	Commit  string
)

// Info is one build's identity.
type Info struct {
	Version   string // module version, e.g. v1.2.0 or v0.0.0-20260101...-abcdef; "devel" when unknown
	Commit    string // VCS revision; "unknown" when the build has none
	Modified  bool   // the build had uncommitted changes (VCS stamping only)
	GoVersion string // e.g. go1.26.8
}

// Get returns the running binary's build identity.
func Get() Info {
	return from(debug.ReadBuildInfo())
}

func from(bi *debug.BuildInfo, ok bool) Info {
	in := Info{Version: "devel", Commit: "unknown", GoVersion: runtime.Version()}
	if ok && bi != nil {
		if bi.GoVersion != "" {
			in.GoVersion = bi.GoVersion
		}
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			in.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if s.Value != "" {
					in.Commit = s.Value
				}
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if Version != "" {
		in.Version = Version
	}
	if Commit != "" {
		in.Commit = Commit
	}
	return in
}
