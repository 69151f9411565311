#include "worker/modes/job_modes.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/training/ps_job.h"
#include "worker/jobs/allreduce_bench_job.h"
#include "worker/jobs/ps_bench_job.h"
#include "worker/jobs/smoke_job.h"
#include "worker/modes/ring_strategy.h"

namespace tessera::worker {
namespace {

// The whole fleet starts together (servers wait for this barrier too).
Status MeetAtStart(const ModeContext& context) {
  return context.client->Barrier("start", std::nullopt,
                                 context.runtime->config().rendezvous_timeout_ms);
}

void PrintLine(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

Status RunSmokeMode(const ModeContext& context) {
  return RunSmokeJob(*context.runtime, *context.client, context.wiring.mailbox,
                     context.wiring.failures, context.flags->smoke);
}

Status RunAllReduceBenchMode(const ModeContext& context) {
  RETURN_IF_ERROR(MeetAtStart(context));
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, MakeWorkerWorld(context));
  // For tessera-bench, which runs the workers at --log-level warning.
  if (context.client->rank() == 0) {
    PrintLine(nlohmann::json({{"bench", "ring_channel"},
                              {"channel", world->channel_description()}})
                  .dump());
  }
  return RunAllReduceBench(*world, context.flags->bench, PrintLine);
}

Status RunPsBenchMode(const ModeContext& context) {
  RETURN_IF_ERROR(MeetAtStart(context));
  const ModeFlags& flags = *context.flags;
  PsBenchOptions bench;
  bench.flags = flags.bench;
  bench.chunk_elements = flags.ps_chunk_elements;
  bench.shared_memory = flags.ps_shared_memory;
  ASSIGN_OR_RETURN(bench.consistency, ParsePsMode(flags.bench_ps_mode));
  bench.request_timeout_ms = context.runtime->config().request_timeout_ms;
  return RunPsBench(&context.runtime->endpoint(), *context.client, &context.runtime->metrics(),
                    bench, PrintLine);
}

}  // namespace tessera::worker
