// tessera-worker's command line: every flag of every mode (the training flags of
// training_setup.h, the parameter-server, all-reduce and ring flags, and the smoke and benchmark
// jobs' flags: worker/modes/mode_flags.h), registered in this one place; --mode's values and
// their help come from the mode registry (worker/modes/mode_registry.h). CLI11 is a large
// header (about 5 s of compile time per source file that includes it here): the worker's other
// sources hold their flags as plain structs and never include it.
//
// Thread-safety: plain functions; the command line is parsed once, in main().
#ifndef TESSERA_WORKER_WORKER_FLAGS_H_
#define TESSERA_WORKER_WORKER_FLAGS_H_

#include <memory>
#include <string>

#include "worker/modes/mode_flags.h"
#include "worker/training_setup.h"

namespace CLI {
class App;
}

namespace tessera::worker {

struct WorkerFlags {
  std::string mode = "local";  // a name in worker/modes/mode_registry.h
  TrainingFlags training;
  ModeFlags modes;  // the flags of the modes and jobs (worker/modes/mode_flags.h)
  // Tests only (hidden --test-exit RANK:STEP[:leave], issue 47): worker RANK exits right after
  // step STEP, SIGKILLing itself or (":leave") saying goodbye first, so that an elastic job's
  // membership change falls on a step boundary. Empty: never.
  std::string test_exit;
};

// A command line with every flag of tessera-worker bound to `flags` (with help text and
// defaults), ready for RunProcess (common/process/process_runtime.h). REQUIRES: `flags`
// outlives it.
std::shared_ptr<CLI::App> WorkerCommandLine(WorkerFlags* flags);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_WORKER_FLAGS_H_
