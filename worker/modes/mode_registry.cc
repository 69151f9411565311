#include "worker/modes/mode_registry.h"

#include "worker/modes/allreduce_strategy.h"
#include "worker/modes/hsdp_strategy.h"
#include "worker/modes/local_strategy.h"
#include "worker/modes/ps_strategy.h"
#include "worker/modes/zero_strategy.h"

namespace tessera::worker {

const std::vector<ModeEntry>& Modes() {
  static const auto* const kModes = [] {
    constexpr std::string_view kPs = "train against the parameter servers";
    constexpr std::string_view kZero =
        "the same with the optimizer state, + gradients, + parameters partitioned (ZeRO stages "
        "1-3)";
    constexpr uint32_t kPsCapabilities =
        kNeedsServers | kCannotSkipEmbeddingSteps | kServerCheckpoints | kSurvivesServerLoss;
    constexpr uint32_t kRingCapabilities =
        kReducesGradientsAcrossRanks | kReportsModelStateBytes | kShardedCheckpoints;
    return new std::vector<ModeEntry>{
        // name, help, capabilities, training strategy, job
        {"local", "train alone (no --coordinator needed)", kTrainsAlone, MakeLocalStrategy,
         nullptr},
        {"ps-sync", kPs, kPsCapabilities, MakePsSyncStrategy, nullptr},
        {"ps-async", kPs, kPsCapabilities, MakePsAsyncStrategy, nullptr},
        {"ps-ssp", kPs, kPsCapabilities, MakePsSspStrategy, nullptr},
        {"allreduce", "data parallel by ring all-reduce (no servers)", kRingCapabilities,
         MakeAllReduceStrategy, nullptr},
        {"zero1", kZero, kRingCapabilities, MakeZero1Strategy, nullptr},
        {"zero2", kZero, kRingCapabilities, MakeZero2Strategy, nullptr},
        {"zero3", kZero, kRingCapabilities, MakeZero3Strategy, nullptr},
        {"hsdp", "zero3 within each host (or --shard-group-size ranks), replicated across them",
         kRingCapabilities, MakeHsdpStrategy, nullptr},
        {"smoke", "the fleet smoke job (push/pull through the servers, verified all-reduces, "
         "exit)", kNeedsServers, nullptr, RunSmokeMode},
        {"bench-allreduce", "timed all-reduces for tessera-bench allreduce", 0, nullptr,
         RunAllReduceBenchMode},
        {"bench-ps", "timed push+pull steps for tessera-bench ps", kNeedsServers, nullptr,
         RunPsBenchMode},
    };
  }();
  return *kModes;
}

const ModeEntry* FindMode(std::string_view name) {
  for (const ModeEntry& mode : Modes()) {
    if (mode.name == name) return &mode;
  }
  return nullptr;
}

std::string ModeNames() {
  std::string names;
  for (const ModeEntry& mode : Modes()) {
    names += (names.empty() ? "" : ", ") + std::string(mode.name);
  }
  return names;
}

std::vector<std::string> ModeNamesWith(ModeCapability capability) {
  std::vector<std::string> names;
  for (const ModeEntry& mode : Modes()) {
    if (mode.Has(capability)) names.emplace_back(mode.name);
  }
  return names;
}

std::vector<std::string> CheckpointSiblings(const ModeEntry& mode) {
  for (ModeCapability format : {kShardedCheckpoints, kServerCheckpoints}) {
    if (mode.Has(format)) return ModeNamesWith(format);
  }
  return {};
}

std::string ModesHelp() {
  const std::vector<ModeEntry>& modes = Modes();
  std::string help;
  for (size_t i = 0; i < modes.size(); ++i) {
    const bool shares_next = i + 1 < modes.size() && modes[i + 1].help == modes[i].help;
    help += std::string(modes[i].name) + (shares_next ? ", " : ": " + std::string(modes[i].help));
    if (!shares_next && i + 1 < modes.size()) help += "; ";
  }
  return help;
}

}  // namespace tessera::worker
