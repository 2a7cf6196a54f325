#!/bin/sh
# memory-in-cgroup.sh [LIMIT_MIB] [CONNECTIONS] measures flashsale's memory
# as a container runs it: a fresh `flashsale serve` with its default
# settings inside a memory cgroup of LIMIT_MIB (default 256), so that
# FLASHSALE_MEMORY_LIMIT=auto finds the limit, then `flashsale bench
# -connections CONNECTIONS` (default 10000) against it. It prints the bench's
# MEMORY line, the cgroup's peak usage and its OOM count, and exits non-zero
# if the server was killed.
#
# Needs root (it creates a cgroup: v2's memory.max, or v1's
# memory.limit_in_bytes under the current memory cgroup), bin/flashsale
# (go build -o bin/flashsale ./cmd/flashsale), PostgreSQL and Redis.
# DB (default postgres://postgres@127.0.0.1:5432/flashsale_mem) is the
# database the server uses; it is created if missing.
set -eu
limit_mib=${1:-256}
conns=${2:-10000}
cd "$(dirname "$0")/.."
DB=${DB:-postgres://postgres@127.0.0.1:5432/flashsale_mem?sslmode=disable}
addr=127.0.0.1:18499
prefix=fsmem-$$
work=$(mktemp -d)

if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	cg=/sys/fs/cgroup/flashsale-mem-$$
	mkdir "$cg"
	echo $((limit_mib * 1024 * 1024)) >"$cg/memory.max"
	peak=$cg/memory.peak
	ooms() { grep -E '^oom_kill ' "$cg/memory.events" | cut -d' ' -f2; }
else
	parent=/sys/fs/cgroup/memory$(grep -E '^[0-9]+:memory:' /proc/self/cgroup | cut -d: -f3)
	cg=$parent/flashsale-mem-$$
	mkdir "$cg"
	echo $((limit_mib * 1024 * 1024)) >"$cg/memory.limit_in_bytes"
	peak=$cg/memory.max_usage_in_bytes
	ooms() { grep -E '^oom_kill ' "$cg/memory.oom_control" | cut -d' ' -f2; }
fi
cleanup() {
	[ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	rmdir "$cg" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

sh -c "echo \$\$ >'$cg/cgroup.procs'; exec bin/flashsale serve -http-addr $addr -database-url '$DB' \
	-redis-prefix $prefix -data-dir '$work/data' -admin-token adm-mem -user-token-secret sec-mem \
	-drain-delay 0s -log-level info" >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 50); do
	curl -fs "http://$addr/healthz" >/dev/null 2>&1 && break
	sleep 0.2
done
grep 'memory limit' "$work/serve.log" || true
bin/flashsale bench -target "http://$addr" -admin-token adm-mem -user-token-secret sec-mem \
	-database-url "$DB" -redis-prefix $prefix -connections "$conns" -connections-hold 30s | grep -E '^MEMORY'
echo "cgroup limit ${limit_mib} MiB: peak usage $(($(cat "$peak") / 1024 / 1024)) MiB, OOM kills $(ooms)"
kill -0 "$pid"
