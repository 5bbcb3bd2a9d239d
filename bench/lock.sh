#!/usr/bin/env bash
# Runs a command under the lock tools/kbuild builds under, so that on a shared machine no timing overlaps a build or
# another timing. The bench scripts take it around each timed command; run a whole script under it the same way.
#   bench/lock.sh COMMAND [ARGS...]
# KILN_BUILD_LOCK: the lock file (default /tmp/kiln-build.lock, as tools/kbuild). KILN_BENCH_LOCK=0: run the command
# without it (a machine of one's own). A command already under this lock (KILN_BENCH_LOCK_HELD, set here) does not
# take it again, or a locked script's own locked commands would wait for it forever; for the same reason, do not run
# tools/kbuild under it.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: bench/lock.sh COMMAND [ARGS...]" >&2; exit 2; }
if [ "${KILN_BENCH_LOCK:-1}" = 0 ] || [ -n "${KILN_BENCH_LOCK_HELD:-}" ]; then exec "$@"; fi
exec 9>"${KILN_BUILD_LOCK:-/tmp/kiln-build.lock}"
flock 9
export KILN_BENCH_LOCK_HELD=1
exec "$@"
