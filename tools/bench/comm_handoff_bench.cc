// comm-handoff-bench: the comm thread's hand-off alone (issue 45): a no-op submitted to a
// CommThread and waited for (CommThread::Wait), over and over, with each spin_us given; prints
// the median and 90th percentile of the round trip. --busy N runs N threads that only compute
// beside it, as the training threads of a host's ranks do.
//
//   bazel build -c opt //tools:comm-handoff-bench
//   bazel-bin/tools/comm-handoff-bench --spin-us 0,20,50,200 --busy 1
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/base/status.h"
#include "worker/collectives/comm_thread.h"

int main(int argc, char** argv) {
  CLI::App app("comm-handoff-bench: round trip of a no-op through the comm thread, per spin");
  std::vector<int64_t> spins = {0, 20, 50, 200};
  int busy = 0;
  int rounds = 20000;
  app.add_option("--spin-us", spins, "CommThread spin_us values, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{0}, tessera::worker::kMaxCommSpinUs))
      ->capture_default_str();
  app.add_option("--busy", busy, "Threads that only compute meanwhile")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "Round trips per spin value")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::atomic<bool> stop{false};
  std::vector<std::thread> burners;
  for (int b = 0; b < busy; ++b) {
    burners.emplace_back([&stop] {
      volatile double x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  for (int64_t spin_us : spins) {
    tessera::worker::CommThread comm(spin_us);
    std::vector<double> us;
    us.reserve(static_cast<size_t>(rounds));
    for (int i = 0; i < rounds; ++i) {
      const auto start = std::chrono::steady_clock::now();
      const tessera::Status status = comm.Wait(comm.Submit([] { return tessera::OkStatus(); }));
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                             start)
                       .count());
      if (!status.ok()) return 1;
    }
    std::sort(us.begin(), us.end());
    std::printf("busy %d spin_us %6lld: median %.1f us, p90 %.1f us\n", busy,
                static_cast<long long>(spin_us), us[us.size() / 2], us[us.size() * 9 / 10]);
  }
  stop = true;
  for (std::thread& thread : burners) thread.join();
  return 0;
}
