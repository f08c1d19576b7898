#!/usr/bin/env bash
# Make sure promtool, which checks and unit-tests the Prometheus rules in
# deploy/prometheus/ (tests/test_monitoring_pack.py), is installed.
#
#   bash scripts/promtool.sh
#
# Idempotent: does nothing when promtool is on PATH. Otherwise installs
# Debian's `prometheus` package, which ships it, with apt-get (as root, or
# through sudo); the Prometheus server that package holds is never started.
set -euo pipefail
# shellcheck source=scripts/lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"

msg() { printf 'promtool: %s\n' "$*"; }
die() {
    printf 'promtool: error: %s\n' "$*" >&2
    exit 1
}

version() { promtool --version 2>&1 | head -n 1; }

if command -v promtool >/dev/null 2>&1; then
    msg "present: $(version)"
    exit 0
fi

msg "promtool is missing; installing Debian's prometheus package"
apt_install prometheus

command -v promtool >/dev/null 2>&1 \
    || die "apt-get install prometheus succeeded but promtool is not on PATH"
msg "installed: $(version)"
