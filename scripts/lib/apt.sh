# apt_install PKG...: install Debian packages for the scripts that need them
# (services.sh, spark.sh, browser.sh, promtool.sh), which source this file and
# define msg and die.
#
# Runs apt-get non-interactively as root, or through passwordless sudo, and
# never starts a package's system service (a policy-rc.d answering 101 while
# it runs: the project starts its own instances). It tries the install first
# and runs `apt-get update` only when that fails, then retries once after
# `dpkg --configure -a` (a postinst that failed where no init system runs
# leaves packages unconfigured). apt-get's output goes to APT_LOG (default: a
# temporary file, removed when the install succeeds); its end is shown when
# the install fails.

APT_LOCK_TIMEOUT="${APT_LOCK_TIMEOUT:-300}" # seconds apt-get waits for another apt/dpkg

apt_install() {
    local as_root=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null \
            || die "$* missing and installing it needs root (or passwordless sudo):" \
                "run 'apt-get install $*' as root, then try again"
        as_root=(sudo -n)
    fi
    command -v apt-get >/dev/null 2>&1 || die "$* missing and there is no apt-get to install it"
    local log="${APT_LOG:-$(mktemp "${TMPDIR:-/tmp}/apt.XXXXXX")}"
    local apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive
        apt-get -q -o "DPkg::Lock::Timeout=$APT_LOCK_TIMEOUT")
    local policy=/usr/sbin/policy-rc.d created_policy=0 rc=0
    if [ ! -e "$policy" ]; then
        "${as_root[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' >$policy && chmod 755 $policy"
        created_policy=1
    fi
    msg "installing $* with apt-get (one-time; log: $log)"
    if ! "${apt[@]}" install -y --no-install-recommends "$@" >>"$log" 2>&1; then
        msg "apt-get update"
        { "${apt[@]}" update && "${apt[@]}" install -y --no-install-recommends "$@"; } \
            >>"$log" 2>&1 || rc=$?
        if [ "$rc" -ne 0 ]; then
            "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive dpkg --configure -a >>"$log" 2>&1 || true
            "${apt[@]}" install -y --no-install-recommends "$@" >>"$log" 2>&1 && rc=0 || rc=$?
        fi
    fi
    if [ "$created_policy" -eq 1 ]; then "${as_root[@]}" rm -f "$policy"; fi
    if [ "$rc" -eq 0 ]; then
        if [ -z "${APT_LOG:-}" ]; then rm -f "$log"; fi
    else
        tail -n 30 "$log" >&2
        die "apt-get install $* failed (exit $rc; the log's end is above, all of it in $log)"
    fi
}
