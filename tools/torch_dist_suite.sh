#!/usr/bin/env bash
# Runs PyTorch's own distributed test suite (torch 1.13's DistributedTest._DistTestBase, ~280
# tests, from Debian's python3-torch) on the gloo and tessera backends and compares them:
#
#   tools/torch_dist_suite.sh                          # gloo and tessera, world sizes 2 and 3
#   tools/torch_dist_suite.sh -b tessera -w 2 -k all_reduce -k broadcast
#   tools/torch_dist_suite.sh --tests-from tests/torch/dist_suite/ci_slice.txt -w 2
#
#   -b, --backends LIST     comma-separated backends (default gloo,tessera)
#   -w, --world-sizes LIST  comma-separated world sizes (default 2,3)
#   -k PATTERN              only tests whose name contains PATTERN (repeatable)
#   --tests-from FILE       only the tests named in FILE (one a line, # comments)
#   -t, --test-timeout S    seconds one test's ranks may run before they are killed (default 180)
#   -T, --run-timeout S     seconds one (backend, world size) run may take in all; `timeout`
#                           then kills it and everything it started (default 10800)
#   -j, --jobs N            runs at once (default 1; the machine's cores are shared by the ranks)
#   -o, --out DIR           results directory (default /tmp/torch-dist-suite.<date>)
#   --no-install            do not run tools/install_deps.sh torch and tools/install_python.sh
#                           first (tessera runs need the second)
#
# Each run gets temporary directories of its own (TEMP_DIR, TMPDIR), so runs may go in
# parallel. Per run, OUT holds BACKEND-wsN.log (the suite's output), .jsonl (one line per
# finished test), .xml (JUnit), .list (the tests selected) and .done (exit status, seconds).
# OUT/summary.md: passed/failed/errors/skipped per (backend, world size) and every test that
# passes on gloo but not on tessera, with tessera's error or skip reason. Exit status 0 when the
# runs were carried out (test failures are in the summary), 1 when a run could not start or
# finished no test (e.g. --no-install before tessera.torch was ever installed).
# Interpreter: Debian's /usr/bin/python3 (the one with torch), or $TESSERA_PYTHON.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"

usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

python="${TESSERA_PYTHON:-/usr/bin/python3}"
backends="gloo,tessera"
world_sizes="2,3"
patterns=()
tests_from=""
test_timeout=180
run_timeout=10800
jobs=1
out=""
install=1

need() { [[ $# -ge 2 ]] || { echo "torch_dist_suite: $1 needs a value" >&2; exit 2; }; }
while (($# > 0)); do
  case "$1" in
    -b | --backends) need "$@"; backends="$2"; shift 2 ;;
    -w | --world-sizes) need "$@"; world_sizes="$2"; shift 2 ;;
    -k) need "$@"; patterns+=(-k "$2"); shift 2 ;;
    --tests-from) need "$@"; tests_from="$(realpath "$2")"; shift 2 ;;
    -t | --test-timeout) need "$@"; test_timeout="$2"; shift 2 ;;
    -T | --run-timeout) need "$@"; run_timeout="$2"; shift 2 ;;
    -j | --jobs) need "$@"; jobs="$2"; shift 2 ;;
    -o | --out) need "$@"; out="$2"; shift 2 ;;
    --no-install) install=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "torch_dist_suite: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

((install)) && tools/install_deps.sh torch  # Debian's PyTorch, whose suite this runs
[[ -x "$python" ]] || { echo "torch_dist_suite: no interpreter at $python" >&2; exit 1; }
out="${out:-/tmp/torch-dist-suite.$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
out="$(realpath "$out")"

if ((install)) && [[ ",$backends," == *",tessera,"* ]]; then
  tools/install_python.sh
fi

runner="$repo/tests/torch/dist_suite/run_suite.py"
select_args=("${patterns[@]}")
[[ -n "$tests_from" ]] && select_args+=(--tests-from "$tests_from")

# One (backend, world size) run: bounded by `timeout`, which signals its whole process group
# (the suite's rank processes included) and SIGKILLs 30 s after.
run_one() {
  local backend="$1" ws="$2" name="$1-ws$2" tmp start rc
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/torch-dist-suite-$name.XXXXXX")"
  mkdir -p "$tmp/suite" "$tmp/tmp"
  # The run's job key (the tessera backend starts only with one), written as
  # common/security/job_key.h writes key files.
  (umask 077 && printf 'tessera-job-key-v1 %s\n' \
    "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >"$tmp/job.key")
  rm -f "$out/$name.jsonl" "$out/$name.done" "$out/$name.xml"
  BACKEND="$backend" WORLD_SIZE="$ws" "$python" "$runner" --list "${select_args[@]}" \
    >"$out/$name.list"
  start=$(date +%s)
  echo "torch_dist_suite: $name: $(wc -l <"$out/$name.list") tests, log $out/$name.log"
  rc=0
  BACKEND="$backend" WORLD_SIZE="$ws" INIT_METHOD="env://" TEMP_DIR="$tmp/suite" \
    TMPDIR="$tmp/tmp" OMP_NUM_THREADS=1 TESSERA_AUTH_KEY_FILE="$tmp/job.key" \
    timeout -k 30 "$run_timeout" "$python" "$runner" "${select_args[@]}" \
    --test-timeout "$test_timeout" --results "$out/$name.jsonl" --xml "$out/$name.xml" \
    >"$out/$name.log" 2>&1 || rc=$?
  touch "$out/$name.jsonl"
  echo "rc=$rc seconds=$(($(date +%s) - start))" >"$out/$name.done"
  echo "torch_dist_suite: $name: done in $(($(date +%s) - start)) s (exit $rc$( ((rc == 124)) && echo ", killed by the run timeout"))"
  rm -rf "$tmp"
}

pids=()
IFS=, read -r -a bs <<<"$backends"
IFS=, read -r -a ws_list <<<"$world_sizes"
for ws in "${ws_list[@]}"; do
  for backend in "${bs[@]}"; do
    while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
    run_one "$backend" "$ws" &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid" || true; done

"$python" "$repo/tests/torch/dist_suite/summarize.py" "$out" --markdown "$out/summary.md"
echo "torch_dist_suite: summary in $out/summary.md"

# A run that finished no test did not start (an import error, a missing tessera package):
# that is this script's failure, not a result.
status=0
for ws in "${ws_list[@]}"; do
  for backend in "${bs[@]}"; do
    name="$backend-ws$ws"
    if [[ ! -f "$out/$name.done" || ! -s "$out/$name.jsonl" ]]; then
      echo "torch_dist_suite: $name: no test ran (its selection: $out/$name.list; its" \
        "output: $out/$name.log, or above if the selection itself failed)" >&2
      status=1
    fi
  done
done
exit "$status"
