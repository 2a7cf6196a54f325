#!/bin/sh
# build-static.sh [OUT] builds the release binary of flashsale at OUT
# (default bin/flashsale in the repository; a relative OUT is taken from the
# current directory): static (CGO_ENABLED=0, no ELF interpreter, runs
# on distroless/static or scratch), with paths trimmed and symbols stripped.
#
# The one place the release build flags live: the Dockerfile's build stage,
# `make build-static` and the test that checks the result
# (deploy/image_test.go) all run this script, so the image holds the binary
# CI builds. Version information comes from the Go build info (module
# version, VCS commit when the tree is a git checkout and -buildvcs allows
# it, Go version); EXTRA_LDFLAGS adds linker flags (say -X name=value).
set -eu
out=${1:-bin/flashsale}
if [ $# -ge 1 ]; then
	case $out in /*) ;; *) out=$PWD/$out ;; esac
fi
cd "$(dirname "$0")/.."
GO=${GO:-go}
# A .git that git cannot read (a worktree's link copied into a build
# context, git missing) would fail the build's VCS stamping: build without
# the stamp instead.
vcs=
if [ -e .git ] && ! git rev-parse --git-dir >/dev/null 2>&1; then
	vcs=-buildvcs=false
fi
CGO_ENABLED=0 exec "$GO" build $vcs -trimpath -ldflags "-s -w ${EXTRA_LDFLAGS:-}" -o "$out" ./cmd/flashsale
