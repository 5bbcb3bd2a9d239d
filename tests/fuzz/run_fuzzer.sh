#!/usr/bin/env bash
# Runs one libFuzzer harness for a bounded time (ctest label "fuzz", tests/fuzz/CMakeLists.txt).
#   run_fuzzer.sh HARNESS KEPT_CORPUS WORK_DIR SECONDS RUNS [extra libFuzzer flags...]
# Every input of KEPT_CORPUS (the seeds and every input that once crashed Kiln) runs first, then mutations for at most
# SECONDS seconds or RUNS inputs. KEPT_CORPUS is only read: new inputs go to WORK_DIR/corpus, a crash's input to
# WORK_DIR/crash-<sha1> (the test fails and prints how to reproduce it, the sanitizer's summary and the input in hex,
# last, so a CI log that keeps only its head and tail still holds them).
# The mutations follow a fixed random seed, KILN_FUZZ_SEED (default 1), so the suite replays the same inputs on every
# machine (a slower one runs a prefix of them) and a finding reproduces; KILN_FUZZ_SEED=0 lets libFuzzer pick a
# fresh seed each run, for exploratory fuzzing by hand.
set -euo pipefail
harness=$1 kept=$2 work=$3 seconds=$4 runs=$5
shift 5
rm -rf "$work"
mkdir -p "$work/corpus"
# The sanitizers' settings (docs/user_guide.md, "Sanitizers and fuzzing"); a caller's own settings win.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
log="$work/fuzz.log"
set +e
seed="${KILN_FUZZ_SEED:-1}"
"$harness" -seed="$seed" -max_total_time="$seconds" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/" "$@" "$work/corpus" "$kept" >"$log" 2>&1
rc=$?
set -e
name=$(basename "$harness")
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 || true)
kept_n=$(find "$kept" -type f | wc -l)
new_n=$(find "$work/corpus" -type f | wc -l)
echo "$name (seed $seed): ${execs:-?} executions in ${secs:-?} s; $cov; kept corpus $kept_n inputs, $new_n new (in $work/corpus)"
if [ $rc -ne 0 ]; then
  tail -n 60 "$log"
  echo "---- what libFuzzer and the sanitizers reported (exit $rc):"
  grep -E '^(==[0-9]+==|SUMMARY:|ERROR:|    #[0-9]+ |MS: |artifact_prefix|Test unit written|[a-zA-Z/_.:]*: *runtime error)' "$log" | head -n 60 || true
  for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work"/slow-unit-*; do
    [ -e "$a" ] || continue
    echo "FOUND: $a ($(stat -c %s "$a") bytes) -- reproduce with: $harness $a ; then fix it, add a unit test and keep the input in $kept/"
    echo "---- the input, in hex (first 4096 bytes; rebuild it with xxd -r -p):"
    head -c 4096 "$a" | od -An -v -tx1 | tr -d ' \n' | fold -w 128
    echo
  done
  exit $rc
fi
