#!/usr/bin/env bash
# All-reduce across two emulated hosts with two processes each (issue 20, item 4; issue 45,
# item 2): tessera-worker's defaults (--ring-transport auto: shared memory between the two
# processes of a host, TCP links between hosts; all-reduces from 3 MiB hierarchical: within
# each host by direct reads, across the hosts over links) beside the flat ring on the same
# channels (auto with --direct-read-min-bytes 0: no hierarchy) and beside TCP links on every
# hop (--ring-transport links --direct-read-min-bytes 0), in the same run.
#
#   tools/bench/hosts_allreduce.sh [--sizes 4K,...,64M] [--seconds S] [--repeats N] [--json]
#
# Builds two hosts (network namespaces joined by a bridge in a third, each process in its own
# mount namespace with a private /dev/shm per host; as tests/emulated_hosts.cc does, see
# ../shared/notes/clusters.md) and runs, per transport, one launcher per host:
#   hostI$ tessera-launch --nnodes 2 --node-rank I --nproc-per-node 2 \
#            --coordinator 10.77.0.1:PORT --mode bench-allreduce -- --ring-transport T ...
# (worker/jobs/allreduce_bench_job.h: per size, warm-up calls, then per timed iteration a
# barrier and one float32 sum all-reduce; an iteration's time is the max over the ranks, a
# size's time the median over iterations). With --repeats N the transports alternate N times
# and each size's time is the median of the N runs. Prints time, busbw (2(n-1)/n x algbw) and
# the ratios flat / auto and links / auto per size (> 1: the default is faster), and each
# run's ring channel.
# Needs root; run `bazel build //tools:tessera-launch` first. Leaves nothing behind.
set -euo pipefail

sizes="4K,16K,64K,256K,1M,4M,16M,64M"
seconds=0.5
repeats=1
json=0
while (($#)); do
  case "$1" in
    --sizes) sizes="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --repeats) repeats="$2"; shift ;;
    --json) json=1 ;;
    -h | --help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "hosts_allreduce: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# 4K,1M -> 4096,1048576 (tessera-worker's --bench-sizes takes bytes).
bytes=""
IFS=, read -ra size_list <<<"$sizes"
for size in "${size_list[@]}"; do
  case "$size" in
    *K) n=$((${size%K} << 10)) ;;
    *M) n=$((${size%M} << 20)) ;;
    *G) n=$((${size%G} << 30)) ;;
    *) n="$size" ;;
  esac
  bytes="${bytes:+$bytes,}$n"
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
launch="$root/bazel-bin/tools/tessera-launch"
[[ -x "$launch" ]] || { echo "hosts_allreduce: build //tools:tessera-launch first" >&2; exit 1; }
((EUID == 0)) || { echo "hosts_allreduce: needs root (network namespaces)" >&2; exit 1; }

tag="tha$$"
run="/tmp/tessera-hosts-bench-$$"
mkdir -p "$run"
# shellcheck source=tools/bench/emulated_hosts.sh
source "$root/tools/bench/emulated_hosts.sh"
cleanup() {
  delete_hosts
  rm -rf "$run"
}
trap cleanup EXIT
make_hosts  # 10.77.0.1 and 10.77.0.2
# The job key both nodes' launchers share (--nnodes > 1 needs one).
"$launch" --make-key-file "$run/job.key" >/dev/null
export TESSERA_AUTH_KEY_FILE="$run/job.key"

port=29600
# run_once CONFIG OUT: both launchers; rank 0's JSON lines into OUT. CONFIG: auto (the
# defaults), flat (no hierarchy) or links.
run_once() {
  local config="$1" out="$2" pid0 pid1
  port=$((port + 1))
  local worker_flags=("--ring-transport=auto")
  case "$config" in
    flat) worker_flags=("--ring-transport=auto" "--direct-read-min-bytes=0") ;;
    links) worker_flags=("--ring-transport=links" "--direct-read-min-bytes=0") ;;
  esac
  local flags=(--nnodes 2 --nproc-per-node 2 --coordinator "10.77.0.1:$port"
    --mode bench-allreduce --log-level warning --
    "--bench-sizes=$bytes" --bench-warmup=3 --bench-iters=0 "--bench-seconds=$seconds"
    "${worker_flags[@]}")
  in_host 0 "$launch" --node-rank 0 "${flags[@]}" >"$out.node0" 2>&1 &
  pid0=$!
  in_host 1 "$launch" --node-rank 1 "${flags[@]}" >"$out.node1" 2>&1 &
  pid1=$!
  if ! wait "$pid0" || ! wait "$pid1"; then
    echo "hosts_allreduce: the $config run failed:" >&2
    tail -n 20 "$out.node0" "$out.node1" >&2
    exit 1
  fi
  grep -o '{"bench".*' "$out.node0" >"$out" || true
}

for ((r = 0; r < repeats; ++r)); do
  for config in auto flat links; do
    run_once "$config" "$run/$config.$r"
  done
done

/usr/bin/python3 - "$run" "$repeats" "$json" "$sizes" <<'PY'
import json, statistics, sys
run, repeats, as_json, sizes_text = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
np_ = 4
bus = 2.0 * (np_ - 1) / np_
times, channels = {}, {}
for transport in ("auto", "flat", "links"):
    by_size = {}
    for r in range(repeats):
        for line in open(f"{run}/{transport}.{r}"):
            j = json.loads(line)
            if j.get("bench") == "ring_channel":
                channels[transport] = j["channel"]
            elif j.get("bench") == "allreduce":
                by_size.setdefault(j["bytes"], []).append(j["median_s"])
    times[transport] = {size: statistics.median(v) for size, v in by_size.items()}
sizes = sorted(times["auto"])
missing = [s for s in sizes if s not in times["links"] or s not in times["flat"]]
if missing or not sizes:
    sys.exit(f"hosts_allreduce: no time for sizes {missing or sizes_text}")
rows = []
for size in sizes:
    a, f, l = times["auto"][size], times["flat"][size], times["links"][size]
    rows.append({"bytes": size, "auto_s": a, "flat_s": f, "links_s": l,
                 "auto_busbw_bytes_per_second": bus * size / a,
                 "flat_busbw_bytes_per_second": bus * size / f,
                 "links_busbw_bytes_per_second": bus * size / l,
                 "flat_over_auto": f / a, "links_over_auto": l / a})
if as_json:
    print(json.dumps({"benchmark": "hosts_allreduce", "hosts": 2, "processes_per_host": 2,
                      "dtype": "float32", "op": "sum", "repeats": repeats,
                      "channels": channels, "rows": rows}, indent=2))
    sys.exit(0)
def human(n):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}iB"
    return f"{n} B"
print("allreduce: float32 sum, 2 emulated hosts x 2 processes (ranks 0,1 on 10.77.0.1; 2,3 on "
      f"10.77.0.2); median of {repeats} run(s) of each; busbw = {bus:.2f} x algbw")
for transport in ("auto", "flat", "links"):
    print(f"  {transport}: rank 0's ring channel: {channels.get(transport, '(not reported)')}")
print()
print(f"{'size':>9} {'auto us':>11} {'GB/s':>7} {'flat us':>11} {'links us':>11} "
      f"{'flat/auto':>10} {'links/auto':>11}")
for row in rows:
    print(f"{human(row['bytes']):>9} {row['auto_s'] * 1e6:11.1f} "
          f"{row['auto_busbw_bytes_per_second'] / 1e9:7.3f} {row['flat_s'] * 1e6:11.1f} "
          f"{row['links_s'] * 1e6:11.1f} {row['flat_over_auto']:9.2f}x "
          f"{row['links_over_auto']:10.2f}x")
PY
