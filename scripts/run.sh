#!/usr/bin/env bash
# Run Lazaretto locally: the console web server (gunicorn), the Celery delivery worker,
# the control worker (sweeper, dispatcher, alarm webhook), a Spark Connect server and
# the pipeline worker, whose Spark jobs run on it (SPARK_REMOTE), and a broker
# node, which sends the primary's duties (one node alone: HA_STARTUP_MODE
# standalone, no peer). scripts/run-ha.sh starts an HA pair of nodes instead and
# sets LAZARETTO_RUN_NODE=0.
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

# Consumer modules every process imports at start-up: the demo's handlers
# unless the caller names its own (include demo_consumers to keep the demo's).
export LAZARETTO_CONSUMER_MODULES="${LAZARETTO_CONSUMER_MODULES:-demo_consumers}"

# A local run serves plain http: the HTTPS-only settings, on by default
# without DEBUG (console/settings.py), are turned off unless the caller set them.
export SECURE_SSL_REDIRECT="${SECURE_SSL_REDIRECT:-false}"
export SESSION_COOKIE_SECURE="${SESSION_COOKIE_SECURE:-false}"
export CSRF_COOKIE_SECURE="${CSRF_COOKIE_SECURE:-false}"
export SECURE_HSTS_SECONDS="${SECURE_HSTS_SECONDS:-0}"
export SECURE_HSTS_INCLUDE_SUBDOMAINS="${SECURE_HSTS_INCLUDE_SUBDOMAINS:-false}"
export SECURE_HSTS_PRELOAD="${SECURE_HSTS_PRELOAD:-false}"

# Every process (gunicorn's workers, Celery's prefork children) writes its
# metrics here and /metrics adds them up; a new run starts from nothing.
export PROMETHEUS_MULTIPROC_DIR="$REPO/var/prometheus"
rm -rf "$PROMETHEUS_MULTIPROC_DIR"
mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

# whitenoise serves the collected (and compressed) static files.
"$PY" manage.py collectstatic --noinput -v 0

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

# Background processes, stopped with the web server. Their logs go to var/log.
CELERY="$REPO/.venv/bin/celery"
mkdir -p "$REPO/var/log"

# The Spark jobs (replay, archive) run on a local Spark Connect server, so no job
# pays a JVM start (workers.spark.connect_server; scripts/spark.sh has installed
# Java and the JDBC driver). A SPARK_REMOTE of the caller's names a server of its
# own instead; LAZARETTO_RUN_SPARK_CONNECT=0 keeps the classic driver per job
# (SPARK_MASTER). It starts first, as it takes longest; the pipeline worker waits.
SPARK_CONNECT_PORT="${SPARK_CONNECT_PORT:-15002}"
SPARK_CONNECT_LOG="$REPO/var/log/spark-connect.log"
spark_connect_pid=""
spark_remote="${SPARK_REMOTE:-}"
if [ -n "$spark_remote" ]; then
    echo "run: the Spark jobs run on SPARK_REMOTE=$SPARK_REMOTE (no local Spark Connect server)"
elif [ "${LAZARETTO_RUN_SPARK_CONNECT:-1}" = "1" ]; then
    if (exec 3<>"/dev/tcp/127.0.0.1/$SPARK_CONNECT_PORT") 2>/dev/null; then
        echo "run: error: port $SPARK_CONNECT_PORT, the Spark Connect server's, is taken;" \
            "set SPARK_CONNECT_PORT to a free port (or SPARK_REMOTE to a server of yours)" >&2
        exit 1
    fi
    start_bg spark-connect "$PY" -m workers.spark.connect_server serve \
        --port "$SPARK_CONNECT_PORT" --log "$SPARK_CONNECT_LOG"
    spark_connect_pid="${pids[-1]}"
    spark_remote="sc://127.0.0.1:$SPARK_CONNECT_PORT"
fi

start_bg celery-deliveries "$CELERY" -A workers worker -Q deliveries -l info \
    --logfile "$REPO/var/log/celery-deliveries.log"
start_bg celery-control "$CELERY" -A workers worker -Q control -c 2 -n control@%h -l info \
    --logfile "$REPO/var/log/celery-control.log"
if [ -n "$spark_connect_pid" ]; then
    if ! "$PY" -m workers.spark.connect_server wait "$spark_remote" \
        --pid "$spark_connect_pid" --timeout 180; then
        echo "run: error: the Spark Connect server did not start; the end of" \
            "$SPARK_CONNECT_LOG:" >&2
        tail -n 20 "$SPARK_CONNECT_LOG" >&2 || true
        exit 1
    fi
    echo "run: the Spark Connect server answers at $spark_remote"
fi
start_bg celery-pipeline env ${spark_remote:+"SPARK_REMOTE=$spark_remote"} \
    "$CELERY" -A workers worker -Q pipeline -c 1 -n pipeline@%h -l info \
    --logfile "$REPO/var/log/celery-pipeline.log"
if [ "${LAZARETTO_RUN_NODE:-1}" = "1" ]; then
    start_bg broker-node env HA_STARTUP_MODE=standalone HA_PEER= \
        "$PY" manage.py broker_node --name "${LAZARETTO_NODE_NAME:-local}"
fi

# The console web server: gunicorn (console/gunicorn_conf.py), its error and
# access logs on this script's output. This script stays attached to it and
# ends when it ends; `wait` (unlike a plain foreground command) lets Ctrl-C /
# SIGTERM reach the traps right away.
start_bg web "$REPO/.venv/bin/gunicorn" -c python:console.gunicorn_conf \
    --bind "127.0.0.1:$PORT" console.wsgi:application
web_pid="${pids[-1]}"
set +e
wait "$web_pid"
rc=$?
set -e
exit "$rc"
