#!/usr/bin/env bash
# Quickstart: builds Tessera, starts a local fleet (a coordinator, 2 servers, 2 workers) with
# tools' launcher, trains an MLP on the synthetic teacher set in ps-sync mode (the servers hold
# the parameters and Adam's state), scrapes every process's /metrics and checks it with
# `promtool check metrics`.
#
#   tools/quickstart.sh                          # the default job below
#   tools/quickstart.sh [launcher flags...] [-- worker flags...]
#       e.g. tools/quickstart.sh --mode ps-async -- --model ctr --dataset synthetic-ctr
#   tools/quickstart.sh --torch                  # PyTorch instead: builds the tessera backend,
#       makes `import tessera.torch` work (tools/install_python.sh) and runs the DDP tutorial's
#       two-process example on it (examples/torch/ddp_tutorial.py)
#
# Exits non-zero when the build, the launcher or any check fails. Workers are scraped as soon
# as they are ready (they keep /metrics up for a few seconds after their work with their own
# --linger; one that is gone after exiting 0 is noted, not failed); the coordinator and the
# servers are scraped during the launcher's --linger window, after the workers are done.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The coordinator and servers are scraped during the launcher's linger (a scrape and promtool
# take well under a second each).
readonly linger_seconds=2
# Workers are scraped as soon as they are ready; their own --linger keeps /metrics up for a
# scrape that comes after their work.
readonly worker_linger_seconds=1

# Each step line says how long the quickstart has run so far.
step() { echo "==> [${SECONDS} s] $*"; }

if [[ "${1:-}" == --torch ]]; then
  python="${TESSERA_PYTHON:-/usr/bin/python3}"
  step "installing what is missing for the PyTorch backend (tools/install_deps.sh torch)"
  tools/install_deps.sh torch
  step "building the tessera torch.distributed backend (tools/install_python.sh)"
  tools/install_python.sh
  step "DDP on the tessera backend, two processes: $python examples/torch/ddp_tutorial.py"
  OMP_NUM_THREADS=1 "$python" examples/torch/ddp_tutorial.py
  step "quickstart OK: DistributedDataParallel trained on tessera (see docs/pytorch.md)"
  exit 0
fi

# Only what the four binaries and the metrics check need: the test suite, the benchmarks and
# --torch install the rest as they run.
step "installing what is missing to build and run (tools/install_deps.sh run)"
tools/install_deps.sh run

# The launcher's runfiles bring the three binaries it starts (coordinator, server, worker):
# nothing else is built (no tests, benchmarks or tools).
# Without a GPU to run it on, the CUDA code is not compiled here (nvcc takes a tenth of this
# build); `bazel build` without the flag, and tools/test.sh, compile it as usual.
build_flags=()
if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
  build_flags+=(--repo_env=TESSERA_DISABLE_CUDA=1)
fi
step "building the launcher, coordinator, server and worker (bazel build ${build_flags[*]} //tools:tessera-launch)"
bazel build "${build_flags[@]}" //tools:tessera-launch
launcher="$(readlink -f bazel-bin)/tools/tessera-launch"

work="$(mktemp -d)"
log="$work/launch.log"
launch_pid=""
cleanup() {
  if [[ -n "$launch_pid" ]] && kill -0 "$launch_pid" 2>/dev/null; then
    kill -TERM "$launch_pid" 2>/dev/null || true
    wait "$launch_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

failures=0
fail() {
  echo "==> FAILED: $*"
  failures=$((failures + 1))
}

# Prints how many lines of a Prometheus text body are samples (not comments, not blank).
count_samples() {
  grep -cv -e '^#' -e '^[[:space:]]*$' "$1" || true
}

# True once the launcher has reported this worker's exit, whatever its status.
worker_exited() {
  grep -Eq "^\[launch\] worker $1 \(pid [0-9]+\) (exited|killed)" "$log"
}

# True once the launcher has reported that this worker exited 0 (waits up to 3 s for it).
worker_finished() {
  local rank="$1" _
  for _ in $(seq 1 30); do
    if grep -Eq "^\[launch\] worker ${rank} \(pid [0-9]+\) exited with status 0" "$log"; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# fetch URL FILE [WORKER_RANK]: a few quick tries, as a process may be just starting; for a
# worker, no more tries once it has exited.
fetch() {
  local _
  for _ in $(seq 1 10); do
    if curl -fsS --max-time 5 -o "$2" "$1" 2>"$work/curl.err"; then
      return 0
    fi
    if [[ -n "${3:-}" ]] && worker_exited "$3"; then
      return 1
    fi
    sleep 0.2
  done
  return 1
}

# check_endpoint ROLE RANK URL: scrape and lint one process's metrics.
check_endpoint() {
  local role="$1" rank="$2" url="$3" body="$work/metrics-$1-$2.txt"
  step "scraping $role $rank: $url"
  local worker_rank=""
  if [[ "$role" == worker ]]; then
    worker_rank="$rank"
  fi
  if ! fetch "$url" "$body" "$worker_rank"; then
    if [[ "$role" == worker ]] && worker_finished "$rank"; then
      echo "==> note: worker $rank finished (exit 0) before its metrics could be scraped: $url"
      return 0
    fi
    fail "cannot fetch $url ($role $rank): $(cat "$work/curl.err")"
    return 0
  fi
  local samples
  samples="$(count_samples "$body")"
  if ((samples == 0)); then
    fail "$url ($role $rank) returned no samples"
  elif promtool check metrics <"$body" >"$work/promtool.out" 2>&1; then
    echo "metrics OK: $url ($role $rank, $samples samples)"
  else
    fail "promtool check metrics rejected $url ($role $rank):"
    sed 's/^/      /' "$work/promtool.out"
  fi
}

# Arguments after the first -- go to every worker.
if [[ $# -eq 0 ]]; then  # the default job
  set -- --mode ps-sync -- --model mlp --hidden 256,256 --steps 300 --batch-size 64 \
    --optimizer adam --lr 0.001 --eval-every 100 --log-every 50 --save-params "$work/params.bin"
fi
launch_args=(--servers 2 --workers 2 --linger "$linger_seconds")
if [[ " $* " != *" --mode"* ]]; then
  launch_args+=(--mode ps-sync)
fi
launch_args+=("$@")
if [[ " $* " != *" -- "* ]]; then
  launch_args+=(--)
fi
launch_args+=(--linger "$worker_linger_seconds")
step "starting the fleet: $launcher ${launch_args[*]}"
# The log exists before tail opens it: the launcher's own redirection runs in the child, which a
# cold machine may schedule after tail (seen on a bare machine: tail failed, nothing was scraped).
: >"$log"
"$launcher" "${launch_args[@]}" >>"$log" 2>&1 &
launch_pid=$!

declare -A urls=()  # "server 1" -> metrics URL
fleet_scraped=0
ready_re='^\[launch\] (coordinator|server|worker) ([0-9]+) pid=[0-9]+ metrics=([^ ]+)$'
linger_re='^\[launch\] all [0-9]+ workers finished; lingering'
while IFS= read -r line; do
  echo "$line"
  if [[ "$line" =~ $ready_re ]]; then
    role="${BASH_REMATCH[1]}" rank="${BASH_REMATCH[2]}" url="${BASH_REMATCH[3]}"
    urls["$role $rank"]="$url"
    if [[ "$role" == worker ]]; then
      check_endpoint "$role" "$rank" "$url"
    fi
  elif [[ "$line" =~ $linger_re ]]; then
    step "all workers finished; scraping the coordinator and the servers"
    if [[ -z "${urls[coordinator 0]:-}" ]]; then
      fail "the launcher never announced the coordinator's metrics"
    fi
    mapfile -t keys < <(printf '%s\n' "${!urls[@]}" | sort)
    for key in "${keys[@]}"; do
      if [[ "$key" != worker* ]]; then
        check_endpoint "${key% *}" "${key#* }" "${urls[$key]}"
      fi
    done
    fleet_scraped=1
  fi
done < <(tail -n +1 -f --pid="$launch_pid" "$log")

launch_status=0
wait "$launch_pid" || launch_status=$?
launch_pid=""

if ((launch_status != 0)); then
  fail "the launcher exited with status $launch_status"
elif ((!fleet_scraped)); then
  fail "the coordinator and servers were not scraped (the launcher never lingered)"
fi
if ((failures > 0)); then
  step "quickstart FAILED ($failures problems; see above)"
  exit 1
fi
step "quickstart OK: the fleet ran, and all its metrics pass promtool (${SECONDS} s in all)"
