#!/bin/bash
# Starts `mpirun ARGS...` in the background, after AFTER_S seconds sends SIGNAL to the rank VICTIM (found by its
# OMPI_COMM_WORLD_RANK), waits for mpirun (at most LIMIT_S seconds), and prints "rc=N seconds=S signalled_at=K" after
# mpirun's output (S and K counted from the start). With MPI_FAULT_WAIT_FOR=FILE set, the AFTER_S seconds start
# once FILE exists (polled for at most LIMIT_S seconds), so a slow host still signals after, say, the first checkpoint.
# usage: mpi_fault.sh VICTIM SIGNAL AFTER_S LIMIT_S mpirun-args...
victim=$1 sig=$2 after=$3 limit=$4
shift 4
start=$(date +%s%N)
timeout -s KILL "$limit" mpirun "$@" 2>&1 &
mp=$!
if [ -n "${MPI_FAULT_WAIT_FOR:-}" ]; then
  for ((i = 0; i < limit * 10; ++i)); do
    [ -e "$MPI_FAULT_WAIT_FOR" ] && break
    kill -0 "$mp" 2>/dev/null || break
    sleep 0.1
  done
fi
sleep "$after"
signalled=$(( ($(date +%s%N) - start) / 1000000000 ))
# The local ranks are children of mpirun (or of timeout's child mpirun).
for p in $(pgrep -P "$mp") $(pgrep -P "$(pgrep -P "$mp" | head -1)" 2>/dev/null); do
  if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim"; then
    kill -"$sig" "$p" && echo "mpi_fault: sent SIG$sig to rank $victim (pid $p)"
  fi
done
wait "$mp"
rc=$?
end=$(date +%s%N)
echo "rc=$rc seconds=$(( (end - start) / 1000000000 )) signalled_at=$signalled"
