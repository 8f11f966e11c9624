#!/usr/bin/env bash
# Two `lakeshore worker` processes on one machine, a batch of invocations, `lakeshore status`,
# `wait` and `logs`, then SIGTERM: an invocation still running is handed back to the queue.
#
#   bash examples/laptop/run.sh                  # on a fresh temporary store
#   LAKESHORE_URL=file://~/.lakeshore bash examples/laptop/run.sh   # on the embedded default
#
# Needs `lakeshore` on PATH (an activated virtualenv), or set LAKESHORE_PYTHON to a Python
# that has lakeshore-queue installed.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
export LAKESHORE_URL="${LAKESHORE_URL:-file://$(mktemp -d "${TMPDIR:-/tmp}/lakeshore-laptop-XXXXXX")/plane}"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"      # workers import tasks.py by name
logs="$(mktemp -d "${TMPDIR:-/tmp}/lakeshore-laptop-logs-XXXXXX")"

if [ -n "${LAKESHORE_PYTHON:-}" ]; then
  LKS=("$LAKESHORE_PYTHON" -m lakeshore)
elif command -v lakeshore >/dev/null; then
  LKS=(lakeshore)
else
  LKS=(python3 -m lakeshore)
fi
lks() { "${LKS[@]}" "$@"; }

step() { printf '\n== %s\n' "$*"; }

step "store: $LAKESHORE_URL"

step "start two workers (2 slots each, a child process per slot)"
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' EXIT   # never leave workers behind
for n in 1 2; do
  # a plain command, not the lks function: $! is then the worker itself, not a subshell
  # --allow: the bodies in tasks.py are plain functions; a worker runs those only when
  # its operator allows them (a record alone cannot make it import or call anything)
  "${LKS[@]}" worker --import tasks --allow 'tasks:*' --concurrency 2 --grace 2 \
    --max-poll 0.2 --on-start tasks:warm_up --worker-id "laptop-$n" >"$logs/worker-$n.log" 2>&1 &
  pids+=("$!")
  echo "worker laptop-$n: pid $!, log $logs/worker-$n.log"
done

step "submit: one long invocation, eight thumbnails (one of them bad input), all with --key"
run=$(date +%s)   # part of every key, so running the script again submits new invocations
long=$(lks submit tasks:long_render --kwargs '{"seconds": 60}' --key "long-$run")
ids=()
for i in 1 2 3 4 5 6 7; do
  ids+=("$(lks submit tasks:thumbnail --kwargs "{\"name\": \"img-$i.jpg\", \"size\": 64}" --key "thumb-$run-$i")")
done
ids+=("$(lks submit tasks:thumbnail --kwargs '{"name": "notes.txt"}' --key "thumb-$run-bad")")
again=$(lks submit tasks:thumbnail --kwargs '{"name": "img-1.jpg", "size": 64}' --key "thumb-$run-1")
echo "long invocation: $long"
echo "thumbnails: ${ids[*]}"
echo "the first thumbnail submitted again, same key: $again (the same id, nothing new queued)"

sleep 1
step "lakeshore status"
lks status

step "lakeshore wait (the bad one fails after 3 attempts, with 1 s and 2 s backoff)"
rc=0
lks wait "${ids[@]}" --quiet || rc=$?
echo "wait exit code: $rc (1: something did not succeed)"

step "lakeshore logs of a thumbnail, and the error of the bad one"
lks logs "${ids[0]}"
lks result "${ids[7]}" || echo "result exit code: $? (1: the invocation failed)"

step "SIGTERM both workers while the long invocation runs"
lks show "$long" | grep -E '^(state|worker)'
kill -TERM "${pids[@]}"
codes=()
for pid in "${pids[@]}"; do
  code=0
  wait "$pid" || code=$?
  codes+=("$code")
done
echo "worker exit codes: ${codes[*]}"
grep -h "released\|signal" "$logs"/worker-*.log | cut -c 25- || true
echo "on_start hook runs, one per child process that ran an attempt: $(cat "$logs"/worker-*.log | grep -c "warming up")"
lks show "$long" | grep -E '^(state|attempt)'
echo "logs of the released attempt so far:"
lks logs "$long" | tail -n 2

step "lakeshore ls"
lks ls

step "cancel the long invocation (it would need a worker for another minute)"
lks cancel "$long"

step "done; the store stays at $LAKESHORE_URL (worker logs in $logs)"
