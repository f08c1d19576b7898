#!/usr/bin/env bash
# Make sure the Chromium the browser tests drive (tests/browser/) is installed.
#
#   bash scripts/browser.sh
#
# Idempotent: does nothing when /usr/bin/chromium is there. Otherwise installs
# Debian's `chromium` package with apt-get (as root, or through sudo). The tests
# launch that binary through Playwright's `executable_path`: Playwright's own
# browser download (`playwright install`) is never used.
set -euo pipefail
# shellcheck source=scripts/lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"

CHROMIUM=/usr/bin/chromium

msg() { printf 'browser: %s\n' "$*"; }
die() {
    printf 'browser: error: %s\n' "$*" >&2
    exit 1
}

version() { "$CHROMIUM" --version 2>/dev/null | head -n 1; }

if [ -x "$CHROMIUM" ]; then
    msg "chromium present: $(version || echo "$CHROMIUM")"
    exit 0
fi

msg "$CHROMIUM is missing; installing Debian's chromium package (this can take a minute)"
apt_install chromium

if [ ! -x "$CHROMIUM" ]; then
    die "apt-get install chromium succeeded but $CHROMIUM is not there"
fi
v="$(version)" || die "$CHROMIUM is installed but '$CHROMIUM --version' fails"
msg "installed: $v"
