package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/flashsale/flashsale/internal/buildinfo"
)

// runVersion prints the build: module version, VCS commit, Go version (the
// same values as the flashsale_build_info metric).
func runVersion(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { commandUsage(fs, "version") }
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return noArguments(fs)
	}
	bi := buildinfo.Get()
	commit := bi.Commit
	if bi.Modified {
		commit += " (modified)"
	}
	fmt.Fprintf(stdout, "flashsale %s\ncommit %s\n%s\n", bi.Version, commit, bi.GoVersion)
	return nil
}
