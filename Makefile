# Targets for building, testing and linting flashsale. `make` alone lists them.
#
# `make test` is the test command: it makes sure PostgreSQL, MariaDB and Redis
# run (scripts/ensure-services.sh), then runs every test with the race
# detector twice: on PostgreSQL, then on MariaDB (FLASHSALE_TEST_DIALECT),
# failing (not skipping) tests whose service is missing, and then the fault
# suite's CHAOS_SHORT scenarios on each database (docs/faults.md), and the
# short cluster test on CLUSTER_SHORT_DIALECTS (docs/faults.md, "Cluster
# test").

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
PKGS        ?= ./...

.DEFAULT_GOAL := help
.PHONY: help build build-static test test-postgres test-mysql test-short test-chaos-short test-cluster test-cluster-short chaos vet lint alerts bench run ci

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

test: ## Ensure services and tools, check the alert rules, then run all tests with -race on PostgreSQL and on MariaDB (missing services fail), then the CHAOS_SHORT fault scenarios and the short cluster test
	scripts/ensure-services.sh
	$(MAKE) alerts
	$(MAKE) test-postgres
	$(MAKE) test-mysql
	$(MAKE) test-chaos-short
	$(MAKE) test-cluster-short

test-postgres: ## All tests with -race, the database being PostgreSQL
	FLASHSALE_TEST_DIALECT=postgres FLASHSALE_TEST_REQUIRE_SERVICES=1 $(GO) test -race -count=1 -timeout 20m $(PKGS)

test-mysql: ## All tests with -race, the database being MariaDB/MySQL (FLASHSALE_TEST_MYSQL_URL)
	FLASHSALE_TEST_DIALECT=mysql FLASHSALE_TEST_REQUIRE_SERVICES=1 $(GO) test -race -count=1 -timeout 20m $(PKGS)

test-chaos-short: ## The fault suite's CHAOS_SHORT scenarios (empty: none) on PostgreSQL, then MariaDB
	@if [ -z "$(CHAOS_SHORT)" ]; then echo "CHAOS_SHORT is empty: no fault scenarios"; exit 0; fi; \
	for d in postgres mysql; do \
		FLASHSALE_CHAOS="$(CHAOS_SHORT)" FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 15m -run '^TestChaos$$' ./internal/chaos || exit 1; \
	done

test-cluster-short: ## The cluster test, short (1.5 to 2.5 min): Redis Cluster, NATS cluster, 3 instances behind HAProxy, 4 faults; on CLUSTER_SHORT_DIALECTS (needs root: a network namespace)
	@for d in $(CLUSTER_SHORT_DIALECTS); do \
		FLASHSALE_CLUSTER=short FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 10m -run '^TestCluster$$' ./internal/cluster || exit 1; \
	done

test-cluster: ## The cluster test, full (longer faults, more buyers), on CLUSTER_DIALECTS (PostgreSQL, then MariaDB)
	@for d in $(CLUSTER_DIALECTS); do \
		FLASHSALE_CLUSTER=full FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 20m -run '^TestCluster$$' ./internal/cluster || exit 1; \
	done

# UPGRADE: full (3 instances) or short (2 instances, about 90 s a database).
UPGRADE ?= full
.PHONY: test-upgrade
test-upgrade: ## The previous release (release/previous, built from git) beside this tree behind HAProxy: upgraded one by one, rolled back one by one, invariants after each step; PostgreSQL then MariaDB (UPGRADE=short for CI's version)
	@for d in postgres mysql; do \
		FLASHSALE_UPGRADE=$(UPGRADE) FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 15m -run '^TestUpgrade$$' ./internal/cluster || exit 1; \
	done

chaos: ## The fault suite, every scenario (or CHAOS=name,name; docs/faults.md lists them), one table row per fault, on PostgreSQL then MariaDB
	@status=0; for d in postgres mysql; do \
		FLASHSALE_CHAOS="$(CHAOS)" FLASHSALE_TEST_DIALECT=$$d FLASHSALE_TEST_REQUIRE_SERVICES=1 \
			$(GO) test -count=1 -v -timeout 40m -run '^TestChaos$$' ./internal/chaos || status=1; \
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

run: ## Ensure what running needs (PostgreSQL, Redis: ensure-services.sh --run), then run the demo (go run ./cmd/flashsale demo)
	scripts/ensure-services.sh --run
	$(GO) run ./cmd/flashsale demo

ci: ## vet, test, then every benchmark once (CI runs .ci/run: also staticcheck and make fuzz)
	$(MAKE) vet
	$(MAKE) test
	$(MAKE) bench

FUZZTIME ?= 10s

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (10s) each; new failing inputs land in testdata/fuzz
	@set -e; for pkg in $$($(GO) list $(PKGS)); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done
