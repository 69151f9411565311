#include "worker/modes/mode_registry.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

TEST(ModeRegistryTest, EveryModeHasOneNameAndExactlyOneWayToRun) {
  std::set<std::string_view> names;
  for (const ModeEntry& mode : Modes()) {
    SCOPED_TRACE(std::string(mode.name));
    EXPECT_TRUE(names.insert(mode.name).second) << "named twice";
    EXPECT_FALSE(mode.help.empty());
    EXPECT_NE(mode.make_strategy == nullptr, mode.run_job == nullptr);
    EXPECT_EQ(FindMode(mode.name), &mode);
    // A job runs in a fleet: it cannot train alone.
    if (!mode.trains()) {
      EXPECT_FALSE(mode.Has(kTrainsAlone));
    }
  }
  EXPECT_EQ(FindMode("bogus"), nullptr);
  EXPECT_EQ(FindMode(""), nullptr);
}

// tessera-worker's --help and its error for an unknown --mode say what they said before the
// registry (issue 50, item 6).
TEST(ModeRegistryTest, HelpAndNamesReadAsTheyAlwaysDid) {
  EXPECT_EQ(ModeNames(),
            "local, ps-sync, ps-async, ps-ssp, allreduce, zero1, zero2, zero3, hsdp, smoke, "
            "bench-allreduce, bench-ps");
  EXPECT_EQ(ModesHelp(),
            "local: train alone (no --coordinator needed); ps-sync, ps-async, ps-ssp: "
            "train against the parameter servers; allreduce: data parallel by ring "
            "all-reduce (no servers); zero1, zero2, zero3: the same with the optimizer "
            "state, + gradients, + parameters partitioned (ZeRO stages 1-3); hsdp: zero3 "
            "within each host (or --shard-group-size ranks), replicated across them; smoke: the "
            "fleet smoke job (push/pull through the servers, verified all-reduces, exit); "
            "bench-allreduce: timed all-reduces for tessera-bench allreduce; bench-ps: "
            "timed push+pull steps for tessera-bench ps");
}

// The capabilities main and the trainer used to derive from the names.
TEST(ModeRegistryTest, CapabilitiesAreThoseOfTheModesNames) {
  for (const ModeEntry& mode : Modes()) {
    SCOPED_TRACE(std::string(mode.name));
    const std::string name(mode.name);
    const bool ps = name.rfind("ps-", 0) == 0;
    const bool ring = name == "allreduce" || name.rfind("zero", 0) == 0;
    EXPECT_EQ(mode.Has(kTrainsAlone), name == "local");
    EXPECT_EQ(mode.Has(kNeedsServers), ps || name == "smoke" || name == "bench-ps");
    const bool hsdp = name == "hsdp";
    EXPECT_EQ(mode.Has(kReducesGradientsAcrossRanks), ring || hsdp);
    EXPECT_EQ(mode.Has(kReportsModelStateBytes), ring || hsdp);
    EXPECT_EQ(mode.Has(kCannotSkipEmbeddingSteps), ps);
    EXPECT_EQ(mode.Has(kShardedCheckpoints), ring || hsdp);
    EXPECT_EQ(mode.Has(kServerCheckpoints), ps);
    EXPECT_EQ(mode.trains(), name == "local" || ps || ring || hsdp);
  }
}

// The engines restore the checkpoints of the modes that wrote them in the same format, as
// they did when they compared the names themselves.
TEST(ModeRegistryTest, CheckpointSiblingsShareAFormat) {
  const std::vector<std::string> sharded = {"allreduce", "zero1", "zero2", "zero3", "hsdp"};
  const std::vector<std::string> servers = {"ps-sync", "ps-async", "ps-ssp"};
  for (const std::string& name : sharded) EXPECT_EQ(CheckpointSiblings(*FindMode(name)), sharded);
  for (const std::string& name : servers) EXPECT_EQ(CheckpointSiblings(*FindMode(name)), servers);
  for (const char* name : {"local", "smoke", "bench-allreduce", "bench-ps"}) {
    EXPECT_TRUE(CheckpointSiblings(*FindMode(name)).empty()) << name;
  }
}

}  // namespace
}  // namespace tessera::worker
