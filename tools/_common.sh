# shellcheck shell=bash
# The preamble of the check scripts in tools/ (sourced by them, not run):
#
#   set -euo pipefail
#   source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
#   fa_workdir NAME              # or: fa_workdir NAME KEEP_VAR
#
# Sets ROOT (the checkout: the parent of tools/), PY (the interpreter: $PYTHON, default
# python3), T0 (bash's SECONDS when sourced) and FA_NAME (the sourcing script's file
# name, for messages), and defines die and fa_workdir.

# shellcheck disable=SC2034  # ROOT and PY are for the sourcing script
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
T0=$SECONDS
FA_NAME="$(basename "${BASH_SOURCE[1]:-$0}")"

# die MESSAGE...: "SCRIPT: ERROR: MESSAGE" on stderr, exit status 1
die() { echo "$FA_NAME: ERROR: $*" >&2; exit 1; }

# fa_workdir NAME [KEEP_VAR]: WORK=a new directory ${TMPDIR:-/tmp}/fastattn-NAME.XXXXXX,
# removed when the script exits (an EXIT trap; the script's exit status is unchanged).
#   without KEEP_VAR: background jobs still running are killed; the directory is kept
#     when KEEP_WORK=1 or the script fails ("work directory kept: DIR" on stderr), and a
#     failure is reported on stderr as "SCRIPT: FAILED (exit N) after Ns";
#   with KEEP_VAR: the directory is kept only when that variable is 1 at exit (the script
#     may set it itself, e.g. on a failure it wants kept), with "kept DIR" on stdout.
fa_workdir() {
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/fastattn-$1.XXXXXX")"
    if [[ $# -ge 2 ]]; then
        _FA_KEEP_VAR=$2
        trap _fa_cleanup_keep_var EXIT
    else
        trap _fa_cleanup EXIT
    fi
}

_fa_cleanup() {
    local rc=$?
    jobs -p | xargs -r kill 2>/dev/null || true
    if [[ "${KEEP_WORK:-0}" == 1 || $rc -ne 0 ]]; then
        echo "work directory kept: $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    (( rc == 0 )) || echo "$FA_NAME: FAILED (exit $rc) after $((SECONDS - T0))s" >&2
}

_fa_cleanup_keep_var() {
    if [ "${!_FA_KEEP_VAR:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
