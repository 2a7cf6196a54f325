#!/usr/bin/env bash
# test-packages.sh db|nodb [PACKAGES...]: prints the packages (default ./...)
# whose tests run on the database under test (db), or those whose tests do
# not depend on it (nodb): for these the PostgreSQL and the MariaDB passes
# would be the same run.
#
# A package's tests use the database under test when a Go file of the
# package, or a non-test file of a package its tests import from this
# module, asks internal/testenv for one (testenv.Database, StartDatabase,
# Dialect) or reads the test database settings (FLASHSALE_TEST_DIALECT,
# FLASHSALE_TEST_DATABASE_URL, FLASHSALE_TEST_MYSQL_URL); testenv.Postgres
# and testenv.MySQL count too. testenv's own files, which define those
# helpers, do not. `make test` runs the db packages once per database and
# the nodb packages once.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
want=${1:?usage: test-packages.sh db|nodb [PACKAGES...]}
shift
[ $# -gt 0 ] || set -- ./...

module=$($GO list -m)
pattern='testenv\.(Database|StartDatabase|Postgres|MySQL|Dialect)\b|FLASHSALE_TEST_(DIALECT|DATABASE_URL|MYSQL_URL)'

# tests: the module's packages with a test file matching pattern; src: those
# with a non-test file matching it (a helper other packages' tests import).
declare -A tests=() src=()
while read -r path dir; do
	[ "$path" = "$module/internal/testenv" ] && continue
	if grep -qsE "$pattern" "$dir"/*_test.go; then tests[$path]=1; fi
	for f in "$dir"/*.go; do
		case $f in *_test.go) continue ;; esac
		if grep -qsE "$pattern" "$f"; then src[$path]=1; break; fi
	done
done < <($GO list -f '{{.ImportPath}} {{.Dir}}' ./...)

for pkg in $($GO list "$@"); do
	db=${tests[$pkg]:-}
	if [ -z "$db" ]; then
		for dep in $($GO list -test -deps -f '{{if not .Standard}}{{.ImportPath}}{{end}}' "$pkg"); do
			if [ -n "${src[$dep]:-}" ]; then db=1; break; fi
		done
	fi
	case $want in
	db) [ -n "$db" ] && echo "$pkg" ;;
	nodb) [ -z "$db" ] && echo "$pkg" ;;
	*) echo "test-packages.sh: want db or nodb, not $want" >&2; exit 2 ;;
	esac
done
exit 0
