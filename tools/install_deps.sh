#!/usr/bin/env bash
# Installs the Debian 12 packages a task needs, and nothing else. Quiet and quick when they are
# all present; `apt-get update` runs only when something is missing. Uses sudo when not run as
# root. Each script installs its own task's packages as it starts, so a first run installs
# only what it uses.
#
#   tools/install_deps.sh [TASK...]     # default: all
#
# Tasks (each includes `run`):
#   run     build and run the four binaries (tools/quickstart.sh): Bazel, g++, the libraries
#           they link, promtool (Debian's prometheus package) and curl for the metrics check
#   torch   + PyTorch 1.13 (CPU), its C++ headers and pybind11: the torch.distributed backend
#           (tools/install_python.sh, tools/quickstart.sh --torch, tools/torch_dist_suite.sh)
#   test    + everything the test suite runs (tools/test.sh): torch, GoogleTest, Chromium,
#           OpenMPI, Slurm and munge, iproute2, the real Prometheus, a Python ZeroMQ client
#   fuzz    + clang with libFuzzer and the sanitizers' runtimes (tools/fuzz.sh)
#   bench   + the peers tessera-bench runs beside Tessera: OpenMPI, PyTorch (Gloo) with
#           OpenBLAS for its GEMMs
#   all     every task above (what `bazel build //...` needs)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

run_packages=(
  bazel-bootstrap          # Bazel 4.2.3, offline (see shared/notes/bazel-offline.md)
  g++
  libzmq3-dev cppzmq-dev   # transport
  libsodium-dev            # job keys, handshakes, ring-link encryption (common/security)
  libflatbuffers-dev flatbuffers-compiler  # wire format
  libcivetweb-dev          # /metrics over HTTP
  libssl-dev               # HTTPS for /metrics (common/metrics/tls_relay: civetweb's own TLS crashes with OpenSSL 3)
  libopenblas-dev          # CPU GEMM
  libcli11-dev             # flags
  nlohmann-json3-dev
  prometheus               # promtool (the quickstart's check of every /metrics)
  curl                     # the quickstart's scrapes
)
torch_packages=(
  python3-torch libtorch-dev pybind11-dev  # the torch.distributed backend (PyTorch 1.13, CPU)
)
test_packages=(
  "${torch_packages[@]}"
  libgtest-dev libgmock-dev
  python3-zmq              # the foreign client of tests/security_test
  chromium                 # headless browser for the dashboard's test
  openmpi-bin libopenmpi-dev  # mpirun-started jobs (tests/env_launch_test)
  slurmctld slurmd slurm-client munge  # a real Slurm for tests/slurm_test (started by the test)
  iproute2                 # ip netns: the emulated hosts of tests/multihost_test
)
fuzz_packages=(
  clang libclang-rt-14-dev  # libFuzzer and the sanitizers for the fuzz targets (tools/fuzz.sh)
)
bench_packages=(
  "${torch_packages[@]}"
  openmpi-bin libopenmpi-dev  # the MPI_Allreduce peer (mpicc, mpirun)
  libopenblas0-pthread     # PyTorch's GEMMs on OpenBLAS for the training peer (docs/benchmarks.md)
)

tasks=("$@")
if ((${#tasks[@]} == 0)); then
  tasks=(all)
fi
packages=("${run_packages[@]}")
for task in "${tasks[@]}"; do
  case "$task" in
    run) ;;
    torch) packages+=("${torch_packages[@]}") ;;
    test) packages+=("${test_packages[@]}") ;;
    fuzz) packages+=("${fuzz_packages[@]}") ;;
    bench) packages+=("${bench_packages[@]}") ;;
    all) packages+=("${test_packages[@]}" "${fuzz_packages[@]}" "${bench_packages[@]}") ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install_deps: unknown task '$task' (expected run, torch, test, fuzz, bench or all)" >&2
       exit 2 ;;
  esac
done

is_installed() {
  local status
  # shellcheck disable=SC2016  # ${Status} is dpkg-query's field, not a shell variable
  status="$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)"
  [[ "$status" == "install ok installed" ]]
}

missing=()
declare -A seen=()
for package in "${packages[@]}"; do
  [[ -n "${seen[$package]:-}" ]] && continue
  seen[$package]=1
  is_installed "$package" || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

as_root=()
if ((EUID != 0)); then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install_deps: missing ${missing[*]}; run as root or install sudo" >&2
    exit 1
  fi
  as_root=(sudo)
fi

echo "install_deps (${tasks[*]}): installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install_deps: done"
