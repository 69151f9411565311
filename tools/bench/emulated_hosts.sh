# Two emulated hosts for the benchmarks that cross hosts (sourced by slurm_startup.sh and
# hosts_allreduce.sh; tests/emulated_hosts.cc builds the same for the tests): network
# namespaces "$tag-h0" (10.77.0.1) and "$tag-h1" (10.77.0.2) joined by a bridge in "$tag-sw"
# (10.77.0.254, where a cluster's controller can run). Needs root.
#
#   tag="xyz$$"; source tools/bench/emulated_hosts.sh
#   make_hosts; trap delete_hosts EXIT
#   in_host 0 COMMAND... &   # inside host 0, with a /dev/shm of its own

make_hosts() {
  ip netns add "$tag-sw"
  ip -n "$tag-sw" link add br0 type bridge
  ip -n "$tag-sw" addr add 10.77.0.254/24 dev br0
  ip -n "$tag-sw" link set br0 up
  local i
  for i in 0 1; do
    ip netns add "$tag-h$i"
    ip -n "$tag-h$i" link add eth0 type veth peer name "p$i" netns "$tag-sw"
    ip -n "$tag-sw" link set "p$i" master br0 up
    ip -n "$tag-h$i" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$tag-h$i" link set eth0 up
    ip -n "$tag-h$i" link set lo up
  done
}

delete_hosts() {
  local ns
  for ns in "$tag-h0" "$tag-h1" "$tag-sw"; do ip netns del "$ns" 2>/dev/null || true; done
}

# in_host I COMMAND...: COMMAND inside host I's network namespace, in a mount namespace of its
# own with a fresh /dev/shm (what it starts shares that /dev/shm, as on one host). It execs, so
# that $! is COMMAND's pid: call it in the background (`in_host 0 cmd &`) or a subshell.
in_host() {
  local i="$1"
  shift
  exec nsenter --net="/var/run/netns/$tag-h$i" unshare --mount --propagation private sh -c \
    'mount -t tmpfs tmpfs /dev/shm && exec "$@"' sh "$@"
}
