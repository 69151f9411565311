// What a user sees at the default log level: one config line per process (the settings that
// differ from the defaults), no table, and every line a worker prints (TESSERA_READY and the
// summary included) names its rank, so that the interleaved output of srun or mpirun reads
// on its own.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/fleet_harness.h"

namespace tessera::testing {
namespace {

constexpr int64_t kRunMs = 120000;

const std::vector<std::string> kSmallJob = {
    "--steps", "5", "--batch-size", "8", "--hidden", "16", "--input-dim", "8", "--classes", "4",
    "--train-samples", "256", "--device", "cpu"};

// True if `line` (without a launcher prefix) names worker `rank`: its log prefix, its
// TESSERA_READY fields or its summary.
bool NamesRank(const std::string& line, int rank) {
  const std::string r = std::to_string(rank);
  return line.find(" worker " + r + " | ") != std::string::npos ||
         line.find(" rank=" + r + " ") != std::string::npos ||
         line.rfind("worker " + r + " of ", 0) == 0;
}

// Runs to a successful exit and returns every line.
std::vector<std::string> RunToSuccess(FleetHarness& harness, const std::string& binary,
                                      const std::vector<std::string>& args) {
  auto id = harness.Start(binary, binary, args);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return {};
  auto exit = harness.WaitExit(*id, Deadline::AfterMillis(kRunMs));
  EXPECT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit.ok() && exit->success()) << harness.Output(*id);
  return harness.process(*id).lines;
}

void ExpectOneConfigLine(const std::vector<std::string>& lines, const std::string& who) {
  int config_lines = 0;
  for (const std::string& line : lines) {
    EXPECT_EQ(line.find("| config --"), std::string::npos) << who << " printed a table: " << line;
    if (line.find("| config: ") != std::string::npos) ++config_lines;
  }
  EXPECT_EQ(config_lines, 1) << who;
}

TEST(OutputTest, LocalRunNamesRankZeroOnEveryLine) {
  FleetHarness harness;
  std::vector<std::string> lines =
      RunToSuccess(harness, "worker/tessera-worker", Concat({"--mode", "local"}, kSmallJob));
  ASSERT_FALSE(lines.empty());
  ExpectOneConfigLine(lines, "worker 0");
  bool summary = false;
  for (const std::string& line : lines) {
    EXPECT_TRUE(NamesRank(line, 0)) << "a line without its rank: " << line;
    summary |= line.rfind("worker 0 of 1: trained ", 0) == 0;
  }
  EXPECT_TRUE(summary) << harness.Output(0);
}

TEST(OutputTest, LocalRunConfigLineNamesWhatWasSet) {
  FleetHarness harness;
  std::vector<std::string> lines = RunToSuccess(
      harness, "worker/tessera-worker", Concat({"--mode", "local", "--no-overlap"}, kSmallJob));
  std::string config;
  for (const std::string& line : lines) {
    if (line.find("| config: ") != std::string::npos) config = line;
  }
  EXPECT_NE(config.find("--mode=local"), std::string::npos) << config;
  EXPECT_NE(config.find("--steps=5"), std::string::npos) << config;
  EXPECT_NE(config.find("--no-overlap "), std::string::npos) << config;
  EXPECT_NE(config.find("(flags)"), std::string::npos) << config;
  EXPECT_EQ(config.find("--heartbeat-timeout-ms"), std::string::npos) << "a default: " << config;
}

TEST(OutputTest, PrintConfigShowsEverySettingAndExits) {
  FleetHarness harness;
  std::vector<std::string> lines =
      RunToSuccess(harness, "worker/tessera-worker",
                   {"--mode", "allreduce", "--steps", "7", "--print-config"});
  std::string all;
  for (const std::string& line : lines) all += line + "\n";
  EXPECT_NE(all.find("--heartbeat-timeout-ms=4000 (default)"), std::string::npos) << all;
  EXPECT_NE(all.find("--steps=7 (flag)"), std::string::npos) << all;
  EXPECT_NE(all.find("--mode=allreduce (flag)"), std::string::npos) << all;
  EXPECT_NE(all.find("--optimizer="), std::string::npos) << all;
  EXPECT_EQ(all.find("TESSERA_READY"), std::string::npos) << "it ran: " << all;
}

// Under the launcher every child's line carries "[role rank] "; a worker's text names its rank
// as well, since srun and mpirun add no such prefix.
TEST(OutputTest, TwoByTwoJobIsQuietAndAttributed) {
  FleetHarness harness;
  std::vector<std::string> lines = RunToSuccess(
      harness, "tools/tessera-launch",
      Concat({"--servers", "2", "--workers", "2", "--mode", "ps-sync", "--"}, kSmallJob));
  ASSERT_FALSE(lines.empty());
  for (const std::string who : {"coordinator 0", "server 0", "server 1", "worker 0", "worker 1"}) {
    std::vector<std::string> own;
    const std::string prefix = "[" + who + "] ";
    for (const std::string& line : lines) {
      if (line.rfind(prefix, 0) == 0) own.push_back(line.substr(prefix.size()));
    }
    ExpectOneConfigLine(own, who);
    if (who.rfind("worker", 0) != 0) continue;
    const int rank = who.back() - '0';
    for (const std::string& line : own) {
      EXPECT_TRUE(NamesRank(line, rank)) << "a line of " << who << " without its rank: " << line;
    }
  }
  // 137 lines before issue 22, 83 of them the config tables.
  EXPECT_LT(lines.size(), 60u) << harness.Output(0);
}

}  // namespace
}  // namespace tessera::testing
