#!/usr/bin/env bash
# Start-up time of a 2-node Slurm job (issue 20): from `srun` to the first training step, beside
# the same job under tessera-launch on one host, in the same run.
#
#   tools/bench/slurm_startup.sh [--repeats N] [--json]
#
# Builds two emulated hosts (network namespaces with their own /dev/shm, joined by a bridge in
# a third) and a real Slurm on them (munged, slurmctld, one slurmd per host; as
# tests/slurm_cluster.cc does, see ../shared/notes/clusters.md), then times, N times each:
#   slurm   srun -N2 --ntasks-per-node=1 tessera-launch --nproc-per-node 2 --mode allreduce
#   local   tessera-launch --workers 4 --mode allreduce (this machine's loopback)
# from the command's start to the first "step 1/" line, and Slurm's own floor,
#   floor   srun -N2 --ntasks-per-node=1 /bin/true (start to exit),
# and prints the medians and their ratios.
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge (tools/install_deps.sh);
# run `bazel build //tools:tessera-launch` first. Leaves nothing behind.
set -euo pipefail

repeats=5
json=0
while (($#)); do
  case "$1" in
    --repeats) repeats="$2"; shift ;;
    --json) json=1 ;;
    -h | --help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "slurm_startup: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
launch="$root/bazel-bin/tools/tessera-launch"
[[ -x "$launch" ]] || { echo "slurm_startup: build //tools:tessera-launch first" >&2; exit 1; }
((EUID == 0)) || { echo "slurm_startup: needs root (network namespaces, slurmd)" >&2; exit 1; }
command -v slurmctld >/dev/null || { echo "slurm_startup: no Slurm (tools/install_deps.sh)" >&2; exit 1; }

tag="tsb$$"
run="/tmp/tessera-slurm-bench-$$"
pids=()
cleanup() {
  for pid in "${pids[@]+"${pids[@]}"}"; do kill "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${pids[@]+"${pids[@]}"}"; do kill -9 "$pid" 2>/dev/null || true; done
  delete_hosts
  rm -rf "$run"
}
trap cleanup EXIT
# shellcheck source=tools/bench/emulated_hosts.sh
source "$root/tools/bench/emulated_hosts.sh"
make_hosts  # 10.77.0.1 and 10.77.0.2; the switch (and slurmctld) at 10.77.0.254
# The job key every node's launcher shares (srun passes the environment on).
mkdir -p "$run"
"$launch" --make-key-file "$run/job.key" >/dev/null
export TESSERA_AUTH_KEY_FILE="$run/job.key"

mkdir -p "$run"/{state,log,spool/n1,spool/n2,munge,munge-sock}
chmod 700 "$run/munge"
chmod 755 "$run" "$run/munge-sock"
host="$(hostname -s)"
cat >"$run/slurm.conf" <<EOF
ClusterName=tesserabench
SlurmctldHost=$host(10.77.0.254)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$run/munge-sock/munge.sock
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$run/state
SlurmdSpoolDir=$run/spool/%n
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd-%n.pid
SlurmctldLogFile=$run/log/slurmctld.log
SlurmdLogFile=$run/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=n1 NodeHostname=$host NodeAddr=10.77.0.1 Port=17001 CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=10.77.0.2 Port=17002 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$run/slurm.conf"
mungekey -c -k "$run/munge/munge.key" 2>/dev/null
munged -F --force --socket="$run/munge-sock/munge.sock" --key-file="$run/munge/munge.key" \
  --pid-file="$run/munge-sock/munged.pid" --log-file="$run/log/munged.log" \
  --seed-file="$run/munge/munged.seed" >"$run/log/munged.out" 2>&1 &
pids+=($!)
nsenter --net="/var/run/netns/$tag-sw" slurmctld -D -c -f "$SLURM_CONF" >"$run/log/ctld.out" 2>&1 &
pids+=($!)
for i in 0 1; do
  in_host "$i" slurmd -D -N "n$((i + 1))" -f "$SLURM_CONF" >"$run/log/slurmd$i.out" 2>&1 &
  pids+=($!)
done
in_host0() { nsenter --net="/var/run/netns/$tag-h0" "$@"; }
for _ in $(seq 300); do
  [[ "$(in_host0 sinfo -h -N -o '%t' 2>/dev/null | grep -c idle)" == 2 ]] && break
  sleep 0.1
done
[[ "$(in_host0 sinfo -h -N -o '%t' 2>/dev/null | grep -c idle)" == 2 ]] ||
  { echo "slurm_startup: the Slurm nodes did not become idle" >&2; exit 1; }

job=(--batch-size 8 --hidden 16 --input-dim 8 --classes 4 --train-samples 256 --device cpu
  --steps 1 --log-every 1)
# time_to_first_step COMMAND...: milliseconds from the start to the first "step 1/" line.
time_to_first_step() {
  local start line
  start="$(date +%s%N)"
  while IFS= read -r line; do
    if [[ "$line" == *"step 1/"* ]]; then
      echo $((($(date +%s%N) - start) / 1000000))
      cat >/dev/null  # let the job finish
      return 0
    fi
  done < <("$@" 2>&1)
  echo "slurm_startup: no step in the output of: $*" >&2
  "$@" 2>&1 | tail -5 >&2
  return 1
}
# time_to_exit COMMAND...: milliseconds from the start to the exit.
time_to_exit() {
  local start
  start="$(date +%s%N)"
  "$@" >/dev/null 2>&1
  echo $((($(date +%s%N) - start) / 1000000))
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

slurm_ms=()
local_ms=()
floor_ms=()
for ((r = 0; r < repeats; ++r)); do
  floor_ms+=("$(time_to_exit in_host0 srun -N2 --ntasks-per-node=1 /bin/true)")
  slurm_ms+=("$(time_to_first_step in_host0 srun -N2 --ntasks-per-node=1 "$launch" \
    --nproc-per-node 2 --mode allreduce -- "${job[@]}")")
  local_ms+=("$(time_to_first_step "$launch" --workers 4 --mode allreduce -- "${job[@]}")")
done
slurm_median="$(printf '%s\n' "${slurm_ms[@]}" | median)"
local_median="$(printf '%s\n' "${local_ms[@]}" | median)"
floor_median="$(printf '%s\n' "${floor_ms[@]}" | median)"
ratio="$(awk -v a="$slurm_median" -v b="$local_median" 'BEGIN {printf "%.2f", a / b}')"
over_floor="$(awk -v a="$slurm_median" -v b="$floor_median" 'BEGIN {printf "%.2f", a / b}')"
if ((json)); then
  printf '{"bench":"slurm_startup","repeats":%d,"slurm_ms":[%s],"local_ms":[%s],' "$repeats" \
    "$(IFS=,; echo "${slurm_ms[*]}")" "$(IFS=,; echo "${local_ms[*]}")"
  printf '"floor_ms":[%s],"slurm_median_ms":%s,"local_median_ms":%s,"floor_median_ms":%s,' \
    "$(IFS=,; echo "${floor_ms[*]}")" "$slurm_median" "$local_median" "$floor_median"
  printf '"ratio_to_one_host":%s,"ratio_to_floor":%s}\n' "$ratio" "$over_floor"
else
  printf '%-58s %10s %s\n' "start-up to step 1 (median of $repeats)" "ms" "runs"
  printf '%-58s %10s %s\n' "srun -N2 tessera-launch --nproc-per-node 2 (2 hosts)" \
    "$slurm_median" "${slurm_ms[*]}"
  printf '%-58s %10s %s\n' "tessera-launch --workers 4 (one host)" "$local_median" "${local_ms[*]}"
  printf '%-58s %10s %s\n' "srun -N2 /bin/true (Slurm's floor, to exit)" "$floor_median" \
    "${floor_ms[*]}"
  printf '%-58s %10s\n' "ratio (Slurm job / one host)" "$ratio"
  printf '%-58s %10s\n' "ratio (Slurm job / Slurm's floor)" "$over_floor"
fi
