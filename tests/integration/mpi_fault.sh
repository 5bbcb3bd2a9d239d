#!/bin/bash
# Starts `mpirun ARGS...` in the background, after AFTER_S seconds sends SIGNAL to the rank VICTIM (found by its
# OMPI_COMM_WORLD_RANK), waits for mpirun (at most LIMIT_S seconds), and prints "rc=N seconds=S" after mpirun's output.
# usage: mpi_fault.sh VICTIM SIGNAL AFTER_S LIMIT_S mpirun-args...
victim=$1 sig=$2 after=$3 limit=$4
shift 4
start=$(date +%s%N)
timeout -s KILL "$limit" mpirun "$@" 2>&1 &
mp=$!
sleep "$after"
# The local ranks are children of mpirun (or of timeout's child mpirun).
for p in $(pgrep -P "$mp") $(pgrep -P "$(pgrep -P "$mp" | head -1)" 2>/dev/null); do
  if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim"; then
    kill -"$sig" "$p" && echo "mpi_fault: sent SIG$sig to rank $victim (pid $p)"
  fi
done
wait "$mp"
rc=$?
end=$(date +%s%N)
echo "rc=$rc seconds=$(( (end - start) / 1000000000 ))"
