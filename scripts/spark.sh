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
# shellcheck source=scripts/lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"

JDBC_JAR="${SPARK_JDBC_JAR:-/usr/share/java/postgresql.jar}"

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

apt_install "${missing[@]}"
[ -f "$JDBC_JAR" ] || die "libpostgresql-jdbc-java is installed but $JDBC_JAR is not there"
msg "installed ${missing[*]}"
