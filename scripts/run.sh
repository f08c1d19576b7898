#!/usr/bin/env bash
# Run Lazaretto locally: the console web server, plus (later) Celery worker and beat.
# Normally started by `make run`, which has already migrated, loaded demo data and
# put DATABASE_URL / CELERY_BROKER_URL (var/services.env) in the environment.
#
# Every process is started in its own process group; when this script exits (the
# web server stopped, Ctrl-C, SIGTERM, an error) all of those groups are killed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$REPO"
PY="$REPO/.venv/bin/python"
PORT="${PORT:-8000}"

[ -x "$PY" ] || { echo "run: $PY not found; run 'make venv' first" >&2; exit 1; }

pids=()

# start_bg NAME CMD...: start CMD in the background in a process group of its own.
start_bg() {
    local name="$1"
    shift
    set -m
    "$@" </dev/null &
    pids+=("$!")
    set +m
    echo "run: started $name (pid $!)"
}

# shellcheck disable=SC2317  # invoked through the traps below
cleanup() {
    local rc=$? pid watchdog
    trap - EXIT INT TERM
    if [ "${#pids[@]}" -gt 0 ]; then
        for pid in "${pids[@]}"; do
            kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        done
        # Anything still alive after 10 s gets SIGKILL (whole group).
        (
            sleep 10
            for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
        ) &
        watchdog=$!
        for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
        kill "$watchdog" 2>/dev/null || true
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------
# Background services go here (they are stopped with the web server), e.g.:
#   start_bg celery-worker "$REPO/.venv/bin/celery" -A workers worker -l info
#   start_bg celery-beat   "$REPO/.venv/bin/celery" -A workers beat -l info \
#       --schedule "$REPO/var/celerybeat-schedule"
# Not started yet: for now only the web server runs.
# ---------------------------------------------------------------------------

# The console web server. This script stays attached to it (output goes to the
# terminal) and ends when it ends; `wait` (unlike a plain foreground command)
# lets Ctrl-C / SIGTERM reach the traps right away.
start_bg web "$PY" manage.py runserver --noreload "127.0.0.1:$PORT"
web_pid="${pids[-1]}"
set +e
wait "$web_pid"
rc=$?
set -e
exit "$rc"
