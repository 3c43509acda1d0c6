#!/usr/bin/env bash
# A new user's first command, timed: a fresh venv made by `python -m venv`, `pip install .` with
# nothing else, then `python -m gpc compare` (README, command 1).  Prints the CPU seconds
# (user + sys, child processes included: bash's `time`) and the wall seconds of the install and of
# the main job separately.  Run it on a quiet machine; the figure goes to bench/RESULTS.md.
#
# Usage: bench/fresh_venv.sh [VENV_DIR]    (default: a temporary directory, removed at the end)
#        PYTHON=python3.12 bench/fresh_venv.sh   (the interpreter that makes the venv)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
venv=${1:-$work/venv}
trap 'rm -rf "$work"' EXIT

"${PYTHON:-python3}" -m venv "$venv"

# run_timed NAME COMMAND...: COMMAND in the repository root, its output kept in $work/NAME.log
run_timed() {
    local name=$1 TIMEFORMAT='%3U %3S %3R' user sys wall
    shift
    if ! { time { (cd "$repo" && "$@") >"$work/$name.log" 2>&1; }; } 2>"$work/$name.time"; then
        echo "$name failed; the end of its output:" >&2
        tail -n 30 "$work/$name.log" >&2
        exit 1
    fi
    read -r user sys wall <"$work/$name.time"
    awk -v n="$name" -v u="$user" -v s="$sys" -v w="$wall" \
        'BEGIN { printf "%-22s %7.1f s CPU (user %.1f + sys %.1f), %7.1f s wall\n", n, u + s, u, s, w }'
}

echo "fresh venv: $venv ($("$venv/bin/python" --version), $("$venv/bin/python" -m pip --version | cut -d' ' -f1-2))"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"
run_timed "pip install ." "$venv/bin/python" -m pip install .
run_timed "python -m gpc compare" "$venv/bin/python" -m gpc compare
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"
