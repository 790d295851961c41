# TAP helpers for shell suites (sourced). Each suite prints `1..N` (or a plan at the end) and one line per check;
# tests/run counts the lines, so a suite never has to know how the runner aggregates.
# shellcheck shell=bash

_tap_n=0
_tap_failed=0

tap_plan() { echo "1..$1"; }

# Print a plan from the number of checks made; use when the count depends on the environment.
tap_done_plan() { echo "1..$_tap_n"; [ "$_tap_failed" -eq 0 ]; }

tap_ok() { _tap_n=$((_tap_n + 1)); echo "ok $_tap_n - $1"; }

# tap_fail DESC [DIAG...]: a failed check; every DIAG line is printed as a TAP diagnostic.
tap_fail() {
    local desc=$1; shift
    _tap_n=$((_tap_n + 1)); _tap_failed=$((_tap_failed + 1))
    echo "not ok $_tap_n - $desc"
    local line
    for line in "$@"; do printf '%s\n' "$line" | sed 's/^/#   /'; done
}

# tap_skip DESC REASON: a check that could not run here; the reason is shown by the runner.
tap_skip() { _tap_n=$((_tap_n + 1)); echo "ok $_tap_n - $1 # SKIP $2"; }

# tap_check DESC CMD...: ok when CMD exits 0; its output is shown as diagnostics only on failure.
tap_check() {
    local desc=$1; shift
    local out
    if out=$("$@" 2>&1); then tap_ok "$desc"; else tap_fail "$desc" "command: $*" "$out"; fi
}

# tap_diag TEXT: free-form diagnostic (kept out of the counts).
tap_diag() { printf '%s\n' "$*" | sed 's/^/# /'; }
