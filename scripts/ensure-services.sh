#!/usr/bin/env bash
# ensure-services.sh makes sure the services flashsale talks to are installed
# and answering.
#
#   scripts/ensure-services.sh          what the tests need (make test, CI):
#       PostgreSQL on 127.0.0.1:5432 (trust auth for local TCP, so
#       `psql -h 127.0.0.1 -U postgres` needs no password), Redis on
#       127.0.0.1:6379 and MariaDB on 127.0.0.1:3306 (root, no password),
#       plus the redis-server and mariadbd binaries (tests start private
#       ones), promtool (alert rules), chromium (dashboard tests) and
#       haproxy (its configuration is checked with `haproxy -c`).
#   scripts/ensure-services.sh --run    what running flashsale needs (make run):
#       PostgreSQL and Redis only, as above; the database is skipped when
#       FLASHSALE_DATABASE_URL is set (your own server), Redis when
#       FLASHSALE_REDIS_URL is set. No MariaDB, promtool or chromium.
# NATS is not needed: tests and the service embed nats-server in-process.
#
# Idempotent: when everything already answers it only checks and exits, and
# needs no privileges. Otherwise it installs what is missing with apt-get,
# starts what is stopped and, only when loopback logins to PostgreSQL ask for
# a password (a fresh Debian/Ubuntu install), puts two trust lines for
# 127.0.0.1 and ::1 at the top of pg_hba.conf (marked "# flashsale"); for
# that it needs root or passwordless sudo.
#
# Environment overrides (defaults are the machine's shared services):
#   PG_HOST=127.0.0.1 PG_PORT=5432 PG_CLUSTER=main PG_VERSION=<newest installed>
#   REDIS_PORT=6379 REDIS_DIR=/var/lib/redis REDIS_LOGFILE=/var/log/redis/ci.log
#   ENSURE_SERVICES_TIMEOUT=60   seconds to wait for each service to answer
#   MARIADB_PORT=3306
#   ENSURE_MARIADB=0             skip MariaDB (ensured by default, never with --run)
#   ENSURE_SERVICES_LOCK=/tmp/flashsale-ensure-services.lock
#
# The script can be sourced (functions only, nothing runs) to test one part.
set -euo pipefail

PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
PG_CLUSTER=${PG_CLUSTER:-main}
PG_VERSION=${PG_VERSION:-}
REDIS_PORT=${REDIS_PORT:-6379}
REDIS_DIR=${REDIS_DIR:-/var/lib/redis}
REDIS_LOGFILE=${REDIS_LOGFILE:-/var/log/redis/ci.log}
MARIADB_PORT=${MARIADB_PORT:-3306}
ENSURE_SERVICES_TIMEOUT=${ENSURE_SERVICES_TIMEOUT:-60}
ENSURE_SERVICES_LOCK=${ENSURE_SERVICES_LOCK:-/tmp/flashsale-ensure-services.lock}

APT_UPDATED=0
LOCKED=0

log() { printf 'ensure-services: %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# as_root runs a command as root: directly when we are root, else through sudo.
# It closes fd 9, the lock: a daemon it starts must not hold the lock forever.
as_root() {
	if [[ $(id -u) -eq 0 ]]; then
		"$@" 9>&-
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo -n "$@" 9>&-
	else
		die "need root (or passwordless sudo) to run: $*"
	fi
}

# take_lock serializes the slow path, so two concurrent runs (say CI and a
# developer) do not both install packages or start a second redis-server.
take_lock() {
	[[ $LOCKED -eq 1 ]] && return 0
	if ! command -v flock >/dev/null 2>&1; then
		log "flock not found; running without a lock"
	elif ! { exec 9>>"$ENSURE_SERVICES_LOCK"; } 2>/dev/null; then
		log "cannot open $ENSURE_SERVICES_LOCK; running without a lock"
	else
		flock -w 300 9 || die "could not take $ENSURE_SERVICES_LOCK within 300s"
	fi
	LOCKED=1
}

apt_install() {
	take_lock
	command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install $* by hand"
	if [[ $APT_UPDATED -eq 0 ]]; then
		log "apt-get update"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 update -q
		APT_UPDATED=1
	fi
	log "apt-get install -y $*"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -q --no-install-recommends "$@"
}

# wait_for polls a command once a second until it succeeds or the timeout passes.
wait_for() {
	local what=$1
	shift
	local deadline=$((SECONDS + ENSURE_SERVICES_TIMEOUT))
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then
			return 1
		fi
		sleep 1
	done
	log "$what is ready"
}

# ---- PostgreSQL -------------------------------------------------------------

pg_ready() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 3; }

# pg_login tries to log in as postgres over TCP with no password at all
# (no PGPASSWORD, no .pgpass), printing psql's error on failure.
pg_login() {
	{
		env -u PGPASSWORD -u PGSERVICE PGPASSFILE=/dev/null PGCONNECT_TIMEOUT=5 \
			timeout 15 psql -X -w -q -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -Atc 'select 1' >/dev/null
	} 2>&1
}

pg_trusted() { pg_login >/dev/null; }

pg_binaries_present() {
	command -v pg_ctlcluster >/dev/null 2>&1 &&
		command -v pg_isready >/dev/null 2>&1 &&
		command -v psql >/dev/null 2>&1 &&
		compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}

# pg_pick_version prints the PostgreSQL major version to use: PG_VERSION, else
# the newest one that has a cluster named PG_CLUSTER, else the newest installed.
pg_pick_version() {
	if [[ -n $PG_VERSION ]]; then
		echo "$PG_VERSION"
		return
	fi
	local v
	v=$(find /etc/postgresql -mindepth 2 -maxdepth 2 -name "$PG_CLUSTER" -printf '%h\n' 2>/dev/null |
		xargs -r -n1 basename | sort -V | tail -n1)
	if [[ -z $v ]]; then
		v=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/postgres' 2>/dev/null |
			awk -F/ '{print $5}' | sort -V | tail -n1)
	fi
	[[ -n $v ]] || die "no PostgreSQL server version found under /usr/lib/postgresql"
	echo "$v"
}

# pg_hba_trust puts trust lines for local TCP at the top of pg_hba.conf
# (pg_hba is first-match, so appending would not override scram-sha-256 lines)
# and reloads. Only ever done on a box whose loopback logins ask for a password.
pg_hba_trust() {
	local ver=$1 hba="/etc/postgresql/$1/$PG_CLUSTER/pg_hba.conf"
	as_root test -f "$hba" || die "$hba not found"
	if as_root grep -q '^# flashsale: ensure-services.sh' "$hba"; then
		log "$hba already has the flashsale trust lines, yet login failed; not editing again"
	else
		log "adding 'host all all 127.0.0.1/32 trust' (and ::1/128) at the top of $hba"
		local tmp
		tmp=$(mktemp)
		{
			echo '# flashsale: ensure-services.sh: CI/dev box, local TCP logins need no password.'
			echo 'host    all             all             127.0.0.1/32            trust'
			echo 'host    all             all             ::1/128                 trust'
			as_root cat "$hba"
		} >"$tmp"
		as_root cp "$tmp" "$hba"
		rm -f "$tmp"
	fi
	as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$PG_CLUSTER" reload
}

ensure_postgres() {
	if pg_ready && pg_trusted; then
		log "PostgreSQL $PG_HOST:$PG_PORT is up (trust auth)"
		return 0
	fi
	take_lock

	if ! pg_binaries_present; then
		log "PostgreSQL binaries missing"
		apt_install postgresql
	fi

	local ver
	ver=$(pg_pick_version)
	if [[ ! -d /etc/postgresql/$ver/$PG_CLUSTER ]]; then
		log "creating cluster $ver/$PG_CLUSTER on port $PG_PORT"
		as_root pg_createcluster --port "$PG_PORT" "$ver" "$PG_CLUSTER"
	fi

	if ! pg_ready; then
		# Socket directory lives on tmpfs on some boxes and vanishes on reboot.
		as_root install -d -o postgres -g postgres -m 2775 /var/run/postgresql
		if pg_lsclusters -h 2>/dev/null | awk -v v="$ver" -v c="$PG_CLUSTER" '$1==v && $2==c {print $4}' | grep -q online; then
			log "cluster $ver/$PG_CLUSTER is already running; waiting for it to accept connections"
		else
			log "starting PostgreSQL: pg_ctlcluster --skip-systemctl-redirect $ver $PG_CLUSTER start"
			as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$PG_CLUSTER" start ||
				die "pg_ctlcluster start failed; see /var/log/postgresql/postgresql-$ver-$PG_CLUSTER.log"
		fi
		wait_for "PostgreSQL $PG_HOST:$PG_PORT" pg_ready ||
			die "PostgreSQL did not answer pg_isready -h $PG_HOST -p $PG_PORT within ${ENSURE_SERVICES_TIMEOUT}s; see /var/log/postgresql/postgresql-$ver-$PG_CLUSTER.log"
	fi

	local err
	if ! err=$(pg_login); then
		case $err in
		*"no password supplied"* | *"password authentication failed"* | *"authentication failed"*) ;;
		*) die "psql -h $PG_HOST -p $PG_PORT -U postgres failed, and not for a password: $err" ;;
		esac
		pg_hba_trust "$ver"
		wait_for "PostgreSQL trust auth" pg_trusted ||
			die "psql -h $PG_HOST -p $PG_PORT -U postgres still fails without a password; check /etc/postgresql/$ver/$PG_CLUSTER/pg_hba.conf"
	fi
	log "PostgreSQL $PG_HOST:$PG_PORT is up (trust auth)"
}

# ---- Redis ------------------------------------------------------------------

redis_ready() { [[ $(timeout 5 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null) == PONG ]]; }

ensure_redis() {
	if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 && redis_ready; then
		log "Redis 127.0.0.1:$REDIS_PORT is up"
		return 0
	fi
	take_lock

	if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
		log "redis-server or redis-cli missing"
		apt_install redis-server
	fi
	# The package may have started its own redis-server on install.
	if redis_ready; then
		log "Redis 127.0.0.1:$REDIS_PORT is up"
		return 0
	fi

	as_root mkdir -p "$REDIS_DIR" "$(dirname "$REDIS_LOGFILE")"
	log "starting redis-server on 127.0.0.1:$REDIS_PORT (dir $REDIS_DIR, log $REDIS_LOGFILE)"
	as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" \
		--save "" --appendonly no --dir "$REDIS_DIR" --logfile "$REDIS_LOGFILE" ||
		die "redis-server failed to start; see $REDIS_LOGFILE"
	if ! wait_for "Redis 127.0.0.1:$REDIS_PORT" redis_ready; then
		tail -n 20 "$REDIS_LOGFILE" >&2 2>/dev/null || true
		die "Redis did not answer redis-cli -p $REDIS_PORT ping within ${ENSURE_SERVICES_TIMEOUT}s; see $REDIS_LOGFILE"
	fi
}

# ---- MariaDB (the second dialect of the test suite; ENSURE_MARIADB=0 skips) --

mariadb_ready() { mariadb-admin -h 127.0.0.1 -P "$MARIADB_PORT" -u root --connect-timeout=3 ping >/dev/null 2>&1; }

ensure_mariadb() {
	if command -v mariadb-admin >/dev/null 2>&1 && mariadb_ready; then
		log "MariaDB 127.0.0.1:$MARIADB_PORT is up"
		return 0
	fi
	take_lock
	if ! command -v mariadbd >/dev/null 2>&1 && [[ ! -x /usr/sbin/mariadbd ]]; then
		apt_install mariadb-server mariadb-client
	fi
	as_root install -d -o mysql -g mysql -m 755 /run/mysqld
	log "starting MariaDB: start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"
	as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
	wait_for "MariaDB 127.0.0.1:$MARIADB_PORT" mariadb_ready ||
		die "MariaDB did not answer on 127.0.0.1:$MARIADB_PORT within ${ENSURE_SERVICES_TIMEOUT}s"
}

# ensure_tools installs the command-line tools the tests use: promtool (alert
# rules), chromium (the dashboard's browser tests), haproxy (the check of
# deploy/haproxy/haproxy.cfg and the cluster test's balancer) and ip
# (iproute2: the cluster test's network namespace).
ensure_tools() {
	local missing=()
	command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
	command -v chromium >/dev/null 2>&1 || [[ -x /usr/bin/chromium ]] || missing+=(chromium)
	command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
	command -v ip >/dev/null 2>&1 || [[ -x /usr/sbin/ip ]] || [[ -x /sbin/ip ]] || missing+=(iproute2)
	if ((${#missing[@]} > 0)); then
		take_lock
		apt_install "${missing[@]}"
	fi
	log "tools ready: promtool, chromium, haproxy, ip"
}

main() {
	local mode=test
	case ${1:-} in
	"") ;;
	--run) mode=run ;;
	-h | --help)
		sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
		return 0
		;;
	*) die "unknown argument $1 (usage: ensure-services.sh [--run])" ;;
	esac
	if [[ $mode == run ]]; then
		if [[ -n ${FLASHSALE_DATABASE_URL:-} ]]; then
			log "FLASHSALE_DATABASE_URL is set: using that database, not ensuring PostgreSQL"
		else
			ensure_postgres
		fi
		if [[ -n ${FLASHSALE_REDIS_URL:-} ]]; then
			log "FLASHSALE_REDIS_URL is set: using that Redis, not ensuring one"
		else
			ensure_redis
		fi
		log "services for running flashsale ready"
		return 0
	fi
	ensure_tools
	ensure_postgres
	ensure_redis
	if [[ ${ENSURE_MARIADB:-1} == 1 ]]; then
		ensure_mariadb
	fi
	log "all services ready"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	main "$@"
fi
