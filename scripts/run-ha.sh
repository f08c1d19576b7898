#!/usr/bin/env bash
# Run Lazaretto as an HA pair on this machine (`make run-ha`): node A owns the
# project-local PostgreSQL cluster (scripts/services.sh), node B a second
# cluster beside it that B clones from A on its first start and keeps as a
# streaming standby. The web server and the workers reach the pair through
# the multi-host URL (target_session_attrs=read-write), so they follow a
# failover. Then scripts/run.sh runs them, without its own standalone node.
#
# Try it: open /ha/ in the console, then `python manage.py broker_node
# switchover --address 127.0.0.1:7401` and watch the roles swap; or kill node
# A (pkill -9 -f 'broker_node --name A') and its PostgreSQL and watch B take
# over after the heartbeat timeout.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$REPO"
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || { echo "run-ha: $PY not found; run 'make venv' first" >&2; exit 1; }
[ -n "${DATABASE_URL:-}" ] || { echo "run-ha: DATABASE_URL is not set (make run-ha sets it)" >&2; exit 1; }

eval "$(bash scripts/services.sh ha-info)"
PG_PORT_B_FILE="$REPO/var/pg-b.port"
NODE_A_LISTEN="${HA_NODE_A_LISTEN:-127.0.0.1:7401}"
NODE_B_LISTEN="${HA_NODE_B_LISTEN:-127.0.0.1:7402}"

# A's URL is the project cluster's; B's is the same server role and password
# on a port of its own (kept in var/pg-b.port).
url_a="$DATABASE_URL"
if [ ! -s "$PG_PORT_B_FILE" ]; then
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
        >"$PG_PORT_B_FILE"
fi
port_b="$(cat "$PG_PORT_B_FILE")"
port_a="$("$PY" -c 'import sys; from urllib.parse import urlsplit; print(urlsplit(sys.argv[1]).port)' "$url_a")"
url_b="$("$PY" -c 'import sys; from urllib.parse import urlsplit; u = urlsplit(sys.argv[1]); print(u._replace(netloc=u.netloc.rsplit(":", 1)[0] + ":" + sys.argv[2]).geturl())' "$url_a" "$port_b")"
pair_url="$("$PY" -c 'import sys; from urllib.parse import urlsplit; u = urlsplit(sys.argv[1]); host = u.netloc.rsplit(":", 1)[0]; print(u._replace(netloc=f"{host}:{sys.argv[2]},127.0.0.1:{sys.argv[3]}", query="target_session_attrs=read-write&connect_timeout=2").geturl())' "$url_a" "$port_a" "$port_b")"

# pg_rewind needs wal_log_hints on the cluster it rewinds (A, after a failover).
if [ "$("$PG_BINDIR/psql" "$url_a" -XtAc 'SHOW wal_log_hints')" != "on" ]; then
    echo "run-ha: turning wal_log_hints on in A's cluster (a restart)"
    "$PG_BINDIR/psql" "$url_a" -Xqc "ALTER SYSTEM SET wal_log_hints = on"
    bash scripts/services.sh stop >/dev/null
    bash scripts/services.sh start >/dev/null
fi
# and the former primary's WAL back to the last checkpoint before the fork.
if [ "$("$PG_BINDIR/psql" "$url_a" -XtAc 'SHOW wal_keep_size')" = "0" ]; then
    "$PG_BINDIR/psql" "$url_a" -Xqc "ALTER SYSTEM SET wal_keep_size = '1GB'" -c "SELECT pg_reload_conf()"
fi

common=(
    HA_PG_BINDIR="$PG_BINDIR" HA_PG_OS_USER="$PG_OS_USER"
    HA_HEARTBEAT_INTERVAL="${HA_HEARTBEAT_INTERVAL:-1}" HA_HEARTBEAT_TIMEOUT="${HA_HEARTBEAT_TIMEOUT:-10}"
    HA_DISCOVERY_TIMEOUT="${HA_DISCOVERY_TIMEOUT:-30}"
    LAZARETTO_CONSUMER_MODULES="${LAZARETTO_CONSUMER_MODULES:-demo_consumers}"
)
node_a=(env "${common[@]}" DATABASE_URL="$url_a" HA_LISTEN="$NODE_A_LISTEN" HA_PEER="$NODE_B_LISTEN"
    HA_PEER_DATABASE_URL="$url_b" HA_PGDATA="$PG_DATA"
    HA_PG_OPTIONS="-k $PG_SOCKETS -c listen_addresses=127.0.0.1" HA_PG_LOG="$REPO/var/log/postgres.log"
    "$PY" manage.py broker_node --name A)
node_b=(env "${common[@]}" DATABASE_URL="$url_b" HA_LISTEN="$NODE_B_LISTEN" HA_PEER="$NODE_A_LISTEN"
    HA_PEER_DATABASE_URL="$url_a" HA_PGDATA="$PG_STANDBY_DATA"
    HA_PG_OPTIONS="-k $PG_SOCKETS -c listen_addresses=127.0.0.1" HA_PG_LOG="$REPO/var/log/postgres-b.log"
    "$PY" manage.py broker_node --name B)

mkdir -p "$REPO/var/log"
set -m
"${node_a[@]}" >>"$REPO/var/log/node-a.log" 2>&1 </dev/null &
pid_a=$!
"${node_b[@]}" >>"$REPO/var/log/node-b.log" 2>&1 </dev/null &
pid_b=$!
set +m
echo "run-ha: node A (pid $pid_a) and node B (pid $pid_b); logs in var/log/node-a.log, node-b.log"

# shellcheck disable=SC2317  # invoked through the trap
stop_nodes() {
    kill -TERM -- "-$pid_a" "-$pid_b" 2>/dev/null || true
    wait "$pid_a" "$pid_b" 2>/dev/null || true
}
trap stop_nodes EXIT

export DATABASE_URL="$pair_url" LAZARETTO_RUN_NODE=0
scripts/run.sh
