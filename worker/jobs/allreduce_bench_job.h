// The all-reduce benchmark job (`tessera-worker --mode bench-allreduce`), Tessera's side of
// `tessera-bench allreduce`: the workers of a fleet (started by tessera-launch, joined through
// the coordinator as in every mode) build the ring from the fleet view, exactly as
// --mode allreduce does, and time RingCollectives::AllReduce (float32, sum, in place) on
// buffers of each --bench-sizes byte count:
//   1. one verified all-reduce (values rank + 1; every element must be W(W+1)/2), then the
//      buffer is zeroed (what is timed is the same work on zeros, as the peers do);
//   2. --bench-warmup untimed all-reduces; their mean time, max-reduced over the ranks so
//      that every rank picks the same number, gives the timed iterations: --bench-iters, or
//      as many as fit in --bench-seconds (at least 5, at most 10000);
//   3. each timed iteration: a ring barrier, then the all-reduce, timed on each rank;
//   4. the per-iteration times are max-reduced over the ranks (an iteration takes as long as
//      its slowest rank), and rank 0 prints one JSON line per size on stdout:
//        {"bench":"allreduce","system":"tessera","bytes":B,"ranks":W,"iters":K,
//         "median_s":...,"min_s":...,"mean_s":...}
// The first error ends the job.
#ifndef TESSERA_WORKER_JOBS_ALLREDUCE_BENCH_JOB_H_
#define TESSERA_WORKER_JOBS_ALLREDUCE_BENCH_JOB_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "worker/collectives/collectives.h"

namespace tessera::worker {

// The most timed all-reduces per size (--bench-iters, or as many as --bench-seconds fit).
inline constexpr int64_t kMaxBenchIters = 10000;

// Its flags (--bench-sizes, --bench-warmup, --bench-iters, --bench-seconds; --mode bench-ps
// takes them too) are on worker_flags.h's command line.
struct AllReduceBenchFlags {
  std::string sizes = "4096";  // bytes, comma-separated; multiples of 4
  int64_t warmup = 3;
  int64_t iters = 0;  // 0: from seconds
  double seconds = 1;
};

// --bench-sizes: byte counts, multiples of 4 between 4 and 1 GiB; InvalidArgument otherwise.
StatusOr<std::vector<size_t>> ParseBenchSizes(const std::string& text);
// REQUIRES: !values.empty().
double BenchMedian(std::vector<double> values);

// Runs the job on `collectives` (every rank of the fleet calls it with the same flags); rank 0
// writes the JSON lines through `print`.
Status RunAllReduceBench(Collectives& collectives, const AllReduceBenchFlags& flags,
                         const std::function<void(const std::string&)>& print);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_JOBS_ALLREDUCE_BENCH_JOB_H_
