# Targets for building, testing and linting flashsale. `make` alone lists them.
#
# `make test` is the test command (scripts/stages.sh runs its stages, keeps
# going after a failing one and ends with a table of every stage's result
# and time): it makes sure PostgreSQL, MariaDB and Redis run
# (scripts/ensure-services.sh), checks the alert rules, runs with the race
# detector the packages whose tests use no database once (test-nodb) and
# those that do on PostgreSQL and on MariaDB (test-postgres, test-mysql;
# scripts/test-packages.sh tells them apart), failing (not skipping) tests
# whose service is missing, then the fault suite's CHAOS_SHORT scenarios on
# each database (docs/faults.md), and the short cluster test on
# CLUSTER_SHORT_DIALECTS (docs/faults.md, "Cluster test").

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
PKGS        ?= ./...

# Every go command here compiles without source paths (-trimpath), nested
# ones too (the fault suite's binary, the upgrade test's previous release):
# a fresh clone at a new path then reuses the Go build cache instead of
# compiling the module again (a minute of each make test here).
export GOFLAGS := $(strip $(GOFLAGS) -trimpath)

.DEFAULT_GOAL := help
.PHONY: help build build-static test prebuild test-nodb test-postgres test-mysql test-short stress test-chaos-short test-cluster test-cluster-short chaos vet lint alerts bench run ci

# CHAOS_SHORT names the fault-suite scenarios `make test` runs on each
# database (docs/faults.md): a comma list, `short` for the short set, empty
# for none. CHAOS names those `make chaos` runs (default every one).
CHAOS_SHORT ?= short
CHAOS       ?= all

# The databases the cluster test runs on: make test runs the short version on
# CLUSTER_SHORT_DIALECTS (one, to stay within a couple of minutes; set it to
# mysql, or "postgres mysql"), make test-cluster the full one on CLUSTER_DIALECTS.
CLUSTER_SHORT_DIALECTS ?= postgres
CLUSTER_DIALECTS       ?= postgres mysql

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-19s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Build bin/flashsale
	$(GO) build -o bin/flashsale ./cmd/flashsale

build-static: ## Build the release binary bin/flashsale as the Dockerfile does (static, trimmed, stripped: scripts/build-static.sh)
	GO=$(GO) scripts/build-static.sh bin/flashsale

# The race detector's runs. TEST_PARALLEL is -parallel, how many tests
# that call t.Parallel run at once in one package. Two packages run at
# once (go test -p, the CPUs), beside the other lane's stage: 8 kept the
# two cores at a load of 10-12 for the whole run, where tests with the
# user's default timeouts (1 s Redis calls, 700 ms /readyz checks, a 2 s
# breaker) timed out on the machine's account, not the product's; 4
# halves that oversubscription.
#
# They run through gotestsum (pinned), which prints what go test prints
# without -v and keeps every test's events in $(TEST_REPORTS)/STAGE.json;
# each stage then lists its SLOWEST slowest tests, so that CI's log says
# where the time goes.
TEST_PARALLEL ?= 4
GOTESTSUM     ?= gotest.tools/gotestsum@v1.13.0
TEST_REPORTS  ?= $(CURDIR)/.test-reports
SLOWEST       ?= 12
RACE = $(GO) run $(GOTESTSUM) --format standard-quiet --jsonfile $(TEST_REPORTS)/$@.json -- \
	-race -count=1 -timeout 20m -parallel $(TEST_PARALLEL) $(TESTFLAGS)
# slowest lists the slowest tests of the stage's report, and exits with the
# status of the test run before it ($$s).
SLOWEST_OF = echo "slowest tests of $@:"; $(GO) run $(GOTESTSUM) tool slowest --jsonfile $(TEST_REPORTS)/$@.json --threshold 1s --num $(SLOWEST); exit $$s
DB_PKGS   = $$(scripts/test-packages.sh db $(PKGS))
NODB_PKGS = $$(scripts/test-packages.sh nodb $(PKGS))

test: ## The test command, and all that CI runs: ensure services, compile (prebuild), lint, then two lanes, one after the other (STAGES_SERIAL=0: at once) (alert rules, the tests without a database, fuzzing, the short fault suite on both databases | the database-backed tests on PostgreSQL then MariaDB, every benchmark once, the short cluster and upgrade tests); a summary of every stage at the end
	@STAGES_SERIAL=$${STAGES_SERIAL:-1} scripts/stages.sh \
		services       'scripts/ensure-services.sh' \
		prebuild       '$(MAKE) --no-print-directory prebuild' \
		lint           '$(MAKE) --no-print-directory lint' \
		--lane \
		alerts         '$(MAKE) --no-print-directory alerts' \
		nodb           '$(MAKE) --no-print-directory test-nodb' \
		fuzz           'FUZZCACHE=fresh $(MAKE) --no-print-directory fuzz FUZZTIME=$(TEST_FUZZTIME)' \
		chaos-postgres '$(MAKE) --no-print-directory test-chaos-short CHAOS_DIALECTS=postgres' \
		chaos-mysql    '$(MAKE) --no-print-directory test-chaos-short CHAOS_DIALECTS=mysql' \
		--lane \
		postgres       '$(MAKE) --no-print-directory test-postgres' \
		mysql          '$(MAKE) --no-print-directory test-mysql' \
		bench          '$(MAKE) --no-print-directory bench' \
		cluster-short  '$(MAKE) --no-print-directory test-cluster-short' \
		upgrade-short  '$(MAKE) --no-print-directory test-upgrade UPGRADE=short'

# prebuild compiles, before the lanes start, what their stages would
# otherwise compile while the other lane's end-to-end tests run: every
# package the tests import (their test-only dependencies included; not the
# packages' own test variants, nor the binaries the tests link), plain and
# with -race, the fuzzing binaries and staticcheck; lint (staticcheck's
# analysis, minutes with an empty cache) runs after it, also before the
# lanes. With an empty build cache this is many minutes of both cores (a CI
# run on a fresh machine had the breaker, drill and two-instance tests time
# out beside it); with a warm one, about 20 s.
prebuild: ## Compile what the test stages need (plain, -race, fuzzing, staticcheck) before they start
	@pkgs=$$($(GO) list -deps -test -f '{{if not .Standard}}{{.ImportPath}}{{end}}' $(PKGS)) || exit 1; \
	deps=$$(echo "$$pkgs" | grep -v ' \[\|\.test$$' | sort -u); \
	$(GO) build $$deps && $(GO) build -race $$deps || exit 1; \
	for p in $$($(GO) list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.Dir}}{{end}}' $(PKGS)); do \
		grep -qs '^func Fuzz' $$p/*_test.go || continue; \
		$(GO) test -c -fuzz=. -o /dev/null $$p || exit 1; \
	done; \
	$(GO) run $(STATICCHECK) -version

# TEST_FUZZTIME is each fuzz target's budget in make test: a count, not a
# duration (scripts/fuzz.sh says why). 20,000 new inputs a target after the
# committed corpus: the fuzzers run on both cores for as long as they run,
# and at 50,000 they held the other lane's end-to-end tests up for 2.5
# minutes of every CI run; a longer search is `make fuzz FUZZTIME=10m`.
TEST_FUZZTIME ?= 20000x

test-nodb: ## The packages whose tests use no database, with -race, once (scripts/test-packages.sh nodb)
	mkdir -p $(TEST_REPORTS); FLASHSALE_TEST_REQUIRE_SERVICES=1 $(RACE) $(NODB_PKGS); s=$$?; $(SLOWEST_OF)

test-postgres: ## The database-backed packages with -race on PostgreSQL (test-nodb test-postgres: everything)
	mkdir -p $(TEST_REPORTS); FLASHSALE_TEST_DIALECT=postgres FLASHSALE_TEST_REQUIRE_SERVICES=1 $(RACE) $(DB_PKGS); s=$$?; $(SLOWEST_OF)

test-mysql: ## The database-backed packages with -race on MariaDB/MySQL (FLASHSALE_TEST_MYSQL_URL)
	mkdir -p $(TEST_REPORTS); FLASHSALE_TEST_DIALECT=mysql FLASHSALE_TEST_REQUIRE_SERVICES=1 $(RACE) $(DB_PKGS); s=$$?; $(SLOWEST_OF)

CHAOS_DIALECTS ?= postgres mysql
# CHAOS_PARALLEL: how many fault scenarios run at once (each has its own
# processes; a scenario whose fault reaches the shared database server runs
# alone).
CHAOS_PARALLEL ?= 3

test-chaos-short: ## The fault suite's CHAOS_SHORT scenarios (empty: none) on CHAOS_DIALECTS (PostgreSQL, then MariaDB)
	@if [ -z "$(CHAOS_SHORT)" ]; then echo "CHAOS_SHORT is empty: no fault scenarios"; exit 0; fi; \
	for d in $(CHAOS_DIALECTS); do \
		FLASHSALE_CHAOS="$(CHAOS_SHORT)" FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 15m -parallel $(CHAOS_PARALLEL) -run '^TestChaos$$' ./internal/chaos || exit 1; \
	done

test-cluster-short: ## The cluster test, short (2 to 3 min): Redis Cluster, NATS cluster, 3 instances behind HAProxy, 4 faults, then the short cluster drill; on CLUSTER_SHORT_DIALECTS (needs root: a network namespace)
	@for d in $(CLUSTER_SHORT_DIALECTS); do \
		FLASHSALE_CLUSTER=short FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 10m -run '^TestCluster$$' ./internal/cluster || exit 1; \
	done

test-cluster: ## The cluster test, full (longer faults, more buyers), on CLUSTER_DIALECTS (PostgreSQL, then MariaDB)
	@for d in $(CLUSTER_DIALECTS); do \
		FLASHSALE_CLUSTER=full FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 20m -run '^TestCluster$$' ./internal/cluster || exit 1; \
	done

# UPGRADE: full (3 instances) or short (2 instances, about 50 s a database),
# on UPGRADE_DIALECTS.
UPGRADE ?= full
UPGRADE_DIALECTS ?= postgres mysql
.PHONY: test-upgrade
test-upgrade: ## The previous release (release/previous, built from git) beside this tree behind HAProxy: upgraded one by one, rolled back one by one, invariants after each step; PostgreSQL then MariaDB (UPGRADE=short for CI's version)
	@for d in $(UPGRADE_DIALECTS); do \
		FLASHSALE_UPGRADE=$(UPGRADE) FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 15m -run '^TestUpgrade$$' ./internal/cluster || exit 1; \
	done

chaos: ## The fault suite, every scenario (or CHAOS=name,name; docs/faults.md lists them), one table row per fault, on PostgreSQL then MariaDB
	@status=0; for d in postgres mysql; do \
		FLASHSALE_CHAOS="$(CHAOS)" FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 40m -parallel $(CHAOS_PARALLEL) -run '^TestChaos$$' ./internal/chaos || status=1; \
	done; exit $$status

test-short: ## Quick tests (-short: slow end-to-end tests skip, and so do tests whose service is missing)
	env -u FLASHSALE_TEST_REQUIRE_SERVICES $(GO) test -short $(PKGS)

vet: ## gofmt check (fails if any file needs formatting) and go vet
	@unformatted=$$(gofmt -l .) || exit 1; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)

lint: vet ## vet, then staticcheck (pinned; first build takes about 2 minutes)
	$(GO) run $(STATICCHECK) $(PKGS)

alerts: ## Check and unit-test the Prometheus alert rules (promtool)
	promtool check rules deploy/prometheus/alerts.yml
	cd deploy/prometheus && promtool test rules alerts_test.yml

bench: ## Run every benchmark once (-benchtime 1x), with allocations (-benchmem); figures: docs/performance.md
	$(GO) test -run '^$$' -bench . -benchtime 1x -benchmem $(PKGS)

DRILL  ?= deploy/drills/local.json
TARGET ?= http://127.0.0.1:8080
drill: ## Run the drill DRILL (deploy/drills/local.json; cluster.json for the cluster topology) against TARGET (http://127.0.0.1:8080); its stores and tokens come from the FLASHSALE_* variables (docs/drills.md)
	$(GO) build -o bin/flashsale ./cmd/flashsale
	bin/flashsale drill -target $(TARGET) $(DRILL)

run: ## Ensure what running needs (PostgreSQL, Redis: ensure-services.sh --run), build bin/flashsale and run its demo (Ctrl-C drains and stops)
	scripts/ensure-services.sh --run
	$(GO) build -o bin/flashsale ./cmd/flashsale
	bin/flashsale demo

ci: ## What CI runs (.ci/run): make test, which lints, tests, fuzzes and runs every benchmark once
	$(MAKE) test

# FUZZTIME is each fuzz target's -fuzztime: a duration (10s) or a number of
# executions (50000x, what CI uses: scripts/fuzz.sh says why).
FUZZTIME ?= 10s

.PHONY: fuzz drill
fuzz: ## Run every fuzz target for FUZZTIME (10s, or a count: 50000x) each, one test binary per package; a failure prints its input and the command re-running it
	@GO=$(GO) scripts/fuzz.sh $(FUZZTIME) $(PKGS)

# STRESS_COUNT runs of each test that has flaked, under -race, with
# STRESS_LOAD busy loops taking CPU beside them (scripts/stress.sh).
STRESS_COUNT ?= 5
STRESS_LOAD  ?= 4

stress: ## Rerun the tests that have flaked STRESS_COUNT (5) times each under -race beside STRESS_LOAD (4) CPU burners, on FLASHSALE_TEST_DIALECT (postgres)
	@GO=$(GO) STRESS_COUNT=$(STRESS_COUNT) STRESS_LOAD=$(STRESS_LOAD) scripts/stress.sh
