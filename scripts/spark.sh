#!/usr/bin/env bash
# Make sure what the Spark jobs need outside the virtualenv is installed: a
# Java runtime (17 or newer, for PySpark 4) and PostgreSQL's JDBC driver from
# Debian's libpostgresql-jdbc-java (SPARK_JDBC_JAR points at its jar).
#
#   bash scripts/spark.sh
#
# Idempotent: does nothing when both are there. Otherwise installs the missing
# Debian packages with apt-get (as root, or through sudo).
set -euo pipefail

JDBC_JAR="${SPARK_JDBC_JAR:-/usr/share/java/postgresql.jar}"
LOCK_TIMEOUT=300 # seconds apt-get waits for another apt/dpkg to finish

msg() { printf 'spark: %s\n' "$*"; }
die() {
    printf 'spark: error: %s\n' "$*" >&2
    exit 1
}

java_major() {
    java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}

missing=()
major="$(java_major || true)"
if [ -z "$major" ] || [ "$major" -lt 17 ]; then missing+=(openjdk-17-jre-headless); fi
if [ ! -f "$JDBC_JAR" ]; then missing+=(libpostgresql-jdbc-java); fi
if [ "${#missing[@]}" -eq 0 ]; then
    msg "java $major and $JDBC_JAR present"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    die "missing ${missing[*]} and installing needs root (or passwordless sudo):" \
        "run 'apt-get install ${missing[*]}' as root, then try again"
fi
command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and there is no apt-get"

apt_env=(env DEBIAN_FRONTEND=noninteractive)
apt_opts=(-q -o "DPkg::Lock::Timeout=$LOCK_TIMEOUT")
log="$(mktemp "${TMPDIR:-/tmp}/spark-apt.XXXXXX")"
trap 'rm -f "$log"' EXIT

msg "installing ${missing[*]}"
if ! "${as_root[@]}" "${apt_env[@]}" apt-get "${apt_opts[@]}" install -y \
    --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    msg "apt-get update"
    "${as_root[@]}" "${apt_env[@]}" apt-get "${apt_opts[@]}" update >"$log" 2>&1 \
        || { cat "$log" >&2; die "apt-get update failed (output above)"; }
    "${as_root[@]}" "${apt_env[@]}" apt-get "${apt_opts[@]}" install -y \
        --no-install-recommends "${missing[@]}" >"$log" 2>&1 \
        || { cat "$log" >&2; die "apt-get install ${missing[*]} failed (output above)"; }
fi
[ -f "$JDBC_JAR" ] || die "libpostgresql-jdbc-java is installed but $JDBC_JAR is not there"
msg "installed ${missing[*]}"
