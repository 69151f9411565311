#!/usr/bin/env bash
# Installs the Debian 12 packages Tessera needs to build, test and run, and nothing else.
# Quiet and quick when everything is present; `apt-get update` runs only when something is
# missing. Uses sudo when not run as root.
#
#   tools/install_deps.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(
  bazel-bootstrap          # Bazel 4.2.3, offline (see shared/notes/bazel-offline.md)
  g++
  libzmq3-dev cppzmq-dev   # transport
  libsodium-dev            # job keys, handshakes, ring-link encryption (common/security)
  python3-zmq              # the foreign client of tests/security_test
  libflatbuffers-dev flatbuffers-compiler  # wire format
  libcivetweb-dev          # /metrics over HTTP
  libssl-dev               # HTTPS for /metrics (common/metrics/tls_relay: civetweb's own TLS crashes with OpenSSL 3)
  libgtest-dev libgmock-dev
  libopenblas-dev          # CPU GEMM
  libcli11-dev             # flags
  nlohmann-json3-dev
  prometheus               # promtool, and the real server for tests
  chromium                 # headless browser for the dashboard's test
  openmpi-bin libopenmpi-dev  # mpirun-started jobs (tests); MPI_Allreduce peer (tessera-bench)
  slurmctld slurmd slurm-client munge  # a real Slurm for tests/slurm_test (started by the test)
  iproute2                 # ip netns: the emulated hosts of tests/multihost_test
  clang libclang-rt-14-dev  # libFuzzer and the sanitizers for the fuzz targets (tools/fuzz.sh)
  curl python3 ca-certificates  # scripts
  python3-torch libtorch-dev pybind11-dev  # the torch.distributed backend (PyTorch 1.13, CPU)
)

is_installed() {
  local status
  # shellcheck disable=SC2016  # ${Status} is dpkg-query's field, not a shell variable
  status="$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)"
  [[ "$status" == "install ok installed" ]]
}

missing=()
for package in "${packages[@]}"; do
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

echo "install_deps: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install_deps: done"
