#!/usr/bin/env bash
# Fuzz the REST API from outside, as a client would: schemathesis over the
# served OpenAPI schema, every phase (examples, coverage, fuzzing, stateful)
# and every check, against gunicorn with DEBUG off and an admin's token.
#
#   bash scripts/fuzz.sh [SCHEMATHESIS OPTIONS...]
#
# make fuzz runs it for FUZZ_SECONDS (240 by default): the fuzzing and
# stateful phases draw new cases until the time is up. FUZZ_SECONDS=0 sets no
# time: each phase ends once it has drawn its --max-examples per operation, so
# a seeded run sends the same cases however busy the machine is; the test
# suite runs such a run (tests/test_api_schema.py). Options given are
# added to schemathesis's command line (--max-examples, --seed, ...). It runs
# on a database of its own (lazaretto_fuzz_<pid> beside DATABASE_URL's), made
# afresh with the demo's data and dropped at the end, and writes
# schemathesis's reports to FUZZ_REPORTS (var/fuzz/). Exit status:
# schemathesis's (0: no failure).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$REPO"
PY="$REPO/.venv/bin/python"
: "${DATABASE_URL:?source var/services.env first (make fuzz does)}"

export FUZZ_DB="lazaretto_fuzz_$$"
export DATABASE_URL="${DATABASE_URL%/*}/$FUZZ_DB"
export DEBUG=0 SECRET_KEY="${SECRET_KEY:-fuzz-only-key}"
export SECURE_SSL_REDIRECT=false SESSION_COOKIE_SECURE=false CSRF_COOKIE_SECURE=false
export LAZARETTO_CONSUMER_MODULES=demo_consumers LAZARETTO_API_RATE=1000000/s
# No worker runs here, so no webhook is ever called: any destination is
# allowed, so that the destination policy (tests/test_webhook_consumers.py
# has its own tests) does not refuse the URLs the fuzzer makes up.
export LAZARETTO_WEBHOOK_ALLOWED_NETWORKS=0.0.0.0/0,::/0
OUT="${FUZZ_REPORTS:-$REPO/var/fuzz}"
export DUMP_DIR="$OUT/dumps"
mkdir -p "$OUT"

# database create|drop: the fuzz database, through the maintenance database.
database() {
    "$PY" - "$1" <<'PY'
import os, sys
import psycopg
from psycopg import sql
name = sql.Identifier(os.environ["FUZZ_DB"])
url = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
with psycopg.connect(url, autocommit=True) as conn:
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
    if sys.argv[1] == "create":
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
PY
}

database create
"$PY" manage.py migrate --noinput >/dev/null
"$PY" manage.py demo >/dev/null 2>&1
read -r TOKEN_ID TOKEN < <("$PY" manage.py shell -c '
import secrets
from console.tokens import token_create
from console.users import user_create
user = user_create(name="fuzz", role="admin", password=secrets.token_urlsafe(24), actor=None)
token, key = token_create(user=user, name="schemathesis")
print(token.id, key)
' 2>/dev/null | tail -n 1)

PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
WEB_WORKERS=2 "$REPO/.venv/bin/gunicorn" -c python:console.gunicorn_conf console.wsgi \
    --bind "127.0.0.1:$PORT" >"$OUT/gunicorn.log" 2>&1 &
SERVER=$!
cleanup() {
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    database drop || true
}
trap cleanup EXIT

TIME_BOUND=()
if [ "${FUZZ_SECONDS:-240}" != 0 ]; then TIME_BOUND=(--max-time "${FUZZ_SECONDS:-240}"); fi

# The hooks keep the fuzzer from revoking its own token (tests/support/fuzz_hooks.py).
# What a schema cannot decide is listed in tests/support/schemathesis.toml.
SCHEMATHESIS_HOOKS=tests.support.fuzz_hooks LAZARETTO_FUZZ_TOKEN_ID="$TOKEN_ID" \
    "$REPO/.venv/bin/schemathesis" --config-file tests/support/schemathesis.toml \
    run "http://127.0.0.1:$PORT/api/schema/" \
    --wait-for-schema 30 \
    --header "Authorization: Token $TOKEN" \
    --header "Accept: application/json" \
    --phases examples,coverage,fuzzing,stateful \
    --checks all \
    "${TIME_BOUND[@]}" \
    --workers "${FUZZ_WORKERS:-2}" \
    --report ndjson --report-dir "$OUT" \
    "$@"
