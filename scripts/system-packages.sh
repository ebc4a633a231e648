#!/bin/sh
# Installs the Debian packages of each requirement whose program is missing, with one
# `apt-get update` and one `apt-get install` for all of them (apt holds a lock, and each update
# reads every package list again).
#
# Each argument is PROGRAM|PACKAGES|WHAT NEEDS IT: PROGRAM is a path (checked as executable)
# or a command name (looked up on PATH), PACKAGES the Debian packages that provide it,
# separated by spaces.
set -eu

missing_packages=""
missing_reasons=""
for requirement in "$@"; do
    program=${requirement%%|*}
    rest=${requirement#*|}
    packages=${rest%%|*}
    reason=${rest#*|}
    case $program in
        /*) [ -x "$program" ] && continue ;;
        *) command -v "$program" >/dev/null 2>&1 && continue ;;
    esac
    missing_packages="$missing_packages $packages"
    missing_reasons="$missing_reasons
error: $program not found and apt-get is not available: $reason (Debian: apt-get install $packages)"
done

[ -z "$missing_packages" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$missing_reasons" | sed 1d >&2
    exit 1
fi
apt-get update
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y $missing_packages
