#!/usr/bin/env bash
# Runs every test and prints one closing line counted from the real results:
#
#   N passed, M failed, K skipped
#
#   tools/test.sh                      # tools/check_layers.sh, then bazel test //...
#   tools/test.sh --sanitizers         # ... then again under --config=asan and --config=tsan
#                                      # (without the tests tagged no_sanitizers, no_asan or
#                                      # no_tsan there: tests/BUILD, tools/test_tags.bzl)
#   tools/test.sh --test_filter='Ring*' //worker/...   # extra bazel args; targets replace //...
#
# The flake hunt (docs/testing.md): every target N times, results never cached, then a table of
# how often each target and test case failed, with the first failing assertion:
#
#   tools/test.sh --repeat 10 --load //tests/...    # with both cores kept busy meanwhile
#   tools/test.sh --repeat 3 --config tsan //tests:exit_time_test
#   tools/test.sh --repeat 10 --json //tests/...   # one JSON object on stdout, the rest on stderr
#
#   --repeat N       run each target N times (bazel's --runs_per_test=N, --nocache_test_results)
#   --load           a busy loop per core from the build's end to the last run (the script
#                    starts and stops them)
#   --config NAME    asan or tsan (with that configuration's tag filters), instead of default
#   --json           the table as one JSON object (tools/flake_hunt/flake_hunt.py)
#
# Give bazel flags as --flag=value: an argument that does not start with - is a target.
#
# Counts come from each test target's test.xml (one <testcase> per gtest test; a failure is a
# test case with a <failure> or <error>; skipped is status="notrun", result="skipped" or a
# <skipped> child), read by tools/flake_hunt/flake_hunt.py. A run that bazel reports as failed
# without a failing test case (a crash, a timeout, a sanitizer report at exit) counts as one
# failure, and so does a test target that failed to build. The exit status is non-zero when
# anything failed or bazel failed for any other reason (a build error is reported as such, never
# as "0 failed").
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
}

sanitizers=0
repeat=""
load=0
config=""
json=0
bazel_flags=()
targets=()
while (($#)); do
  case "$1" in
    --sanitizers) sanitizers=1 ;;
    --repeat | --config)
      (($# >= 2)) || { echo "test.sh: $1 needs a value (see --help)" >&2; exit 2; }
      if [[ "$1" == --repeat ]]; then repeat="$2"; else config="$2"; fi
      shift ;;
    --repeat=*) repeat="${1#--repeat=}" ;;
    --config=*) config="${1#--config=}" ;;
    --load) load=1 ;;
    --json) json=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) bazel_flags+=("$1") ;;
    *) targets+=("$1") ;;
  esac
  shift
done
if ((${#targets[@]} == 0)); then
  targets=(//...)
fi
if [[ -n "$repeat" ]] && ! [[ "$repeat" =~ ^[1-9][0-9]*$ ]]; then
  echo "test.sh: --repeat takes a positive number of runs (got '$repeat')" >&2
  exit 2
fi
repeat="${repeat:-0}"
case "$config" in
  "" | asan | tsan) ;;
  *) echo "test.sh: --config is asan or tsan (got '$config'); the default needs none" >&2; exit 2 ;;
esac
if ((repeat == 0)) && { ((load || json)) || [[ -n "$config" ]]; }; then
  echo "test.sh: --load, --config and --json go with --repeat N (the flake hunt)" >&2
  exit 2
fi
if ((repeat > 0 && sanitizers)); then
  echo "test.sh: --repeat runs one configuration: give --config asan or tsan instead of" \
    "--sanitizers" >&2
  exit 2
fi
if ((json)); then
  exec 3>&1 1>&2  # the JSON object alone on stdout
fi

echo "test.sh: installing what the suite needs and is missing (tools/install_deps.sh test)"
tools/install_deps.sh test

work="$(mktemp -d)"
load_pids=()
stop_load() {
  if ((${#load_pids[@]})); then
    kill "${load_pids[@]}" 2>/dev/null || true
    wait "${load_pids[@]}" 2>/dev/null || true
    load_pids=()
  fi
}
# Stopped from outside (kill, a CI timeout), the script stops what it started: bazel's client
# is interrupted (the server then cancels the build and the tests it runs), the loads killed.
bazel_pid=""
stop_bazel() {
  if [[ -n "$bazel_pid" ]]; then
    kill -INT "$bazel_pid" 2>/dev/null || true
    wait "$bazel_pid" 2>/dev/null || true
    bazel_pid=""
  fi
}
trap 'stop_bazel; stop_load; rm -rf "$work"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# run_bazel LOG COMMAND...: runs COMMAND (a bazel command) with its output into LOG, shown as it
# comes, and returns its status. In the background: bash runs a trap only once the foreground
# command ends, but `wait` returns at once on a signal, so a stop request interrupts bazel.
run_bazel() {
  local log="$1" rc=0 tail_pid
  shift
  "$@" >"$log" 2>&1 &
  bazel_pid=$!
  tail -n +1 -f --pid="$bazel_pid" "$log" &
  tail_pid=$!
  wait "$bazel_pid" || rc=$?
  bazel_pid=""
  wait "$tail_pid" || true
  return "$rc"
}

total_passed=0
total_failed=0
total_skipped=0
problems=()

# run_suite NAME [BAZEL FLAGS...]: one `bazel test` run, counted before the next overwrites
# bazel-testlogs.
run_suite() {
  local name="$1"
  shift
  local log="$work/$name.log" counts="$work/$name.counts" rc=0
  # --build_tests_only: the tests and what they need, not every binary and benchmark in //...
  local command=(bazel test --keep_going --build_tests_only --test_output=errors "$@"
    "${bazel_flags[@]}" "${targets[@]}")
  if ((load)); then
    # Built first, so that the load slows the runs, not the build.
    echo "test.sh: [$name] building before the load starts"
    run_bazel "$work/$name.build.log" bazel build --build_tests_only "$@" "${bazel_flags[@]}" \
      "${targets[@]}" || true
    local core
    for ((core = 0; core < $(nproc); core++)); do
      (trap 'exit 0' TERM; while :; do :; done) &
      load_pids+=("$!")
    done
    echo "test.sh: [$name] load: ${#load_pids[@]} busy loops (pids ${load_pids[*]})"
  fi
  echo "test.sh: [$name] ${command[*]}"
  run_bazel "$log" "${command[@]}" || rc=$?
  stop_load

  # Where this configuration's results are (the bazel-testlogs link follows the last command,
  # which may be someone else's).
  local testlogs
  if ! testlogs="$(bazel info "$@" "${bazel_flags[@]}" bazel-testlogs 2>/dev/null)"; then
    testlogs="$(readlink -f bazel-testlogs || true)"
  fi
  # The counts (and the failed test cases) of this run; with --repeat, the table too. Each
  # target ran --repeat's N times, or as often as a --runs_per_test given with the bazel flags.
  local runs=1 flag
  for flag in "$@" "${bazel_flags[@]}"; do
    [[ "$flag" =~ ^--runs_per_test=([1-9][0-9]*)$ ]] && runs="${BASH_REMATCH[1]}"
  done
  local results=(/usr/bin/python3 tools/flake_hunt/flake_hunt.py --log "$log"
    --testlogs "$testlogs" --runs "$runs" --name "$name" --counts-out "$counts")
  echo "0 0 0 0" >"$counts"
  local counting=0
  if ((repeat > 0 && json)); then
    "${results[@]}" --json >&3 || counting=$?
  elif ((repeat > 0)); then
    local title="flake hunt: $repeat runs of each target, ${config:-default} configuration"
    ((load)) && title+=", under load (a busy loop per core)"
    "${results[@]}" --table --title "$title" || counting=$?
  else
    "${results[@]}" || counting=$?
  fi
  if ((counting != 0)); then
    problems+=("[$name] counting the results failed (flake_hunt.py exit $counting)")
  fi
  local passed failed skipped counted
  read -r passed failed skipped counted <"$counts"

  case "$rc" in
    0 | 3) ;;  # 3: tests ran and some failed; counted above
    1) problems+=("[$name] bazel could not build everything (exit 1): see the errors above") ;;
    4) problems+=("[$name] bazel found no test targets in ${targets[*]} (exit 4)") ;;
    8) problems+=("[$name] bazel was interrupted (exit 8)") ;;
    *) problems+=("[$name] bazel failed (exit $rc): see its output above") ;;
  esac
  if ((counted == 0)) && [[ "$rc" == 0 || "$rc" == 3 ]]; then
    problems+=("[$name] no test target's result in bazel's output: nothing could be counted")
    rc=1
  fi
  if ((rc != 0 && failed == 0)); then
    failed=1  # bazel failed but no test did: the closing line must still show a failure
  fi
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
  total_skipped=$((total_skipped + skipped))
}

# The whole suite begins with the layering (tools/check_layers.sh), counted as one test.
if ((repeat == 0)) && [[ "${targets[*]}" == "//..." ]]; then
  if tools/check_layers.sh; then
    total_passed=$((total_passed + 1))
  else
    total_failed=$((total_failed + 1))
  fi
fi

if ((repeat > 0)); then
  repeat_flags=(--runs_per_test="$repeat" --nocache_test_results)
  case "$config" in
    "") run_suite default "${repeat_flags[@]}" ;;
    asan) run_suite asan --config=asan --test_tag_filters=-no_sanitizers,-no_asan "${repeat_flags[@]}" ;;
    tsan) run_suite tsan --config=tsan --test_tag_filters=-no_sanitizers,-no_tsan "${repeat_flags[@]}" ;;
  esac
else
  run_suite default
fi
if ((sanitizers)); then
  # .bazelrc gives each sanitizer config a platform suffix of its own, so switching between
  # them does not rebuild everything.
  # Tests tagged no_sanitizers run in the default configuration only, no_asan ones not under
  # ASan, no_tsan ones not under TSan (tests/BUILD and tests/torch/defs.bzl say why); what
  # only they need is not built there.
  run_suite asan --config=asan --test_tag_filters=-no_sanitizers,-no_asan
  run_suite tsan --config=tsan --test_tag_filters=-no_sanitizers,-no_tsan
fi

for problem in "${problems[@]+"${problems[@]}"}"; do
  echo "test.sh: ERROR: $problem"
done
echo "${total_passed} passed, ${total_failed} failed, ${total_skipped} skipped"
if ((total_failed > 0 || ${#problems[@]} > 0)); then
  exit 1
fi
