// `tessera-bench torch --fsdp` (issue 44): tessera's CPU FSDP (worker/torch/tessera/torch/fsdp)
// on a GPT-like model beside DistributedDataParallel on the tessera backend and on Gloo, in
// the same run. Every rank is a `/usr/bin/python3 tools/bench/torch_fsdp_bench.py` process (its
// docstring has the model, the step and how memory is counted); each configuration (ddp-tessera,
// ddp-gloo, then each of --strategies) is one run of its own --np processes, so that its peak
// memory is its own, in that order (reversed on odd --repeats):
//   - step time: the median over the timed steps of the slowest rank's step, stated as a ratio
//     to DDP on tessera (step_time_over_ddp) and on Gloo;
//   - peak memory per rank: VmHWM growth over the steps (reset after the model is built and
//     wrapped; construction excluded), less the activations autograd saved (measured), beside
//     the formula (DDP's parameter, gradient and momentum bytes, 12 P) / N plus the two largest
//     units' gathered parameters and full gradients (8 bytes per element);
//   - HYBRID_SHARD with --hybrid-hosts H: hybrid_groups(shard_size=np/H) on this one machine,
//     blocks of np/H consecutive ranks as the "hosts" (the output says so); with --hybrid-netns
//     (root; H = 2) instead across two emulated hosts (emulated_hosts.h: network, mount and UTS
//     namespaces, so hybrid_groups() groups by hostname and no shared memory crosses hosts),
//     beside DDP on tessera across the same two hosts (config ddp-tessera@hosts), its
//     baseline;
//   - with --memory-limit: the largest model (by depth; --memory-dim wide) that trains
//     --memory-steps steps at --memory-np ranks with each rank in a memory cgroup of that limit
//     (cgroup v2 memory.max or v1 memory.limit_in_bytes, under this process's own cgroup; else
//     RLIMIT_DATA through prlimit, said so), for DDP on tessera and FULL_SHARD: doubling the
//     layers from 1, then bisecting to within an eighth.
// The table (or --json: a row per configuration and np carrying strategy, np, step_s,
// step_time_over_ddp, ...) ends with the goals, each met or missed: SHARD_GRAD_OP <= 1.1x DDP on
// tessera, FULL_SHARD <= 1.3x, HYBRID_SHARD <= 1.2x; FULL_SHARD's state memory within 10% of the
// formula; FULL_SHARD's largest model >= 3x DDP's.
#ifndef TESSERA_TOOLS_BENCH_TORCH_FSDP_BENCH_H_
#define TESSERA_TOOLS_BENCH_TORCH_FSDP_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "tools/bench/torch_python.h"

namespace CLI {
class App;
}

namespace tessera::tools {

struct TorchFsdpOptions {
  bool enabled = false;  // --fsdp
  std::string np_text = "2,4";
  std::string strategies_text = "FULL_SHARD,SHARD_GRAD_OP,NO_SHARD,HYBRID_SHARD";
  int dim = 768;
  int layers = 12;
  int heads = 12;
  int vocab = 8192;
  int seq = 128;
  // --batch-size, --steps, --warmup-steps and --repeats of `torch`, when given; else these.
  int batch_size = 2;
  int steps = 5;
  int warmup_steps = 2;
  int repeats = 1;
  int hybrid_hosts = 2;
  bool hybrid_netns = false;  // HYBRID_SHARD across two network-namespace hosts
  std::string memory_limit_text = "0";  // "0": no memory-limit search
  int memory_np = 4;
  int memory_dim = 512;
  int memory_heads = 8;
  int memory_seq = 64;
  int memory_steps = 2;
  int memory_max_layers = 128;
  // MALLOC_MMAP_THRESHOLD_ of the ranks (glibc): 0 leaves glibc's dynamic threshold, under
  // which FSDP's many unit-sized temporaries grow the heap (see the .cc).
  int64_t malloc_mmap_threshold = 0;

  // Parsed from the texts above.
  std::vector<int64_t> nps;
  std::vector<std::string> strategies;
  int64_t memory_limit = 0;
};

// What the rank processes share with `tessera-bench torch`'s other modes.
struct TorchRankSetup {
  PythonSetup python;
  int threads = 1;
  std::string ring_transport = "auto";
  int timeout_s = 600;
  bool json = false;
};

// Adds --fsdp and its own flags to `torch`'s app.
void AddTorchFsdpOptions(CLI::App* app, TorchFsdpOptions* options);

// Parses and validates the texts; an error names the flag.
Status ParseTorchFsdpOptions(TorchFsdpOptions* options);

// Runs the benchmark and prints the table or the JSON lines; returns the exit status.
int RunTorchFsdpBench(const TorchFsdpOptions& options, const TorchRankSetup& setup);

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_TORCH_FSDP_BENCH_H_
