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

CHROMIUM=/usr/bin/chromium
LOCK_TIMEOUT=300 # seconds apt-get waits for another apt/dpkg to finish

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

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    die "$CHROMIUM is missing and installing it needs root (or passwordless sudo):" \
        "run 'apt-get install chromium' as root, then try again"
fi
command -v apt-get >/dev/null 2>&1 || die "$CHROMIUM is missing and there is no apt-get to install it"

msg "$CHROMIUM is missing; installing Debian's chromium package"
apt_env=(env DEBIAN_FRONTEND=noninteractive)
apt_opts=(-q -o "DPkg::Lock::Timeout=$LOCK_TIMEOUT")
log="$(mktemp "${TMPDIR:-/tmp}/browser-apt.XXXXXX")"
trap 'rm -f "$log"' EXIT

msg "apt-get update"
if ! "${as_root[@]}" "${apt_env[@]}" apt-get "${apt_opts[@]}" update >"$log" 2>&1; then
    cat "$log" >&2
    die "apt-get update failed (output above)"
fi

# A policy-rc.d that forbids starting services (exit 101, as in containers) only
# makes invoke-rc.d skip starting them; chromium's dependencies ship no service
# that has to run, so the install goes on. --no-install-recommends keeps it small.
msg "apt-get install chromium (this can take a minute)"
if ! "${as_root[@]}" "${apt_env[@]}" apt-get "${apt_opts[@]}" install -y \
    --no-install-recommends chromium >"$log" 2>&1; then
    cat "$log" >&2
    die "apt-get install chromium failed (output above)"
fi

if [ ! -x "$CHROMIUM" ]; then
    cat "$log" >&2
    die "apt-get install chromium succeeded but $CHROMIUM is not there"
fi
v="$(version)" || die "$CHROMIUM is installed but '$CHROMIUM --version' fails"
msg "installed: $v"
