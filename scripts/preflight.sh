#!/bin/sh
# What `make run` needs of the machine before anything else: a Python that can make a virtual
# environment, bubblewrap (the agent's sandbox) and libseccomp (its system-call filter). As root
# with apt-get it installs what is missing; otherwise it prints one line saying what to install.
# Usage: scripts/preflight.sh [PYTHON]    (exit 0: ready; exit 1: not, with that one line)
PY=${1:-python3}

missing() {
    need=""
    "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || need="$need python3-venv"
    command -v bwrap >/dev/null 2>&1 || need="$need bubblewrap"
    "$PY" -c 'import ctypes.util, sys; sys.exit(ctypes.util.find_library("seccomp") is None)' >/dev/null 2>&1 \
        || need="$need libseccomp2"
    echo "${need# }"
}

say() { echo "make run: $*" >&2; }

need=$(missing)
if [ -n "$need" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "make run: installing $need (apt-get)" >&2
        log=$(mktemp)
        if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
               && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need; } >"$log" 2>&1; then
            say "apt-get could not install $need ($(tail -n 1 "$log")); install it and run make run again"
            rm -f "$log"
            exit 1
        fi
        rm -f "$log"
        need=$(missing)
        [ -z "$need" ] || { say "still missing after apt-get: $need"; exit 1; }
    elif command -v apt-get >/dev/null 2>&1; then
        say "the agent's sandbox needs $need: run 'sudo apt-get install $need', then make run again"
        exit 1
    else
        say "the agent's sandbox needs $need (your distribution's packages of these names): install them, then make run again"
        exit 1
    fi
fi

if ! err=$(bwrap --unshare-net --unshare-pid --ro-bind / / --proc /proc --dev /dev true 2>&1); then
    say "bubblewrap cannot create the sandbox's namespaces here ($(echo "$err" | tail -n 1)); on a host that allows user namespaces or as root it can"
    exit 1
fi
exit 0
