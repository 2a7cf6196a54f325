#!/usr/bin/env bash
# stages.sh NAME COMMAND ... [--lane NAME COMMAND ...]...: runs each COMMAND
# (a shell command line) as a named stage and keeps going after a stage
# fails.
#
# The stages before the first --lane run first, one after the other (the
# set-up every lane needs). Each --lane then starts a lane: the lanes run at
# the same time, the stages of one lane one after the other. A lane pairs
# stages that mostly wait (the database-backed tests, the fault suite) with
# stages that mostly compute (lint, the tests without a database, fuzzing),
# so that two cores are kept busy without either lane starving the other.
#
# Every line a stage prints is shown as it comes, prefixed with the stage's
# name. While a stage prints nothing for HEARTBEAT seconds (default 60) a
# line says which stage runs, for how long, and which test binaries are
# busy. At the end a table lists every stage with its result and duration,
# followed by the last lines of each failed stage; the exit status is 1 if
# any stage failed.
#
# Used by `make test`. STAGES_ONLY (a space list of names) runs only those;
# STAGES_SERIAL=1 runs the lanes one after the other instead (to time each
# stage alone).
set -uo pipefail

heartbeat=${HEARTBEAT:-60}
only=" ${STAGES_ONLY:-} "
serial=${STAGES_SERIAL:-0}
logdir=$(mktemp -d "${TMPDIR:-/tmp}/flashsale-stages.XXXXXX")
trap 'rm -rf "$logdir"' EXIT

fmt_dur() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# busy_tests prints the test binaries running below pid $1 (go test runs
# each package's binary as pkg.test).
busy_tests() {
	local all next
	all=$(ps -eo pid=,ppid=,args= 2>/dev/null) || return 0
	local seen=" $1 "
	for _ in 1 2 3 4 5 6 7 8; do
		next=$(awk -v s="$seen" 'BEGIN { n = split(s, a, " "); for (i = 1; i <= n; i++) p[a[i]] = 1 }
			p[$2] && !p[$1] { print $1 }' <<<"$all")
		[ -z "$next" ] && break
		seen="$seen $(echo $next) "
	done
	awk -v s="$seen" 'BEGIN { n = split(s, a, " "); for (i = 1; i <= n; i++) p[a[i]] = 1 }
		p[$1] { for (i = 3; i <= 4 && i <= NF; i++) if ($i ~ /\.test$/) { sub(".*/", "", $i); printf " %s", $i } }' <<<"$all" | tr ' ' '\n' | sort -u | xargs
}

# run_stage NAME COMMAND runs one stage, its output prefixed, and records
# its exit status and duration in $logdir/NAME.result.
run_stage() {
	local name=$1 cmd=$2 log="$logdir/$1.log" t0 rc d r
	: >"$log"
	printf '=== stage %s: %s\n' "$name" "$cmd"
	t0=$(date +%s)
	echo "$t0" >"$logdir/$name.start"
	# The stage's own pid, for the heartbeat's list of busy test binaries.
	bash -c 'echo $$ >"$0"; exec bash -c "$1"' "$logdir/$name.pid" "$cmd" 2>&1 | tee -a "$log" | sed -u "s/^/$name| /"
	rc=${PIPESTATUS[0]}
	d=$(($(date +%s) - t0))
	if [ "$rc" -eq 0 ]; then r=ok; else r="FAIL (exit $rc)"; fi
	printf '%s\t%s\n' "$r" "$d" >"$logdir/$name.result"
	printf '=== stage %s: %s in %s\n' "$name" "$r" "$(fmt_dur "$d")"
}

# Parse the arguments into the set-up stages and the lanes.
order=()                  # every stage's name, in the order given
declare -A cmds=()        # name -> command
setup=()                  # names of the set-up stages
lanes=()                  # each lane: a space list of stage names
lane=-1
while [ $# -gt 0 ]; do
	if [ "$1" = --lane ]; then
		lane=$((lane + 1))
		lanes[lane]=""
		shift
		continue
	fi
	[ $# -ge 2 ] || { echo "stages.sh: stage $1 has no command" >&2; exit 2; }
	name=$1 cmd=$2
	shift 2
	if [ -n "${STAGES_ONLY:-}" ] && [[ $only != *" $name "* ]]; then
		continue
	fi
	order+=("$name")
	cmds[$name]=$cmd
	if [ "$lane" -lt 0 ]; then
		setup+=("$name")
	else
		lanes[lane]+="$name "
	fi
done

start_all=$(date +%s)

(
	# The sleep is killed with the loop, so that it does not hold the
	# output open (a pipe reading make test would wait for it).
	trap 'kill $sl 2>/dev/null; exit 0' TERM
	while :; do
		sleep "$heartbeat" &
		sl=$!
		wait $sl
		now=$(date +%s)
		for f in "$logdir"/*.start; do
			[ -e "$f" ] || continue
			name=$(basename "$f" .start)
			[ -e "$logdir/$name.result" ] && continue
			t0=$(cat "$f")
			last=$(stat -c %Y "$logdir/$name.log" 2>/dev/null || echo "$now")
			if [ $((now - last)) -ge "$heartbeat" ]; then
				pid=$(cat "$logdir/$name.pid" 2>/dev/null)
				printf '... stage %s still running (%s so far, quiet for %s)%s\n' "$name" \
					"$(fmt_dur $((now - t0)))" "$(fmt_dur $((now - last)))" \
					"$([ -n "$pid" ] && b=$(busy_tests "$pid") && [ -n "$b" ] && printf '; busy: %s' "$b")"
			fi
		done
	done
) &
hb=$!

for name in "${setup[@]}"; do
	run_stage "$name" "${cmds[$name]}"
done
pids=()
for l in "${lanes[@]}"; do
	[ -n "$l" ] || continue
	if [ "$serial" = 1 ]; then
		for name in $l; do run_stage "$name" "${cmds[$name]}"; done
	else
		(for name in $l; do run_stage "$name" "${cmds[$name]}"; done) &
		pids+=($!)
	fi
done
for p in "${pids[@]}"; do wait "$p"; done
kill "$hb" 2>/dev/null
wait "$hb" 2>/dev/null

failed=0
printf '\n%-22s %-16s %s\n' STAGE RESULT TIME
for name in "${order[@]}"; do
	if [ -e "$logdir/$name.result" ]; then
		IFS=$'\t' read -r r d <"$logdir/$name.result"
	else
		r="FAIL (no result)" d=0
	fi
	[ "$r" = ok ] || failed=1
	printf '%-22s %-16s %s\n' "$name" "$r" "$(fmt_dur "$d")"
done
printf '%-22s %-16s %s\n' total "$([ $failed = 0 ] && echo ok || echo FAIL)" "$(fmt_dur $(($(date +%s) - start_all)))"
for name in "${order[@]}"; do
	[ -e "$logdir/$name.result" ] && [ "$(cut -f1 "$logdir/$name.result")" = ok ] && continue
	printf '\n=== stage %s failed; the lines that say why:\n' "$name"
	why=$(grep -E -- '^(--- FAIL|FAIL|panic:|fatal error:|[[:space:]]+[A-Za-z0-9_]+\.go:[0-9]+:|[^[:space:]]+\.go:[0-9]+:[0-9]+:|ERROR|make(\[[0-9]+\])?: \*\*\*|gofmt needed)' "$logdir/$name.log" | tail -60)
	if [ -n "$why" ]; then echo "$why"; else tail -40 "$logdir/$name.log"; fi
done
exit $failed
