#!/usr/bin/env bash
# stages.sh NAME COMMAND [NAME COMMAND ...]: runs each COMMAND (a shell
# command line) as a named stage, one after the other, and keeps going after
# a stage fails. While a stage prints nothing for HEARTBEAT seconds (default
# 60) a line says which stage runs, for how long, and which test binaries
# are busy. At the end a table lists every stage with its result and
# duration; the exit status is 1 if any stage failed.
#
# Used by `make test`. STAGES_ONLY (a space list of names) runs only those.
set -uo pipefail

heartbeat=${HEARTBEAT:-60}
only=" ${STAGES_ONLY:-} "
logdir=$(mktemp -d "${TMPDIR:-/tmp}/flashsale-stages.XXXXXX")
trap 'rm -rf "$logdir"' EXIT

fmt_dur() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# busy_tests prints the test binaries running below pid $1 (go test runs
# each package's binary as pkg.test).
busy_tests() {
	local pids=$1 all next
	all=$(ps -eo pid=,ppid=,args= 2>/dev/null) || return 0
	local seen=" $1 "
	for _ in 1 2 3 4 5 6; do
		next=$(awk -v s="$seen" 'BEGIN { n = split(s, a, " "); for (i = 1; i <= n; i++) p[a[i]] = 1 }
			p[$2] && !p[$1] { print $1 }' <<<"$all")
		[ -z "$next" ] && break
		seen="$seen $(echo $next) "
	done
	awk -v s="$seen" 'BEGIN { n = split(s, a, " "); for (i = 1; i <= n; i++) p[a[i]] = 1 }
		p[$1] { for (i = 3; i <= 4 && i <= NF; i++) if ($i ~ /\.test$/) { sub(".*/", "", $i); printf " %s", $i } }' <<<"$all" | tr ' ' '\n' | sort -u | xargs
}

names=() results=() durations=()
failed=0
start_all=$(date +%s)
while [ $# -ge 2 ]; do
	name=$1 cmd=$2
	shift 2
	if [ -n "${STAGES_ONLY:-}" ] && [[ $only != *" $name "* ]]; then
		continue
	fi
	log="$logdir/$name.log"
	: >"$log"
	printf '\n=== stage %s: %s\n' "$name" "$cmd"
	t0=$(date +%s)
	(bash -c "$cmd" 2>&1 | tee -a "$log") &
	pid=$!
	(
		while sleep "$heartbeat"; do
			kill -0 "$pid" 2>/dev/null || exit 0
			now=$(date +%s)
			last=$(stat -c %Y "$log" 2>/dev/null || echo "$now")
			if [ $((now - last)) -ge "$heartbeat" ]; then
				printf '... stage %s still running (%s so far, quiet for %s)%s\n' "$name" \
					"$(fmt_dur $((now - t0)))" "$(fmt_dur $((now - last)))" \
					"$(b=$(busy_tests "$pid"); [ -n "$b" ] && printf '; busy: %s' "$b")"
			fi
		done
	) &
	hb=$!
	wait "$pid"
	rc=$?
	kill "$hb" 2>/dev/null
	wait "$hb" 2>/dev/null
	d=$(($(date +%s) - t0))
	if [ "$rc" -eq 0 ]; then r=ok; else r="FAIL (exit $rc)"; failed=1; fi
	printf '=== stage %s: %s in %s\n' "$name" "$r" "$(fmt_dur "$d")"
	names+=("$name") results+=("$r") durations+=("$d")
done

printf '\n%-22s %-16s %s\n' STAGE RESULT TIME
for i in "${!names[@]}"; do
	printf '%-22s %-16s %s\n' "${names[$i]}" "${results[$i]}" "$(fmt_dur "${durations[$i]}")"
done
printf '%-22s %-16s %s\n' total "$([ $failed = 0 ] && echo ok || echo FAIL)" "$(fmt_dur $(($(date +%s) - start_all)))"
exit $failed
