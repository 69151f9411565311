// tessera-bench: benchmarks that state their figures as ratios against a peer or limit run
// beside them in the same process and run. Each benchmark is a subcommand in its own file
// under tools/bench/ (its flags, its children, its table); this file only dispatches:
//
//   tessera-bench transport ...   tools/bench/transport_bench.h
//   tessera-bench train ...       tools/bench/train_bench.h
//   tessera-bench allreduce ...   tools/bench/allreduce_bench.h
//   tessera-bench memory ...      tools/bench/memory_bench.h
//   tessera-bench exit ...        tools/bench/exit_bench.h
//   tessera-bench failover ...    tools/bench/failover_bench.h
//   tessera-bench torch ...       tools/bench/torch_bench.h
//   tessera-bench ps ...          tools/bench/ps_bench.h
//   tessera-bench security ...    tools/bench/security_bench.h
//   tessera-bench groups ...      tools/bench/groups_bench.h
//   tessera-bench pipeline ...    tools/bench/pipeline_bench.h
//
// To add one: a tools/bench/<name>_bench.{h,cc} with `BenchCommand Add<Name>Bench(CLI::App*)`,
// a cc_library in tools/BUILD, and a line in the list below.
#include <vector>

#include <CLI/CLI.hpp>

#include "common/base/logging.h"
#include "tools/bench/allreduce_bench.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/exit_bench.h"
#include "tools/bench/failover_bench.h"
#include "tools/bench/groups_bench.h"
#include "tools/bench/memory_bench.h"
#include "tools/bench/pipeline_bench.h"
#include "tools/bench/ps_bench.h"
#include "tools/bench/security_bench.h"
#include "tools/bench/torch_bench.h"
#include "tools/bench/train_bench.h"
#include "tools/bench/transport_bench.h"

int main(int argc, char** argv) {
  CLI::App app("tessera-bench: Tessera's benchmarks; every figure is a ratio against a peer or "
               "limit measured beside it in the same run.",
               "tessera-bench");
  app.require_subcommand(1);
  const std::vector<tessera::tools::BenchCommand> commands = {
      tessera::tools::AddTransportBench(&app),
      tessera::tools::AddTrainBench(&app),
      tessera::tools::AddAllReduceBench(&app),
      tessera::tools::AddMemoryBench(&app),
      tessera::tools::AddExitBench(&app),
      tessera::tools::AddFailoverBench(&app),
      tessera::tools::AddTorchBench(&app),
      tessera::tools::AddPsBench(&app),
      tessera::tools::AddSecurityBench(&app),
      tessera::tools::AddGroupsBench(&app),
      tessera::tools::AddPipelineBench(&app),
  };
  CLI11_PARSE(app, argc, argv);
  tessera::SetMinLogLevel(tessera::LogLevel::kWarning);
  for (const tessera::tools::BenchCommand& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return 2;  // unreachable: require_subcommand(1)
}
