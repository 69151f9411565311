#include "common/config/slurm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

TEST(ExpandHostlistTest, Table) {
  const struct {
    const char* hostlist;
    std::vector<std::string> hosts;
  } cases[] = {
      {"n1", {"n1"}},
      {"n[1-3,7]", {"n1", "n2", "n3", "n7"}},
      {"gpu-[01-04]", {"gpu-01", "gpu-02", "gpu-03", "gpu-04"}},
      {"a,b[2-3]", {"a", "b2", "b3"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"r[1-2]-n[1-2]", {"r1-n1", "r1-n2", "r2-n1", "r2-n2"}},
      {"n[1-2].cluster,login", {"n1.cluster", "n2.cluster", "login"}},
      {"n[5]", {"n5"}},
      {"[1-2]", {"1", "2"}},
      {"node-a,node-b", {"node-a", "node-b"}},
  };
  for (const auto& c : cases) {
    StatusOr<std::vector<std::string>> hosts = ExpandHostlist(c.hostlist);
    ASSERT_TRUE(hosts.ok()) << c.hostlist << ": " << hosts.status();
    EXPECT_THAT(*hosts, ElementsAreArray(c.hosts)) << c.hostlist;
  }
}

TEST(ExpandHostlistTest, ErrorsNameTheListAndTheOffset) {
  const struct {
    const char* hostlist;
    const char* message;
  } cases[] = {
      {"", "offset 0: an empty host name"},
      {"a,,b", "offset 2: an empty host name"},
      {"n[1-3", "offset 1: '[' without ']'"},
      {"n1-3]", "offset 4: ']' without '['"},
      {"n[3-1]", "offset 2: the range \"3-1\" runs backwards"},
      {"n[a-b]", "offset 2: expected N or N-M in brackets, got \"a-b\""},
      {"n[]", "offset 2: expected N or N-M"},
      {"n[1,,2]", "offset 4: expected N or N-M"},
      {"n[1-99999999]", "more than"},
      {"n[[1]]", "nested '['"},
      {"n[18446744073709551614-18446744073709551615]n[", "'[' without ']'"},
  };
  for (const auto& c : cases) {
    StatusOr<std::vector<std::string>> hosts = ExpandHostlist(c.hostlist);
    ASSERT_FALSE(hosts.ok()) << c.hostlist;
    EXPECT_EQ(hosts.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(hosts.status().message(), HasSubstr(c.message)) << c.hostlist;
    EXPECT_THAT(hosts.status().message(), HasSubstr("hostlist \"")) << c.hostlist;
  }
}

// A million hosts are allowed, but not a million long names: the names' bytes are capped
// (environment_fuzzer ran out of memory on such a list), wherever the length comes from.
// The largest number ends its range (a loop to `i <= hi` never ended for hi = 2^64 - 1:
// slurm_hostlist_fuzzer found it).
TEST(ExpandHostlistTest, TheLargestNumberEndsItsRange) {
  StatusOr<std::vector<std::string>> hosts =
      ExpandHostlist("n[18446744073709551614-18446744073709551615]");
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  EXPECT_EQ(*hosts, (std::vector<std::string>{"n18446744073709551614", "n18446744073709551615"}));
}

TEST(ExpandHostlistTest, TheNamesBytesAreCapped) {
  const std::string prefix(100, 'n');
  for (const std::string& hostlist :
       {prefix + "[1-999999]", "a[1-1000]" + prefix + "[1-999]",
        prefix + "[1-500000]," + prefix + "[1-500000]",
        "x[" + std::string(3000, '0') + "1-999999]"}) {  // the padding counts too
    StatusOr<std::vector<std::string>> hosts = ExpandHostlist(hostlist);
    ASSERT_FALSE(hosts.ok());
    EXPECT_THAT(hosts.status().message(), HasSubstr("the host names take more than 16 MiB"));
  }
  StatusOr<std::vector<std::string>> many = ExpandHostlist("n[1-999999]");
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(many->size(), 999999u);
}

TEST(SlurmJobPortTest, BelowTheEphemeralRange) {
  EXPECT_EQ(SlurmJobPort(0), 20000);
  EXPECT_EQ(SlurmJobPort(1234), 21234);
  EXPECT_EQ(SlurmJobPort(98765), 28765);
  for (int64_t id : {int64_t{1}, int64_t{9999}, int64_t{123456789}}) {
    EXPECT_GE(SlurmJobPort(id), 20000);
    EXPECT_LT(SlurmJobPort(id), 32768);
  }
}

TEST(ReadSlurmJobTest, OutsideSlurmThereIsNone) {
  StatusOr<std::optional<SlurmJob>> job = ReadSlurmJob({{"SLURM_PROCID", "1"}});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->has_value());
}

TEST(ReadSlurmJobTest, ReadsAStep) {
  StatusOr<std::optional<SlurmJob>> job = ReadSlurmJob({{"SLURM_JOB_ID", "77"},
                                                        {"SLURM_JOB_NODELIST", "n[1-4]"},
                                                        {"SLURM_STEP_NODELIST", "n[2-3]"},
                                                        {"SLURM_NODEID", "1"},
                                                        {"SLURM_STEP_ID", "0"},
                                                        {"SLURM_NTASKS", "4"},
                                                        {"SLURM_PROCID", "3"},
                                                        {"SLURM_LOCALID", "1"}});
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(job->has_value());
  const SlurmJob& slurm = **job;
  EXPECT_EQ(slurm.job_id, 77);
  EXPECT_THAT(slurm.nodes, ElementsAre("n2", "n3"));  // the step's nodes
  EXPECT_EQ(slurm.node_id, 1);
  EXPECT_EQ(slurm.num_tasks, 4);
  EXPECT_EQ(slurm.proc_id, 3);
  EXPECT_EQ(slurm.local_id, 1);
  EXPECT_TRUE(slurm.in_step);
}

TEST(ReadSlurmJobTest, BadVariablesAreNamed) {
  EXPECT_THAT(ReadSlurmJob({{"SLURM_JOB_ID", "x"}, {"SLURM_JOB_NODELIST", "n1"}}).status().message(),
              HasSubstr("SLURM_JOB_ID=\"x\""));
  EXPECT_THAT(ReadSlurmJob({{"SLURM_JOB_ID", "1"}}).status().message(),
              HasSubstr("neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"));
  EXPECT_THAT(ReadSlurmJob({{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "n[1-"}})
                  .status()
                  .message(),
              HasSubstr("SLURM_JOB_NODELIST: hostlist"));
  EXPECT_THAT(ReadSlurmJob({{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "n[1-2]"},
                            {"SLURM_NODEID", "2"}})
                  .status()
                  .message(),
              HasSubstr("SLURM_NODEID=2 is not below 2"));
}

TEST(ResolveSlurmNodeTest, ANameThatResolvesNeedsNoScontrol) {
  bool ran = false;
  StatusOr<std::string> address = ResolveSlurmNode("localhost", [&](const auto&) {
    ran = true;
    return StatusOr<std::string>(UnavailableError("not here"));
  });
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1");
  EXPECT_FALSE(ran);
}

TEST(ResolveSlurmNodeTest, ElseTheNodeAddrScontrolReports) {
  std::vector<std::string> asked;
  StatusOr<std::string> address =
      ResolveSlurmNode("n1.invalid", [&](const std::vector<std::string>& argv) {
        asked = argv;
        return StatusOr<std::string>(
            "NodeName=n1 Arch=x86_64 CoresPerSocket=1\n   CPUAlloc=0 CPUTot=2\n"
            "   NodeAddr=10.77.0.1 NodeHostName=box Version=22.05.8\n");
      });
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "10.77.0.1");
  EXPECT_THAT(asked, ElementsAre("scontrol", "show", "node", "n1.invalid"));
}

TEST(ResolveSlurmNodeTest, TheErrorNamesBothAttempts) {
  StatusOr<std::string> address = ResolveSlurmNode("n1.invalid", [](const auto&) {
    return StatusOr<std::string>(UnavailableError("scontrol exited with status 1"));
  });
  ASSERT_FALSE(address.ok());
  EXPECT_THAT(address.status().message(), HasSubstr("resolving \"n1.invalid\""));
  EXPECT_THAT(address.status().message(),
              HasSubstr("`scontrol show node n1.invalid`: scontrol exited with status 1"));
}

}  // namespace
}  // namespace tessera
