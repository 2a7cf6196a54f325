#!/usr/bin/env bash
# fuzz.sh BUDGET [PACKAGES...]: runs every fuzz target of PACKAGES (default
# ./...) for BUDGET, a -fuzztime value: a duration (10s) or a number of
# executions (50000x). Each package's fuzzing test binary is built once
# (go test -c -fuzz), then run once per target, in the package's directory.
#
# A count (Nx) is what CI uses: with a duration, Go up to 1.26 can report
# `context deadline exceeded` as a failure when the time is up while a
# worker is mid-call (go.dev/issue/75804), more likely the busier the
# machine; a count has no deadline. FUZZMINIMIZETIME (default 5s) bounds the
# minimization of each new input: the default 60 s shows up as minutes at
# "0/sec" near the end of a run.
#
# FUZZCACHE=fresh starts from the committed corpus (testdata/fuzz) alone,
# with a cache dropped at the end, so that a run's length does not grow with
# what earlier runs found (make test, CI); by default the inputs found are
# kept in the Go cache and replayed by the next run.
#
# A failing target prints the inputs it wrote to testdata/fuzz/FuzzX/ and
# the command that re-runs each one. The exit status is 1 if any target
# failed; the remaining targets still run.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
budget=${1:?usage: fuzz.sh BUDGET [PACKAGES...]}
shift
[ $# -gt 0 ] || set -- ./...
minimize=${FUZZMINIMIZETIME:-5s}

bindir=$(mktemp -d "${TMPDIR:-/tmp}/flashsale-fuzz.XXXXXX")
trap 'rm -rf "$bindir"' EXIT
cachedir=$($GO env GOCACHE)/fuzz
[ "${FUZZCACHE:-}" = fresh ] && cachedir=$bindir/cache

status=0
for pkg in $($GO list "$@"); do
	dir=$($GO list -f '{{.Dir}}' "$pkg")
	targets=$(grep -hoE '^func Fuzz[A-Za-z0-9_]*\(' "$dir"/*_test.go 2>/dev/null | sed 's/^func //; s/($//' | sort)
	[ -n "$targets" ] || continue
	bin="$bindir/$(basename "$pkg").test"
	echo "== $pkg: building the fuzzing test binary"
	if ! $GO test -c -fuzz=. -o "$bin" "$pkg"; then
		status=1
		continue
	fi
	for f in $targets; do
		echo "== $pkg $f ($budget)"
		corpus="$dir/testdata/fuzz/$f"
		before=$(ls "$corpus" 2>/dev/null | sort)
		(cd "$dir" && "$bin" -test.run='^$' -test.fuzz="^$f\$" -test.fuzztime="$budget" \
			-test.fuzzminimizetime="$minimize" -test.fuzzcachedir="$cachedir/$pkg")
		rc=$?
		[ "$rc" -eq 0 ] && continue
		status=1
		new=$(comm -13 <(echo "$before") <(ls "$corpus" 2>/dev/null | sort) | grep . || true)
		if [ -z "$new" ]; then
			echo "== $pkg $f FAILED (exit $rc) without writing a failing input (see the output above)"
			continue
		fi
		for id in $new; do
			echo "== $pkg $f FAILED on testdata/fuzz/$f/$id:"
			cat "$corpus/$id"
			echo "== re-run it with: go test -run='^$f/$id\$' $pkg"
		done
	done
done
exit $status
