#include "worker/jobs/allreduce_bench_job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include <nlohmann/json.hpp>


namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxBytes = size_t{1} << 30;
constexpr int64_t kMinIters = 5;

// One size: verify, warm up, time, reduce the times, report (see the header).
class SizeRun {
 public:
  SizeRun(Collectives& collectives, const AllReduceBenchFlags& flags, size_t bytes,
          uint64_t* next_tag)
      : c_(collectives), flags_(flags), bytes_(bytes), count_(bytes / sizeof(float)),
        next_tag_(next_tag), tensor_("bench" + std::to_string(bytes)) {}

  StatusOr<nlohmann::json> Run() {
    std::vector<float> buffer(count_, static_cast<float>(c_.rank() + 1));
    RETURN_IF_ERROR(AllReduce(buffer));
    const int w = c_.world_size();
    const float expected = static_cast<float>(w * (w + 1) / 2);
    for (size_t i = 0; i < count_; ++i) {
      if (buffer[i] != expected) {
        return DataLossError("bench allreduce " + tensor_ + " rank=" + std::to_string(c_.rank()) +
                             ": element " + std::to_string(i) + " is " +
                             std::to_string(buffer[i]) + ", expected " +
                             std::to_string(expected));
      }
    }
    std::fill(buffer.begin(), buffer.end(), 0.0f);

    const auto warm_start = Clock::now();
    for (int64_t i = 0; i < flags_.warmup; ++i) RETURN_IF_ERROR(AllReduce(buffer));
    std::vector<float> warm_mean = {
        flags_.warmup == 0
            ? 0.0f
            : static_cast<float>(std::chrono::duration<double>(Clock::now() - warm_start).count() /
                                 static_cast<double>(flags_.warmup))};
    RETURN_IF_ERROR(c_.AllReduce(warm_mean.data(), 1, DataType::kFloat32, ReduceOp::kMax,
                                 tensor_ + ".warmup", (*next_tag_)++));
    int64_t iters = flags_.iters;
    if (iters == 0) {
      iters = warm_mean[0] > 0 ? static_cast<int64_t>(flags_.seconds / warm_mean[0]) : kMaxBenchIters;
      iters = std::clamp(iters, kMinIters, kMaxBenchIters);
    }

    std::vector<float> times(static_cast<size_t>(iters));
    for (float& time : times) {
      RETURN_IF_ERROR(c_.Barrier((*next_tag_)++));
      const auto start = Clock::now();
      RETURN_IF_ERROR(AllReduce(buffer));
      time = static_cast<float>(std::chrono::duration<double>(Clock::now() - start).count());
    }
    RETURN_IF_ERROR(c_.AllReduce(times.data(), times.size(), DataType::kFloat32, ReduceOp::kMax,
                                 tensor_ + ".times", (*next_tag_)++));
    std::vector<double> seconds(times.begin(), times.end());
    double total = 0;
    for (double s : seconds) total += s;
    return nlohmann::json{{"bench", "allreduce"},
                          {"system", "tessera"},
                          {"bytes", bytes_},
                          {"ranks", w},
                          {"iters", iters},
                          {"median_s", BenchMedian(seconds)},
                          {"min_s", *std::min_element(seconds.begin(), seconds.end())},
                          {"mean_s", total / static_cast<double>(seconds.size())}};
  }

 private:
  Status AllReduce(std::vector<float>& buffer) {
    return c_.AllReduce(buffer.data(), buffer.size(), DataType::kFloat32, ReduceOp::kSum,
                        tensor_, (*next_tag_)++);
  }

  Collectives& c_;
  const AllReduceBenchFlags& flags_;
  const size_t bytes_;
  const size_t count_;
  uint64_t* const next_tag_;
  const std::string tensor_;
};

}  // namespace

StatusOr<std::vector<size_t>> ParseBenchSizes(const std::string& text) {
  std::vector<size_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < sizeof(float) || value % sizeof(float) != 0 ||
        value > kMaxBytes) {
      return InvalidArgumentError("--bench-sizes=\"" + text + "\": \"" + item +
                                  "\" is not a multiple of 4 bytes between 4 and 1 GiB");
    }
    sizes.push_back(static_cast<size_t>(value));
  }
  if (sizes.empty()) return InvalidArgumentError("--bench-sizes is empty");
  return sizes;
}

double BenchMedian(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

Status RunAllReduceBench(Collectives& collectives, const AllReduceBenchFlags& flags,
                         const std::function<void(const std::string&)>& print) {
  ASSIGN_OR_RETURN(std::vector<size_t> sizes, ParseBenchSizes(flags.sizes));
  uint64_t next_tag = 1;
  for (size_t bytes : sizes) {
    SizeRun run(collectives, flags, bytes, &next_tag);
    ASSIGN_OR_RETURN(nlohmann::json line, run.Run());
    if (collectives.rank() == 0) print(line.dump());
  }
  return OkStatus();
}

}  // namespace tessera::worker
