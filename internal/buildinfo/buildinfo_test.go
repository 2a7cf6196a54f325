package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// TestFrom: build information with and without VCS stamping, and the
// link-time overrides.
func TestFrom(t *testing.T) {
	got := from(nil, false)
	if got.Version != "devel" || got.Commit != "unknown" || got.GoVersion != runtime.Version() {
		t.Errorf("no build info: %+v", got)
	}
	got = from(&debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "(devel)"}}, true)
	if got.Version != "devel" || got.Commit != "unknown" || got.GoVersion != "go1.99" {
		t.Errorf("-buildvcs=false: %+v", got)
	}
	bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	got = from(bi, true)
	if got.Version != "v1.2.3" || got.Commit != "abc123" || !got.Modified {
		t.Errorf("stamped build: %+v", got)
	}
	Version, Commit = "v9.9.9", "feed"
	defer func() { Version, Commit = "", "" }()
	if got = from(bi, true); got.Version != "v9.9.9" || got.Commit != "feed" {
		t.Errorf("-ldflags -X: %+v", got)
	}
}
