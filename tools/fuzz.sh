#!/usr/bin/env bash
# Builds every libFuzzer target (the *_fuzzer rules of fuzz/fuzzer.bzl, beside the decoders
# they feed) with clang, AddressSanitizer and UndefinedBehaviorSanitizer (--config=fuzz) and
# runs each from its seed corpus:
#
#   tools/fuzz.sh                       # every target for 10 s (what .ci/run does)
#   tools/fuzz.sh --seconds 600         # longer
#   tools/fuzz.sh --runs 1000000        # a number of executions each, however long it takes
#   tools/fuzz.sh --json                # one JSON object instead of the table
#   tools/fuzz.sh --jobs 1              # one target at a time (default: one per core)
#   tools/fuzz.sh wire_decode_fuzzer    # some targets only (by name)
#
# Each target fuzzes a scratch copy of its corpus (the seeds stay as they are) and prints its
# executions, executions per second and how many inputs it added. A crash, a sanitizer report,
# a leak or an input slower than 10 s stops that target, keeps the input in fuzz-crashes/ (with
# the target's report beside it) and makes the script exit 1: fix the decoder, then add the
# input to the target's corpus folder, so that its `_test` runs it in every build from then on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=10
runs=""
parallel="$(nproc)"
json=0
only=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift ;;
    --runs) runs="$2"; shift ;;
    --jobs) parallel="$2"; shift ;;
    --json) json=1 ;;
    -h | --help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) only+=("$1") ;;
  esac
  shift
done

tools/install_deps.sh fuzz >&2  # clang and libFuzzer; quiet when present
mapfile -t targets < <(bazel query --noshow_progress \
  'attr(name, "_fuzzer$", kind("cc_binary", //...))' 2>/dev/null | sort)
if ((${#only[@]})); then
  selected=()
  for target in "${targets[@]}"; do
    for name in "${only[@]}"; do [[ "${target##*:}" == "$name" ]] && selected+=("$target"); done
  done
  targets=("${selected[@]+"${selected[@]}"}")
fi
((${#targets[@]})) || { echo "fuzz.sh: no fuzz target matches ${only[*]}" >&2; exit 2; }
[[ "$parallel" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --jobs must be a positive integer (got '$parallel')" >&2; exit 2; }

((json)) || echo "fuzz.sh: building ${#targets[@]} targets with --config=fuzz"
build_log="$(mktemp)"
bazel build --config=fuzz --noshow_progress "${targets[@]}" >/dev/null 2>"$build_log" || {
  cat "$build_log" >&2
  rm -f "$build_log"
  exit 1
}
rm -f "$build_log"
bin="$(bazel info --config=fuzz bazel-bin 2>/dev/null)"

# The scratch corpora, and the files the readers' targets write per input (fuzz/fuzz_files.h,
# under TMPDIR), in memory where /dev/shm exists: ten times the executions of a disk.
shm=/dev/shm
[[ -d "$shm" && -w "$shm" ]] || shm="${TMPDIR:-/tmp}"
work="$(mktemp -d "$shm/tessera-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tmp"
export TMPDIR="$work/tmp"
mkdir -p fuzz-crashes
limit=(-max_total_time="$seconds")
[[ -n "$runs" ]] && limit=(-runs="$runs")

# seeds_of //PACKAGE:NAME_fuzzer: PACKAGE/NAME_fuzz_corpus, tessera_fuzzer's convention.
seeds_of() {
  local package="${1#//}" name="${1##*:}"
  echo "${package%%:*}/${name%_fuzzer}_fuzz_corpus"
}

# run_target TARGET: fuzzes one target and prints its table line; leaves its JSON row, and a
# .failed file if it failed, in $work.
run_target() {
  local target="$1" package name corpus before start status elapsed executions per_second
  local added result
  package="${target#//}"
  package="${package%%:*}"
  name="${target##*:}"
  corpus="$work/$name"
  mkdir -p "$corpus"
  cp -r "$(seeds_of "$target")"/. "$corpus"/
  before="$(find "$corpus" -type f | wc -l)"
  start="$(date +%s.%N)"
  status=0
  "$bin/$package/$name" "${limit[@]}" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="fuzz-crashes/$name-" "$corpus" >"$work/$name.log" 2>&1 || status=$?
  elapsed="$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')"
  executions="$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$name.log" | tail -1)"
  per_second="$(awk -v n="${executions:-0}" -v t="$elapsed" 'BEGIN {printf "%d", (t > 0 ? n / t : 0)}')"
  added=$(($(find "$corpus" -type f | wc -l) - before))
  result=ok
  if ((status != 0)); then
    result="FAILED (fuzz-crashes/$name-*; report in fuzz-crashes/$name.log)"
    cp "$work/$name.log" "fuzz-crashes/$name.log"
    touch "$work/$name.failed"
  fi
  echo "{\"target\":\"$target\",\"executions\":${executions:-0},\"seconds\":$elapsed,\"executions_per_second\":$per_second,\"added\":$added,\"ok\":$([[ $result == ok ]] && echo true || echo false)}" >"$work/$name.row"
  ((json)) || printf '%-34s %12s %10s %8s %8s  %s\n' "$name" "${executions:-0}" \
    "$per_second" "$elapsed" "$added" "$result"
}

for target in "${targets[@]}"; do
  seeds="$(seeds_of "$target")"
  [[ -d "$seeds" ]] || { echo "fuzz.sh: $target has no seed corpus $seeds" >&2; exit 2; }
done
((json)) || printf '%-34s %12s %10s %8s %8s  %s\n' target executions "exec/s" seconds added result
# One target per core at a time (each is single-threaded); each prints its line when done.
for target in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  run_target "$target" &
done
wait

failed=0
rows=()
for target in "${targets[@]}"; do
  name="${target##*:}"
  if [[ -e "$work/$name.row" ]]; then rows+=("$(cat "$work/$name.row")"); fi
  if [[ -e "$work/$name.failed" || ! -e "$work/$name.row" ]]; then failed=1; fi
done
if ((json)); then
  (IFS=,; echo "{\"benchmark\":\"fuzz\",\"targets\":[${rows[*]}]}")
fi
rmdir fuzz-crashes 2>/dev/null || true
exit "$failed"
