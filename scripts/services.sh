#!/usr/bin/env bash
# Project-local development/test services for Lazaretto: PostgreSQL and Redis.
#
#   scripts/services.sh start    start what is needed (idempotent), write var/services.env
#   scripts/services.sh stop     stop what we started (idempotent)
#   scripts/services.sh status   show what runs and the URLs (exit 0: both run, 1: one runs, 3: none)
#   scripts/services.sh env      print var/services.env
#   scripts/services.sh purge    stop, then delete var/ and any cluster kept outside the repo
#   scripts/services.sh ha-info  shell assignments for an HA pair on this machine (scripts/run-ha.sh):
#                                the cluster's data and socket dirs, its tools and owner, and an
#                                empty directory beside it for the standby's cluster
#
# A service is only started for a variable that is NOT already set by the caller:
# DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL (Redis). var/services.env
# holds `export` lines for the project-local services that exist, and turns
# DEBUG on unless the caller set SECRET_KEY or DEBUG, so `source var/services.env`
# is enough for `python manage.py ...`; the Makefile sources it so that a
# caller's own DATABASE_URL / CELERY_BROKER_URL still win.
#
# The cluster runs with PostgreSQL's durable defaults (fsync, synchronous_commit,
# full_page_writes on); start removes the `= off` lines older versions of this
# script wrote into postgresql.conf and reloads a running server. Only the test
# suite goes faster, on its own test database (LAZARETTO_TEST_DB_PROFILE,
# tests/conftest.py).
#
# State lives in var/ at the repo root: pg.port, pg.password, redis.port, the
# cluster in var/pg/data (or a symlink var/pg -> ${TMPDIR:-/tmp}/lazaretto-<hash>/pg
# when the repo sits where the unprivileged database user cannot reach it), the
# redis dir var/redis and logs in var/log.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VAR="$REPO/var"
LOG_DIR="$VAR/log"
ENV_FILE="$VAR/services.env"
PG_LINK="$VAR/pg"
PG_PORT_FILE="$VAR/pg.port"
PG_PW_FILE="$VAR/pg.password"
REDIS_DIR="$VAR/redis"
REDIS_PORT_FILE="$VAR/redis.port"
REDIS_PID_FILE="$REDIS_DIR/redis.pid"
PG_OS_USER="lazaretto"   # system user owning the cluster when we run as root
PG_ROLE="lazaretto"      # database superuser role
PG_DB="lazaretto"
READY_TIMEOUT=30
# The cluster keeps PostgreSQL's durable defaults: a publish answered 201 must
# survive a power cut. Clusters made before that carry these lines; start removes them.
PG_FAST_SETTING_RE="^[[:space:]]*(fsync|synchronous_commit|full_page_writes)[[:space:]]*=?[[:space:]]*'?(off|false|no|0)'?[[:space:]]*(#.*)?$"
PG_CONF_HEADER="# ---- added by scripts/services.sh: local dev cluster, PostgreSQL's durable defaults (fsync, synchronous_commit, full_page_writes on) ----"

msg() { printf 'services: %s\n' "$*"; }
warn() { printf 'services: %s\n' "$*" >&2; }
die() {
    printf 'services: error: %s\n' "$*" >&2
    exit 1
}

is_root() { [ "$(id -u)" -eq 0 ]; }

# shellcheck source=scripts/lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
APT_LOG="$LOG_DIR/apt.log"

repo_hash() { printf '%s' "$REPO" | sha1sum | cut -c1-10; }

# ---------------------------------------------------------------- helpers

# free_port [exclude...]: print a TCP port that is free on 127.0.0.1.
free_port() {
    local exclude=" $* " port i
    for i in $(seq 1 50); do
        if command -v python3 >/dev/null 2>&1; then
            port="$(python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
        else
            port=$((20000 + RANDOM % 40000))
            if port_in_use "$port"; then continue; fi
        fi
        case "$exclude" in *" $port "*) continue ;; esac
        printf '%s\n' "$port"
        return 0
    done
    die "could not find a free TCP port on 127.0.0.1"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# stored_port FILE [exclude...]: the port kept in FILE, chosen (and kept) the first time.
stored_port() {
    local file="$1" port
    shift
    if [ -s "$file" ]; then
        port="$(tr -dc '0-9' <"$file")"
        [ -n "$port" ] || die "$file does not hold a port number; delete it to pick a new one"
    else
        port="$(free_port "$@")"
        printf '%s\n' "$port" >"$file"
    fi
    printf '%s\n' "$port"
}

# pid_alive PID: the process exists and is not a zombie (this machine's PID 1 may
# not reap orphaned daemons, and kill -0 succeeds on a zombie).
pid_alive() {
    local state
    kill -0 "$1" 2>/dev/null || return 1
    state="$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null || true)"
    [ "$state" != "Z" ] && [ "$state" != "X" ]
}

random_hex() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

# ---------------------------------------------------------------- PostgreSQL

PGBIN=""

pg_bindir_ok() { [ -n "$1" ] && [ -x "$1/initdb" ] && [ -x "$1/pg_ctl" ] && [ -x "$1/postgres" ]; }

find_pg_bindir() {
    local c d
    if c="$(command -v pg_ctl 2>/dev/null)"; then
        d="$(dirname "$(readlink -f "$c")")"
        if pg_bindir_ok "$d"; then printf '%s\n' "$d"; return 0; fi
        d="$(dirname "$c")"
        if pg_bindir_ok "$d"; then printf '%s\n' "$d"; return 0; fi
    fi
    if command -v pg_config >/dev/null 2>&1; then
        d="$(pg_config --bindir 2>/dev/null || true)"
        if pg_bindir_ok "$d"; then printf '%s\n' "$d"; return 0; fi
    fi
    for d in $(printf "%s\n" /usr/lib/postgresql/*/bin | sort -t/ -k4,4 -Vr); do
        if pg_bindir_ok "$d"; then printf '%s\n' "$d"; return 0; fi
    done
    return 1
}

ensure_pg_binaries() {
    [ -n "$PGBIN" ] && return 0
    if ! PGBIN="$(find_pg_bindir)"; then
        apt_install postgresql
        PGBIN="$(find_pg_bindir)" || die "PostgreSQL binaries (initdb, pg_ctl, postgres) not found even after installing postgresql"
    fi
}

# pg_tool NAME: path of a client tool, preferring the server's bindir.
pg_tool() {
    if [ -n "$PGBIN" ] && [ -x "$PGBIN/$1" ]; then
        printf '%s\n' "$PGBIN/$1"
    elif command -v "$1" >/dev/null 2>&1; then
        command -v "$1"
    else
        die "$1 not found (looked in ${PGBIN:-<no bindir>} and PATH)"
    fi
}

ensure_pg_os_user() {
    is_root || return 0
    id -u "$PG_OS_USER" >/dev/null 2>&1 && return 0
    command -v useradd >/dev/null 2>&1 || die "useradd not found; cannot create system user $PG_OS_USER"
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin --comment "Lazaretto dev services" "$PG_OS_USER" ||
        die "could not create system user $PG_OS_USER"
    msg "created system user $PG_OS_USER (initdb refuses to run as root)"
}

# as_pg CMD...: run a command as the cluster owner (from /, so an unreadable cwd is no problem).
as_pg() {
    # 9>&-: daemons must not inherit (and so keep holding) var/.services.lock.
    if is_root; then
        (cd / && runuser -u "$PG_OS_USER" -- "$@" 9>&-)
    else
        (cd / && "$@" 9>&-)
    fi
}

# Resolve (creating it on first use) the cluster base dir; sets PGBASE, PGDATA_DIR, PGSOCK_DIR.
PGBASE=""
PGDATA_DIR=""
PGSOCK_DIR=""

resolve_pg_base() {
    local create="${1:-0}" ext
    if [ -L "$PG_LINK" ]; then
        PGBASE="$(readlink -f "$PG_LINK" || true)"
        if [ -z "$PGBASE" ] || [ ! -d "$PGBASE" ]; then
            [ "$create" -eq 1 ] || { PGBASE=""; return 1; }
            ext="$(readlink "$PG_LINK")"
            warn "cluster dir $ext (outside the repo) is gone; creating a new, empty cluster"
            make_external_base "$ext"
            PGBASE="$(readlink -f "$PG_LINK")"
        fi
    elif [ -d "$PG_LINK" ]; then
        PGBASE="$(cd "$PG_LINK" && pwd -P)"
    else
        [ "$create" -eq 1 ] || return 1
        if is_root && ! runuser -u "$PG_OS_USER" -- test -x "$VAR" 2>/dev/null; then
            # The repo is somewhere the unprivileged user cannot traverse (e.g. a fresh
            # clone inside a mode-700 mktemp -d): keep the cluster outside and link it.
            ext="${TMPDIR:-/tmp}/lazaretto-$(repo_hash)/pg"
            make_external_base "$ext"
            ln -sfn "$ext" "$PG_LINK"
            msg "repo not reachable by user $PG_OS_USER; cluster kept in $ext (var/pg links to it)"
        else
            mkdir -p "$PG_LINK"
            if is_root; then chown "$PG_OS_USER:" "$PG_LINK"; fi
            chmod 700 "$PG_LINK"
        fi
        PGBASE="$(cd "$PG_LINK" && pwd -P)"
    fi
    PGDATA_DIR="$PGBASE/data"
    PGSOCK_DIR="$PGBASE/run"
    # Unix socket paths are limited to ~107 bytes.
    if [ $((${#PGSOCK_DIR} + 20)) -gt 100 ]; then
        PGSOCK_DIR="${TMPDIR:-/tmp}/lazaretto-$(repo_hash)/run"
    fi
}

# make_external_base DIR: create DIR (…/lazaretto-<hash>/pg) owned by the cluster user.
make_external_base() {
    local dir="$1" parent
    parent="$(dirname "$dir")"
    if [ -L "$parent" ]; then die "$parent is a symlink; refusing to use it"; fi
    mkdir -p "$parent"
    if is_root; then chown "$PG_OS_USER:" "$parent"; fi
    chmod 700 "$parent"
    if is_root && ! runuser -u "$PG_OS_USER" -- test -x "$parent" 2>/dev/null; then
        die "user $PG_OS_USER cannot reach $parent either; set TMPDIR to a directory it can traverse"
    fi
    mkdir -p "$dir"
    if is_root; then chown "$PG_OS_USER:" "$dir"; fi
    chmod 700 "$dir"
}

pg_running() {
    [ -n "$PGDATA_DIR" ] && [ -f "$PGDATA_DIR/PG_VERSION" ] || return 1
    if [ -z "$PGBIN" ]; then PGBIN="$(find_pg_bindir)" || { PGBIN=""; return 1; }; fi
    as_pg "$PGBIN/pg_ctl" status -D "$PGDATA_DIR" >/dev/null 2>&1
}

pg_pid() { head -n1 "$PGDATA_DIR/postmaster.pid" 2>/dev/null || true; }

pg_url() {
    printf 'postgres://%s:%s@127.0.0.1:%s/%s\n' "$PG_ROLE" "$(cat "$PG_PW_FILE")" "$1" "$PG_DB"
}

pg_initdb() {
    local pw="$1" pwfile
    mkdir -p "$PGDATA_DIR"
    if is_root; then chown "$PG_OS_USER:" "$PGDATA_DIR"; fi
    chmod 700 "$PGDATA_DIR"
    pwfile="$PGBASE/.initdb-pw"
    (umask 077 && printf '%s\n' "$pw" >"$pwfile")
    if is_root; then chown "$PG_OS_USER:" "$pwfile"; fi
    msg "initialising PostgreSQL cluster in $PGDATA_DIR"
    if ! as_pg "$PGBIN/initdb" -D "$PGDATA_DIR" -U "$PG_ROLE" -E UTF8 --no-locale \
        --auth-local=trust --auth-host=scram-sha-256 --pwfile="$pwfile" \
        >>"$LOG_DIR/initdb.log" 2>&1; then
        rm -f "$pwfile"
        rm -rf "${PGDATA_DIR:?}"/* 2>/dev/null || true
        die "initdb failed; see var/log/initdb.log"
    fi
    rm -f "$pwfile"
    cat >>"$PGDATA_DIR/postgresql.conf" <<EOF

$PG_CONF_HEADER
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 256MB
# For the HA pair (scripts/run-ha.sh): pg_rewind needs wal_log_hints, and
# the former primary's WAL back to its last checkpoint before the two
# servers diverged, which its shutdown checkpoint would otherwise recycle
# (wal_keep_size; beyond it the node clones instead). A replication slot of
# a standby that is gone keeps at most max_slot_wal_keep_size of WAL.
wal_log_hints = on
wal_keep_size = 1GB
max_slot_wal_keep_size = 1GB
$PG_QUEUE_SETTINGS
# port and unix_socket_directories are passed by scripts/services.sh on start
EOF
}

# A message store's settings, one per line:
# - Every claim and acknowledgement leaves dead rows in the live messages; the
#   launcher looks at each database every autovacuum_naptime (1 min by
#   default), so without this a busy queue piles up a minute of them before
#   each vacuum.
# - A delivered message writes about 4 kB of WAL (claim, ack, indexes), and a
#   checkpoint is due after about half of max_wal_size: with the default 1 GB,
#   one every 40 s at 3,000 messages a second, each followed by a burst of
#   full-page images that delivery latency shows. With 8 GB, checkpoint_timeout
#   (5 min) sets the pace; pg_wal may hold up to that much.
PG_QUEUE_SETTINGS="autovacuum_naptime = 10s
max_wal_size = 8GB"

# pg_conf_missing_queue_settings CONF: print the lines of PG_QUEUE_SETTINGS
# whose setting our block of CONF (below PG_CONF_HEADER) does not set: CONF
# was written before they were added. initdb's own lines above it (it writes
# max_wal_size = 1GB) do not count; a later line wins.
pg_conf_missing_queue_settings() {
    local ours line
    ours="$(awk -v header="$PG_CONF_HEADER" 'below; $0 == header { below = 1 }' "$1")"
    while IFS= read -r line; do
        grep -Eq "^[[:space:]]*${line%% *}[[:space:]]*=" <<<"$ours" || printf '%s\n' "$line"
    done <<<"$PG_QUEUE_SETTINGS"
}

# pg_conf_lacks_queue_settings CONF: CONF misses one of PG_QUEUE_SETTINGS.
pg_conf_lacks_queue_settings() { [ -n "$(pg_conf_missing_queue_settings "$1")" ]; }

# pg_conf_is_fast CONF: CONF turns off one of fsync, synchronous_commit or
# full_page_writes (as scripts/services.sh itself did before the cluster had
# to be durable).
pg_conf_is_fast() { grep -Eqi "$PG_FAST_SETTING_RE" "$1"; }

# pg_conf_make_durable CONF: delete those settings from CONF, so PostgreSQL's
# durable defaults apply, and retitle our block; everything else stays. sed -i
# keeps the file's owner and mode.
pg_conf_make_durable() {
    local conf="$1"
    sed -i -E -e "/$PG_FAST_SETTING_RE/Id" \
        -e "s|^# ---- added by scripts/services\.sh: throwaway dev/test cluster, NOT crash safe ----\$|$PG_CONF_HEADER|" \
        "$conf" || die "could not edit $conf"
}

# pg_durability PORT PASSWORD: print what a new session on the dev database
# sees, as "fsync=on full_page_writes=on synchronous_commit=on".
pg_durability() {
    PGPASSWORD="$2" PGCONNECT_TIMEOUT=10 "$(pg_tool psql)" -X -q -tA -h 127.0.0.1 -p "$1" \
        -U "$PG_ROLE" -d "$PG_DB" -c "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name)
            FROM pg_settings WHERE name IN ('fsync', 'full_page_writes', 'synchronous_commit')" \
        2>>"$LOG_DIR/postgres.log"
}

# pg_check_durable PORT PASSWORD: warn unless the server runs durable (a reload
# applies a moment after pg_ctl returns, hence the few tries).
pg_check_durable() {
    local want="fsync=on full_page_writes=on synchronous_commit=on" seen="" i
    for ((i = 0; i < 20; i++)); do
        seen="$(pg_durability "$1" "$2" || true)"
        [ "$seen" = "$want" ] && return 0
        sleep 0.5
    done
    warn "postgres is not durable: ${seen:-<could not ask>} (want $want);" \
        "look for these settings in $PGDATA_DIR/postgresql.auto.conf (ALTER SYSTEM) or ALTER DATABASE/ROLE ... SET"
}

start_pg() {
    local port pw new_pw=0 made_durable=0 reload=0 ver bin_ver i psql missing
    ensure_pg_binaries
    ensure_pg_os_user
    resolve_pg_base 1
    port="$(stored_port "$PG_PORT_FILE" "$(cat "$REDIS_PORT_FILE" 2>/dev/null || true)")"

    if [ -s "$PG_PW_FILE" ]; then
        pw="$(cat "$PG_PW_FILE")"
    else
        pw="$(random_hex)"
        (umask 077 && printf '%s\n' "$pw" >"$PG_PW_FILE")
        new_pw=1
    fi
    chmod 600 "$PG_PW_FILE"

    if [ ! -f "$PGDATA_DIR/PG_VERSION" ]; then
        pg_initdb "$pw"
        new_pw=0
    fi
    ver="$(cat "$PGDATA_DIR/PG_VERSION")"
    bin_ver="$("$PGBIN/postgres" --version | grep -oE '[0-9]+' | head -n1)"
    if [ "$ver" != "$bin_ver" ]; then
        die "cluster in $PGDATA_DIR is PostgreSQL $ver but binaries in $PGBIN are $bin_ver; run 'scripts/services.sh purge' to start over"
    fi

    mkdir -p "$PGSOCK_DIR"
    if is_root; then chown "$PG_OS_USER:" "$PGSOCK_DIR"; fi
    chmod 700 "$PGSOCK_DIR"

    if pg_conf_is_fast "$PGDATA_DIR/postgresql.conf"; then
        pg_conf_make_durable "$PGDATA_DIR/postgresql.conf"
        made_durable=1
        msg "removed fsync/synchronous_commit/full_page_writes = off from postgresql.conf: the cluster is durable now"
    fi

    missing="$(pg_conf_missing_queue_settings "$PGDATA_DIR/postgresql.conf")"
    if [ -n "$missing" ]; then
        printf '%s\n' "$missing" >>"$PGDATA_DIR/postgresql.conf" ||
            die "could not edit $PGDATA_DIR/postgresql.conf"
        reload=1
        msg "added ${missing//$'\n'/, } to postgresql.conf"
    fi

    if pg_running; then
        msg "postgres already running (pid $(pg_pid), port $port)"
        if [ "$made_durable" -eq 1 ] || [ "$reload" -eq 1 ]; then
            # All of them are reloadable (sighup / user): no restart needed.
            as_pg "$PGBIN/pg_ctl" reload -D "$PGDATA_DIR" >/dev/null ||
                die "pg_ctl reload failed; see var/log/postgres.log"
            msg "reloaded postgres configuration"
        fi
    else
        if port_in_use "$port"; then
            die "port $port (kept in var/pg.port) is used by another process; free it or delete var/pg.port"
        fi
        msg "starting postgres on 127.0.0.1:$port"
        # Root opens the log and hands the descriptor down, so the cluster user needs
        # no access to var/log (which it may not be able to reach).
        if ! as_pg "$PGBIN/pg_ctl" start -D "$PGDATA_DIR" -w -t "$READY_TIMEOUT" \
            -o "-p $port -k $PGSOCK_DIR -c listen_addresses=127.0.0.1" \
            </dev/null >>"$LOG_DIR/postgres.log" 2>&1; then
            die "postgres failed to start; see var/log/postgres.log"
        fi
    fi

    for ((i = 0; i < READY_TIMEOUT * 2; i++)); do
        if "$(pg_tool pg_isready)" -q -h 127.0.0.1 -p "$port" -d postgres -U "$PG_ROLE" 2>/dev/null; then
            break
        fi
        sleep 0.5
    done
    if [ "$i" -ge $((READY_TIMEOUT * 2)) ]; then
        die "postgres not ready on 127.0.0.1:$port after ${READY_TIMEOUT}s; see var/log/postgres.log"
    fi

    psql="$(pg_tool psql)"
    if [ "$new_pw" -eq 1 ]; then
        # var/pg.password was lost: set a new one through the (trusted) local socket.
        as_pg "$psql" -X -q -h "$PGSOCK_DIR" -p "$port" -U "$PG_ROLE" -d postgres -v ON_ERROR_STOP=1 \
            -c "ALTER ROLE \"$PG_ROLE\" PASSWORD '$pw'" >/dev/null ||
            die "could not reset the password of role $PG_ROLE"
        msg "var/pg.password was missing; set a new password for role $PG_ROLE"
    fi
    # Going through TCP with the password checks the very URL we hand out.
    if ! PGPASSWORD="$pw" PGCONNECT_TIMEOUT=10 "$psql" -X -q -tA -h 127.0.0.1 -p "$port" \
        -U "$PG_ROLE" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" \
        >"$VAR/.pg-check" 2>>"$LOG_DIR/postgres.log"; then
        rm -f "$VAR/.pg-check"
        die "cannot log in to postgres as $PG_ROLE on 127.0.0.1:$port with var/pg.password; see var/log/postgres.log"
    fi
    if ! grep -q 1 "$VAR/.pg-check"; then
        PGPASSWORD="$pw" "$psql" -X -q -h 127.0.0.1 -p "$port" -U "$PG_ROLE" -d postgres \
            -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$PG_DB\" OWNER \"$PG_ROLE\"" \
            >/dev/null 2>>"$LOG_DIR/postgres.log" || die "could not create database $PG_DB; see var/log/postgres.log"
        msg "created database $PG_DB"
    fi
    rm -f "$VAR/.pg-check"
    pg_check_durable "$port" "$pw"
    if [ "$made_durable" -eq 1 ]; then
        # Files written while fsync was off may sit in the OS cache only; with
        # fsync on now, flush them once (PostgreSQL's docs on turning fsync on).
        as_pg "$PGBIN/initdb" --sync-only -D "$PGDATA_DIR" >>"$LOG_DIR/initdb.log" 2>&1 ||
            warn "initdb --sync-only failed; see var/log/initdb.log (run 'sync' to flush by hand)"
    fi
}

stop_pg() {
    resolve_pg_base 0 || return 0
    if [ ! -f "$PGDATA_DIR/PG_VERSION" ]; then return 0; fi
    if pg_running; then
        msg "stopping postgres (pid $(pg_pid))"
        as_pg "$PGBIN/pg_ctl" stop -D "$PGDATA_DIR" -m fast -w -t "$READY_TIMEOUT" >/dev/null ||
            die "pg_ctl stop failed; see var/log/postgres.log"
    fi
}

# ---------------------------------------------------------------- Redis

redis_ping() {
    local port="$1" reply
    if command -v redis-cli >/dev/null 2>&1; then
        reply="$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null || true)"
    else
        reply="$(
            exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 0
            printf 'PING\r\n' >&3
            read -r -t 2 line <&3 || true
            printf '%s' "${line%$'\r'}"
        )" 2>/dev/null || true
    fi
    [ "$reply" = "PONG" ] || [ "$reply" = "+PONG" ]
}

redis_pid() {
    local pid
    pid="$(tr -dc '0-9' 2>/dev/null <"$REDIS_PID_FILE" || true)"
    if [ -n "$pid" ] && pid_alive "$pid"; then printf '%s\n' "$pid"; fi
}

redis_running() {
    [ -s "$REDIS_PORT_FILE" ] && [ -n "$(redis_pid)" ] && redis_ping "$(cat "$REDIS_PORT_FILE")"
}

start_redis() {
    local port i
    if ! command -v redis-server >/dev/null 2>&1; then
        apt_install redis-server
        hash -r
        command -v redis-server >/dev/null 2>&1 || die "redis-server still not found after installing it"
    fi
    mkdir -p "$REDIS_DIR"
    port="$(stored_port "$REDIS_PORT_FILE" "$(cat "$PG_PORT_FILE" 2>/dev/null || true)")"
    if redis_running; then
        msg "redis already running (pid $(redis_pid), port $port)"
        return 0
    fi
    if [ -n "$(redis_pid)" ]; then
        die "redis process $(redis_pid) from var/redis/redis.pid runs but does not answer on port $port; stop it first"
    fi
    rm -f "$REDIS_PID_FILE"
    if port_in_use "$port"; then
        die "port $port (kept in var/redis.port) is used by another process; free it or delete var/redis.port"
    fi
    msg "starting redis on 127.0.0.1:$port"
    redis-server --bind 127.0.0.1 --port "$port" --daemonize yes \
        --pidfile "$REDIS_PID_FILE" --dir "$REDIS_DIR" --logfile "$LOG_DIR/redis.log" \
        --save '' --appendonly no </dev/null >>"$LOG_DIR/redis.log" 2>&1 9>&- ||
        die "redis-server failed to start; see var/log/redis.log"
    for ((i = 0; i < READY_TIMEOUT * 2; i++)); do
        if redis_ping "$port"; then return 0; fi
        sleep 0.5
    done
    die "redis not answering PING on 127.0.0.1:$port after ${READY_TIMEOUT}s; see var/log/redis.log"
}

stop_redis() {
    local pid port i
    pid="$(redis_pid)"
    if [ -z "$pid" ]; then
        rm -f "$REDIS_PID_FILE"
        return 0
    fi
    port="$(cat "$REDIS_PORT_FILE" 2>/dev/null || true)"
    msg "stopping redis (pid $pid)"
    if [ -n "$port" ] && command -v redis-cli >/dev/null 2>&1; then
        redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
    fi
    for ((i = 0; i < 50; i++)); do
        pid_alive "$pid" || break
        if [ "$i" -eq 10 ]; then kill -TERM "$pid" 2>/dev/null || true; fi
        sleep 0.2
    done
    if pid_alive "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$REDIS_PID_FILE"
}

# ---------------------------------------------------------------- commands

lock() {
    mkdir -p "$VAR" "$LOG_DIR"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$VAR/.services.lock"
        flock -w 120 9 || die "another scripts/services.sh holds var/.services.lock"
    fi
}

cmd_start() {
    local want_pg=0 want_redis=0 tmp
    [ -n "${DATABASE_URL:-}" ] || want_pg=1
    [ -n "${CELERY_BROKER_URL:-}" ] || want_redis=1
    lock
    if [ "$want_pg" -eq 1 ]; then
        start_pg
    else
        msg "DATABASE_URL is set by the caller; not starting postgres"
    fi
    if [ "$want_redis" -eq 1 ]; then
        start_redis
    else
        msg "CELERY_BROKER_URL is set by the caller; not starting redis"
    fi
    tmp="$ENV_FILE.tmp.$$"
    {
        # Every local service this repo has, whether or not this call started
        # it: a caller pointing one run elsewhere must not erase the URLs of
        # the local services (the Makefile lets the caller's values win).
        printf '# Written by scripts/services.sh start; the project-local services.\n'
        if [ -f "$PG_PORT_FILE" ] && [ -f "$PG_PW_FILE" ]; then
            printf 'export DATABASE_URL=%s\n' "$(pg_url "$(cat "$PG_PORT_FILE")")"
        fi
        if [ -f "$REDIS_PORT_FILE" ]; then
            printf 'export CELERY_BROKER_URL=redis://127.0.0.1:%s/0\n' "$(cat "$REDIS_PORT_FILE")"
        fi
        # Enough on its own for `python manage.py ...`: a local run gets DEBUG
        # (and so the settings' local-only key) unless the caller set SECRET_KEY or DEBUG.
        printf '%s\n' 'if [ -z "${SECRET_KEY:-}" ] && [ -z "${DEBUG:-}" ]; then export DEBUG=true; fi'
    } >"$tmp"
    chmod 600 "$tmp"
    mv -f "$tmp" "$ENV_FILE"
    msg "ready; environment in var/services.env"
}

cmd_stop() {
    [ -d "$VAR" ] || { msg "nothing to stop"; return 0; }
    lock
    stop_pg_standby
    stop_pg
    stop_redis
    msg "stopped"
}

# stop_pg_standby: the HA standby's cluster (scripts/run-ha.sh), if it runs.
stop_pg_standby() {
    local data
    resolve_pg_base 0 || return 0
    data="$(dirname "$PGBASE")/pg-b/data"
    [ -f "$data/postmaster.pid" ] || return 0
    if [ -z "$PGBIN" ]; then PGBIN="$(find_pg_bindir)" || return 0; fi
    as_pg "$PGBIN/pg_ctl" stop -D "$data" -m fast -w >/dev/null 2>&1 || true
    msg "stopped the standby's postgres"
}

cmd_status() {
    local up=0
    if resolve_pg_base 0 && pg_running; then
        up=$((up + 1))
        msg "postgres: running (pid $(pg_pid), 127.0.0.1:$(cat "$PG_PORT_FILE"), data $PGDATA_DIR)"
        msg "  DATABASE_URL=$(pg_url "$(cat "$PG_PORT_FILE")")"
    else
        msg "postgres: not running"
    fi
    if redis_running; then
        up=$((up + 1))
        msg "redis: running (pid $(redis_pid), 127.0.0.1:$(cat "$REDIS_PORT_FILE"))"
        msg "  CELERY_BROKER_URL=redis://127.0.0.1:$(cat "$REDIS_PORT_FILE")/0"
    else
        msg "redis: not running"
    fi
    case "$up" in
        2) return 0 ;;
        1) return 1 ;;
        *) return 3 ;;
    esac
}

cmd_env() {
    [ -f "$ENV_FILE" ] || die "var/services.env not found; run 'scripts/services.sh start' first"
    cat "$ENV_FILE"
}

cmd_purge() {
    local ext=""
    cmd_stop
    if [ -L "$PG_LINK" ]; then ext="$(readlink "$PG_LINK")"; fi
    if [ -n "$ext" ]; then
        case "$ext" in
            */lazaretto-*/pg) rm -rf "$(dirname "$ext")" ;;
            *) warn "var/pg links to unexpected $ext; not deleting it" ;;
        esac
    fi
    rm -rf "${TMPDIR:-/tmp}/lazaretto-$(repo_hash)"
    rm -rf "$VAR"
    msg "removed var/"
}

cmd_ha_info() {
    local standby
    ensure_pg_binaries
    resolve_pg_base 0 || die "no cluster yet; run 'scripts/services.sh start' first"
    standby="$(dirname "$PGBASE")/pg-b"
    mkdir -p "$standby"
    if is_root; then chown "$PG_OS_USER:" "$standby"; fi
    chmod 700 "$standby"
    printf 'PG_DATA=%q\nPG_SOCKETS=%q\nPG_BINDIR=%q\nPG_OS_USER=%q\nPG_STANDBY_DATA=%q\n' \
        "$PGDATA_DIR" "$PGSOCK_DIR" "$PGBIN" "$(is_root && echo "$PG_OS_USER" || true)" \
        "$standby/data"
}

main() {
    local cmd="${1:-}"
    case "$cmd" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        env) cmd_env ;;
        purge) cmd_purge ;;
        ha-info) cmd_ha_info ;;
        *)
            printf 'services: usage: %s {start|stop|status|env|purge|ha-info}\n' "$0" >&2
            exit 2
            ;;
    esac
}

# Sourced (tests call single functions), the script defines them and runs nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
