// Tests of the NCCL backend of Collectives: every operation against a naive host computation, for
// world sizes 1 to 8, the three dtypes and awkward lengths, plus the agreement check, a hung peer
// and creation failures.
//
// The W ranks of a test run in this process, one thread each, with the id broadcast over real
// RingCollectives on loopback (as in worker_main). NCCL refuses two ranks of one communicator on
// one GPU ("Duplicate GPU detected", ncclInvalidUsage), whether they are threads of one process
// or separate processes, since it compares the host and the PCI bus id; so rank r uses device r
// and a world larger than the machine's device count is skipped. (NCCL_HOSTID could make
// processes on one GPU look like different hosts; not done here.) RanksSharingADevice checks
// that such a world fails cleanly instead of hanging.
//
// Without a CUDA device (and in a CPU-only build, where CudaDeviceCount() is 0) every GPU test
// skips; the creation tests that need no device still run.
#include "worker/collectives/nccl/nccl_collectives.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/cuda/cuda_device.h"
#include "worker/collectives/half_float.h"
#include "worker/collectives/ring_test_harness.h"
#include "worker/nn/compute_backend.h"
#include "worker/nn/cuda/cuda_backend.h"

namespace tessera::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;


// Runs body(rank) for ranks 0..world-1 at once, each on its own thread.
std::vector<Status> RunRanks(int world, const std::function<Status(int)>& body) {
  std::vector<Status> results(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&results, &body, rank] { results[rank] = body(rank); });
  }
  for (auto& thread : threads) thread.join();
  return results;
}

bool AllOk(const std::vector<Status>& results) {
  bool ok = true;
  for (size_t rank = 0; rank < results.size(); ++rank) {
    if (!results[rank].ok()) {
      ADD_FAILURE() << "rank " << rank << ": " << results[rank];
      ok = false;
    }
  }
  return ok;
}

// Stands in for the host collectives where only rank() and world_size() are looked at.
class FakeHost final : public Collectives {
 public:
  FakeHost(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Status AllReduce(void*, size_t, DataType, ReduceOp, const std::string&, uint64_t) override {
    return Unexpected();
  }
  Status ReduceScatter(const void*, void*, size_t, DataType, ReduceOp, const std::string&,
                       uint64_t) override {
    return Unexpected();
  }
  Status AllGather(const void*, void*, size_t, DataType, const std::string&, uint64_t) override {
    return Unexpected();
  }
  Status Broadcast(void*, size_t, DataType, int, const std::string&, uint64_t) override {
    return Unexpected();
  }
  Status Barrier(uint64_t) override { return Unexpected(); }

 private:
  static Status Unexpected() { return InternalError("FakeHost: unexpected call"); }
  int rank_;
  int world_;
};

// ---------------------------------------------------------------------------------------------
// A world of NCCL collectives in this process: rank r on CUDA device r, each with a CudaBackend
// for its device memory.

class NcclWorld {
 public:
  // Creates every rank at once (NCCL initialisation needs them all). On failure, the error of
  // the lowest failing rank.
  static StatusOr<std::unique_ptr<NcclWorld>> Create(int world, int64_t timeout_ms = kTestTimeoutMs,
                                                     bool verify_agreement = true,
                                                     bool share_device_0 = false) {
    std::unique_ptr<NcclWorld> w(new NcclWorld(world));
    std::vector<Status> results = RunRanks(world, [&](int rank) -> Status {
      NcclCollectivesOptions options;
      options.rank = rank;
      options.world_size = world;
      options.device = share_device_0 ? 0 : rank;
      options.timeout_ms = timeout_ms;
      options.verify_agreement = verify_agreement;
      ASSIGN_OR_RETURN(w->memory_[rank], CreateCudaBackend(options.device, CudaBackendOptions()));
      ASSIGN_OR_RETURN(w->collectives_[rank], CreateNcclCollectives(options, &w->host_.at(rank)));
      return OkStatus();
    });
    for (const Status& status : results) RETURN_IF_ERROR(status);
    return w;
  }

  int world() const { return static_cast<int>(collectives_.size()); }
  Collectives& at(int rank) { return *collectives_[rank]; }
  ComputeBackend& memory(int rank) { return *memory_[rank]; }
  uint64_t NextTag() { return ++last_tag_; }

  std::vector<Status> Run(const std::function<Status(int)>& body) {
    return RunRanks(world(), body);
  }

 private:
  explicit NcclWorld(int world)
      : host_(world, TestRingOptions()), memory_(world), collectives_(world) {}

  TestRing host_;  // the host collectives, over the transport
  std::vector<std::unique_ptr<ComputeBackend>> memory_;
  // Destroyed before memory_ and host_ (declared after them).
  std::vector<std::unique_ptr<Collectives>> collectives_;
  uint64_t last_tag_ = 100;
};

// `bytes` of device memory on one rank's backend, freed when it goes.
class DeviceBytes {
 public:
  DeviceBytes(ComputeBackend* backend, size_t bytes) : backend_(backend), bytes_(bytes) {
    StatusOr<void*> pointer = backend_->Allocate(bytes);
    EXPECT_TRUE(pointer.ok()) << pointer.status();
    if (pointer.ok()) pointer_ = static_cast<uint8_t*>(*pointer);
  }
  ~DeviceBytes() { backend_->Free(pointer_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  uint8_t* get() { return pointer_; }
  // Writes `host` at byte `offset` and waits until it is on the device.
  void Upload(const Bytes& host, size_t offset = 0) {
    backend_->CopyToDevice(pointer_ + offset, host.data(), host.size());
    backend_->Synchronize();
  }
  Bytes Download(size_t offset, size_t bytes) {
    Bytes host(bytes);
    backend_->CopyToHost(host.data(), pointer_ + offset, bytes);
    return host;
  }
  Bytes Download() { return Download(0, bytes_); }

 private:
  ComputeBackend* backend_;
  size_t bytes_;
  uint8_t* pointer_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Values and the naive reference


uint64_t Mix(uint64_t x) {  // splitmix64's finaliser: deterministic, well spread
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Values whose sums over up to 8 ranks are exact in every dtype and every order, so that sums,
// maxima and minima can be compared bit for bit whatever order NCCL reduces in: integers in
// [-20, 20] for float32, multiples of 1/4 in [-4, 4] for the 16-bit types (a sum has at most 8
// significant bits, which bfloat16 holds).
float ExactInputValue(DataType dtype, int rank, size_t i, uint64_t salt) {
  const uint64_t h = Mix(salt * 1000003 + static_cast<uint64_t>(rank) * 7919 + i);
  if (dtype == DataType::kFloat32) return static_cast<float>(static_cast<int>(h % 41) - 20);
  return static_cast<float>(static_cast<int>(h % 33) - 16) / 4.0f;
}

std::vector<Bytes> ExactInputs(DataType dtype, int world, size_t count, uint64_t salt) {
  std::vector<Bytes> inputs(world, Bytes(count * DataTypeSize(dtype)));
  for (int rank = 0; rank < world; ++rank) {
    for (size_t i = 0; i < count; ++i) {
      Set(dtype, inputs[rank].data(), i, ExactInputValue(dtype, rank, i, salt));
    }
  }
  return inputs;
}

// Element i combined over the ranks, in double, then rounded to dtype.
Bytes NaiveReduce(DataType dtype, ReduceOp op, const std::vector<Bytes>& inputs, size_t count) {
  Bytes out(count * DataTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    double acc = Get(dtype, inputs[0].data(), i);
    for (size_t q = 1; q < inputs.size(); ++q) {
      const double v = Get(dtype, inputs[q].data(), i);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAverage: acc += v; break;
        case ReduceOp::kMax: acc = std::max(acc, v); break;
        case ReduceOp::kMin: acc = std::min(acc, v); break;
        case ReduceOp::kProduct: acc *= v; break;
      }
    }
    if (op == ReduceOp::kAverage) acc /= static_cast<double>(inputs.size());
    Set(dtype, out.data(), i, static_cast<float>(acc));
  }
  return out;
}

// Sum, max and min must match exactly (see InputValue). An average may not: NCCL's ncclAvg
// scales each input by 1/W before summing, rounding each product, so it may be off by a few
// units in the last place at the magnitude of the values (at most 20 for float32, 4 otherwise).
double Tolerance(DataType dtype, ReduceOp op) {
  if (op != ReduceOp::kAverage) return 0.0;
  switch (dtype) {
    case DataType::kFloat32: return 1e-4;
    case DataType::kFloat16: return 8 * std::ldexp(1.0, -8);   // 8 ulps at 4
    case DataType::kBFloat16: return 8 * std::ldexp(1.0, -5);  // 8 ulps at 4
    default: return 0.0;
  }
}

void ExpectNear(DataType dtype, double tolerance, const Bytes& want, const Bytes& got,
                size_t count, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < count && reported < 5; ++i) {
    const float w = Get(dtype, want.data(), i);
    const float g = Get(dtype, got.data(), i);
    if (std::fabs(static_cast<double>(w) - g) > tolerance) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", want " << w;
      ++reported;
    }
  }
}

// Lengths that exercise every layout: empty, fewer elements than ranks, one short of, exactly,
// and one past a multiple of W, odd mid-sized, and large and not a multiple of W.
std::vector<size_t> Lengths(int world) {
  const size_t w = static_cast<size_t>(world);
  std::vector<size_t> lengths = {0, 1, w - 1, w, w + 1, 3 * w + 2, 1001, (1u << 20) + 3};
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

constexpr ReduceOp kReduceOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax,
                                   ReduceOp::kMin};

// ---------------------------------------------------------------------------------------------
// Creation without a device, and option checks

TEST(CreateNcclCollectivesTest, UnavailableWithoutADevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  NcclCollectivesOptions options;
  StatusOr<std::unique_ptr<Collectives>> single = CreateNcclCollectives(options, nullptr);
  ASSERT_FALSE(single.ok());
  EXPECT_EQ(single.status().code(), StatusCode::kUnavailable) << single.status();

  // Two ranks: both fail the same way, neither waits for the other's deadline.
  TestRing host(2, TestRingOptions());
  const auto start = std::chrono::steady_clock::now();
  std::vector<Status> results = RunRanks(2, [&](int rank) -> Status {
    NcclCollectivesOptions mine;
    mine.rank = rank;
    mine.world_size = 2;
    return CreateNcclCollectives(mine, &host.at(rank)).status();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(kTestTimeoutMs / 2));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].code(), StatusCode::kUnavailable) << results[rank];
  }
}

TEST(CreateNcclCollectivesTest, RejectsOptionsThatCannotWork) {
  if (!CudaCompiledIn()) GTEST_SKIP() << "a CPU-only build answers UNAVAILABLE to everything";
  auto create = [](int rank, int world, int device, int64_t timeout_ms, Collectives* host) {
    NcclCollectivesOptions options;
    options.rank = rank;
    options.world_size = world;
    options.device = device;
    options.timeout_ms = timeout_ms;
    return CreateNcclCollectives(options, host).status();
  };
  FakeHost host_0_of_2(0, 2);
  FakeHost host_0_of_3(0, 3);
  struct Case {
    Status status;
    const char* mentions;
  };
  const Case cases[] = {
      {create(0, 0, 0, 1000, nullptr), "world_size=0"},
      {create(2, 2, 0, 1000, &host_0_of_2), "rank=2"},
      {create(-1, 2, 0, 1000, &host_0_of_2), "rank=-1"},
      {create(0, 1, -1, 1000, nullptr), "device=-1"},
      {create(0, 1, 0, 0, nullptr), "timeout_ms=0"},
      {create(0, 2, 0, 1000, nullptr), "no host collectives"},
      {create(0, 2, 0, 1000, &host_0_of_3), "rank 0 of 3"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), StatusCode::kInvalidArgument) << c.status;
    EXPECT_THAT(c.status.message(), HasSubstr(c.mentions));
  }
}

// ---------------------------------------------------------------------------------------------
// Every operation against the naive computation

class NcclCollectivesTest : public ::testing::TestWithParam<std::tuple<int, DataType>> {
 protected:
  void SetUp() override {
    const int devices = CudaDeviceCount();
    if (devices == 0) GTEST_SKIP() << "no CUDA device: " << QueryCudaDevice(0).status();
    if (devices < world()) {
      GTEST_SKIP() << "world size " << world() << " needs " << world()
                   << " CUDA devices (one per rank, as NCCL requires); this machine has "
                   << devices;
    }
    auto created = NcclWorld::Create(world());
    ASSERT_TRUE(created.ok()) << created.status();
    nccl_ = std::move(created).value();
  }

  int world() const { return std::get<0>(GetParam()); }
  DataType dtype() const { return std::get<1>(GetParam()); }
  size_t es() const { return DataTypeSize(dtype()); }
  std::string Label(const char* op, size_t count) const {
    return std::string(op) + " W=" + std::to_string(world()) + " " +
           std::string(DataTypeName(dtype())) + " count=" + std::to_string(count);
  }

  std::unique_ptr<NcclWorld> nccl_;
};

TEST_P(NcclCollectivesTest, AllReduceMatchesNaive) {
  for (size_t count : Lengths(world())) {
    for (ReduceOp op : kReduceOps) {
      const std::string what = Label("allreduce", count) + " " + std::string(ReduceOpName(op));
      const std::vector<Bytes> inputs = ExactInputs(dtype(), world(), count, count + 7);
      const uint64_t tag = nccl_->NextTag();
      std::vector<Bytes> outputs(world());
      ASSERT_TRUE(AllOk(nccl_->Run([&](int rank) -> Status {
        DeviceBytes data(&nccl_->memory(rank), count * es());
        data.Upload(inputs[rank]);
        RETURN_IF_ERROR(nccl_->at(rank).AllReduce(data.get(), count, dtype(), op, "t", tag));
        outputs[rank] = data.Download();
        return OkStatus();
      }))) << what;
      const Bytes want = NaiveReduce(dtype(), op, inputs, count);
      for (int rank = 0; rank < world(); ++rank) {
        ExpectNear(dtype(), Tolerance(dtype(), op), want, outputs[rank], count,
                   what + " rank " + std::to_string(rank));
        EXPECT_EQ(outputs[rank], outputs[0]) << what << ": rank " << rank
                                             << " differs from rank 0 (must be bit-identical)";
      }
    }
  }
}

TEST_P(NcclCollectivesTest, ReduceScatterMatchesNaive) {
  for (size_t count : Lengths(world())) {
    for (ReduceOp op : kReduceOps) {
      for (bool in_place : {false, true}) {
        const std::string what = Label("reducescatter", count) + " " +
                                 std::string(ReduceOpName(op)) + (in_place ? " in place" : "");
        const std::vector<Bytes> inputs = ExactInputs(dtype(), world(), count, count + 11);
        const uint64_t tag = nccl_->NextTag();
        std::vector<Bytes> outputs(world());
        ASSERT_TRUE(AllOk(nccl_->Run([&](int rank) -> Status {
          const Partition own = PartitionOf(count, world(), rank);
          DeviceBytes input(&nccl_->memory(rank), count * es());
          DeviceBytes separate(&nccl_->memory(rank), in_place ? 0 : own.size * es());
          input.Upload(inputs[rank]);
          uint8_t* output = in_place ? input.get() + own.offset * es() : separate.get();
          RETURN_IF_ERROR(nccl_->at(rank).ReduceScatter(input.get(), output, count, dtype(), op,
                                                        "t", tag));
          outputs[rank] = in_place ? input.Download(own.offset * es(), own.size * es())
                                   : separate.Download();
          return OkStatus();
        }))) << what;
        const Bytes whole = NaiveReduce(dtype(), op, inputs, count);
        for (int rank = 0; rank < world(); ++rank) {
          const Partition own = PartitionOf(count, world(), rank);
          const Bytes want(whole.begin() + own.offset * es(), whole.begin() + own.end() * es());
          ExpectNear(dtype(), Tolerance(dtype(), op), want, outputs[rank], own.size,
                     what + " rank " + std::to_string(rank));
        }
      }
    }
  }
}

TEST_P(NcclCollectivesTest, AllGatherMatchesNaive) {
  for (size_t count : Lengths(world())) {
    for (bool in_place : {false, true}) {
      const std::string what = Label("allgather", count) + (in_place ? " in place" : "");
      // Rank q contributes its partition of `whole`; everyone must end up with all of it.
      const Bytes whole = ExactInputs(dtype(), 1, count, count + 13)[0];
      const uint64_t tag = nccl_->NextTag();
      std::vector<Bytes> outputs(world());
      ASSERT_TRUE(AllOk(nccl_->Run([&](int rank) -> Status {
        const Partition own = PartitionOf(count, world(), rank);
        const Bytes mine(whole.begin() + own.offset * es(), whole.begin() + own.end() * es());
        DeviceBytes output(&nccl_->memory(rank), count * es());
        DeviceBytes separate(&nccl_->memory(rank), in_place ? 0 : own.size * es());
        uint8_t* input = in_place ? output.get() + own.offset * es() : separate.get();
        if (in_place) {
          output.Upload(mine, own.offset * es());
        } else {
          separate.Upload(mine);
        }
        RETURN_IF_ERROR(nccl_->at(rank).AllGather(input, output.get(), count, dtype(), "t", tag));
        outputs[rank] = output.Download();
        return OkStatus();
      }))) << what;
      for (int rank = 0; rank < world(); ++rank) {
        EXPECT_EQ(outputs[rank], whole) << what << " rank " << rank;
      }
    }
  }
}

TEST_P(NcclCollectivesTest, BroadcastFromEveryRoot) {
  for (size_t count : Lengths(world())) {
    for (int root = 0; root < world(); ++root) {
      const std::string what = Label("broadcast", count) + " root " + std::to_string(root);
      const std::vector<Bytes> inputs = ExactInputs(dtype(), world(), count, count + 17);
      const uint64_t tag = nccl_->NextTag();
      std::vector<Bytes> outputs(world());
      ASSERT_TRUE(AllOk(nccl_->Run([&](int rank) -> Status {
        DeviceBytes data(&nccl_->memory(rank), count * es());
        data.Upload(inputs[rank]);
        RETURN_IF_ERROR(nccl_->at(rank).Broadcast(data.get(), count, dtype(), root, "t", tag));
        outputs[rank] = data.Download();
        return OkStatus();
      }))) << what;
      for (int rank = 0; rank < world(); ++rank) {
        EXPECT_EQ(outputs[rank], inputs[root]) << what << " rank " << rank;
      }
    }
  }
}

TEST_P(NcclCollectivesTest, Barrier) {
  for (int round = 0; round < 3; ++round) {
    const uint64_t tag = nccl_->NextTag();
    EXPECT_TRUE(AllOk(nccl_->Run([&](int rank) { return nccl_->at(rank).Barrier(tag); })));
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndTypes, NcclCollectivesTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 5, 8),
                       ::testing::Values(DataType::kFloat32, DataType::kFloat16,
                                         DataType::kBFloat16)),
    [](const ::testing::TestParamInfo<std::tuple<int, DataType>>& info) {
      return "W" + std::to_string(std::get<0>(info.param)) + "_" +
             std::string(DataTypeName(std::get<1>(info.param)));
    });

// ---------------------------------------------------------------------------------------------
// Disagreement, failures, deadlines (two ranks)

class NcclFailureTest : public ::testing::Test {
 protected:
  // Two ranks, or a skip when the machine has fewer than two devices.
  void Make(int64_t timeout_ms = kTestTimeoutMs, bool verify_agreement = true) {
    auto created = NcclWorld::Create(2, timeout_ms, verify_agreement);
    ASSERT_TRUE(created.ok()) << created.status();
    nccl_ = std::move(created).value();
  }
  void SetUp() override {
    const int devices = CudaDeviceCount();
    if (devices < 2) {
      GTEST_SKIP() << "needs 2 CUDA devices (one per rank, as NCCL requires); this machine has "
                   << devices;
    }
  }

  // rank r runs AllReduce(count_of[r]) with tag_of[r]; returns each rank's result.
  std::vector<Status> AllReduces(const std::vector<size_t>& count_of,
                                 const std::vector<uint64_t>& tag_of) {
    return nccl_->Run([&](int rank) -> Status {
      DeviceBytes data(&nccl_->memory(rank), 64 * sizeof(float));
      return nccl_->at(rank).AllReduce(data.get(), count_of[rank], DataType::kFloat32,
                                       ReduceOp::kSum, "w", tag_of[rank]);
    });
  }

  std::unique_ptr<NcclWorld> nccl_;
};

TEST_F(NcclFailureTest, DisagreementFailsEveryRankAndKeepsTheCommunicator) {
  Make();
  std::vector<Status> counts = AllReduces({10, 12}, {7, 7});
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(counts[rank].code(), StatusCode::kInvalidArgument) << counts[rank];
    EXPECT_THAT(counts[rank].message(),
                AllOf(HasSubstr("allreduce tag=7 tensor=w rank=" + std::to_string(rank)),
                      HasSubstr("worker " + std::to_string(1 - rank) +
                                " disagrees on the count")));
  }
  std::vector<Status> tags = AllReduces({10, 10}, {8, 9});
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(tags[rank].code(), StatusCode::kInvalidArgument) << tags[rank];
    EXPECT_THAT(tags[rank].message(), HasSubstr("disagrees on the tag"));
  }
  // Different operations.
  const uint64_t tag = nccl_->NextTag();
  std::vector<Status> ops = nccl_->Run([&](int rank) -> Status {
    DeviceBytes data(&nccl_->memory(rank), 16 * sizeof(float));
    if (rank == 0) {
      return nccl_->at(0).AllReduce(data.get(), 16, DataType::kFloat32, ReduceOp::kSum, "w", tag);
    }
    return nccl_->at(1).Broadcast(data.get(), 16, DataType::kFloat32, 0, "w", tag);
  });
  EXPECT_THAT(ops[0].message(), HasSubstr("worker 1 disagrees on the operation: its call has "
                                          "broadcast, this rank's allreduce"));
  EXPECT_EQ(ops[1].code(), StatusCode::kInvalidArgument) << ops[1];
  // Still usable.
  EXPECT_TRUE(AllOk(AllReduces({10, 10}, {20, 20})));
}

TEST_F(NcclFailureTest, ArgumentErrorOnOneRankFailsBoth) {
  Make();
  const uint64_t tag = nccl_->NextTag();
  std::vector<Status> results = nccl_->Run([&](int rank) -> Status {
    DeviceBytes data(&nccl_->memory(rank), 16 * sizeof(float));
    void* pointer = rank == 1 ? nullptr : data.get();
    return nccl_->at(rank).AllReduce(pointer, 16, DataType::kFloat32, ReduceOp::kSum, "w", tag);
  });
  EXPECT_EQ(results[1].code(), StatusCode::kInvalidArgument) << results[1];
  EXPECT_THAT(results[1].message(), HasSubstr("data is null but should hold 16 elements"));
  EXPECT_EQ(results[0].code(), StatusCode::kInvalidArgument) << results[0];
  EXPECT_THAT(results[0].message(), HasSubstr("worker 1 failed this call before it started"));
  EXPECT_TRUE(AllOk(AllReduces({10, 10}, {30, 30})));
}

TEST_F(NcclFailureTest, HungPeerIsCutOffByTheDeadline) {
  constexpr int64_t kShortTimeoutMs = 1500;
  Make(kShortTimeoutMs);
  // Rank 1 never calls.
  DeviceBytes data(&nccl_->memory(0), 16 * sizeof(float));
  const auto start = std::chrono::steady_clock::now();
  const Status hung =
      nccl_->at(0).AllReduce(data.get(), 16, DataType::kFloat32, ReduceOp::kSum, "w", 40);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(hung.code(), StatusCode::kDeadlineExceeded) << hung;
  EXPECT_THAT(hung.message(), AllOf(HasSubstr("allreduce tag=40 tensor=w rank=0"),
                                    HasSubstr("not complete within 1500 ms"),
                                    HasSubstr("communicator was aborted")));
  EXPECT_LT(elapsed, std::chrono::milliseconds(2 * kShortTimeoutMs + 1000));
  // Later calls quote the root cause instead of hanging.
  const Status later =
      nccl_->at(0).AllReduce(data.get(), 16, DataType::kFloat32, ReduceOp::kSum, "w", 41);
  EXPECT_EQ(later.code(), StatusCode::kFailedPrecondition) << later;
  EXPECT_THAT(later.message(), AllOf(HasSubstr("allreduce tag=41"),
                                     HasSubstr("aborted after an earlier failure"),
                                     HasSubstr("tag=40")));
}

TEST_F(NcclFailureTest, WorksWithoutTheAgreementCheck) {
  Make(kTestTimeoutMs, /*verify_agreement=*/false);
  const size_t count = 7;  // not a multiple of 2: padded
  const std::vector<Bytes> inputs = ExactInputs(DataType::kFloat32, 2, count, 3);
  std::vector<Bytes> outputs(2);
  ASSERT_TRUE(AllOk(nccl_->Run([&](int rank) -> Status {
    const Partition own = PartitionOf(count, 2, rank);
    DeviceBytes input(&nccl_->memory(rank), count * 4);
    DeviceBytes output(&nccl_->memory(rank), own.size * 4);
    input.Upload(inputs[rank]);
    RETURN_IF_ERROR(nccl_->at(rank).ReduceScatter(input.get(), output.get(), count,
                                                  DataType::kFloat32, ReduceOp::kSum, "w", 50));
    outputs[rank] = output.Download();
    return OkStatus();
  })));
  const Bytes whole = NaiveReduce(DataType::kFloat32, ReduceOp::kSum, inputs, count);
  for (int rank = 0; rank < 2; ++rank) {
    const Partition own = PartitionOf(count, 2, rank);
    EXPECT_EQ(outputs[rank], Bytes(whole.begin() + own.offset * 4, whole.begin() + own.end() * 4));
  }
}

// ---------------------------------------------------------------------------------------------
// Creation with a device

TEST(CreateNcclCollectivesOnDeviceTest, RankZeroFailureReachesThePeers) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  TestRing host(2, TestRingOptions());
  std::vector<Status> results = RunRanks(2, [&](int rank) -> Status {
    NcclCollectivesOptions options;
    options.rank = rank;
    options.world_size = 2;
    options.device = rank == 0 ? 1000 : 0;  // rank 0 asks for a device the machine lacks
    return CreateNcclCollectives(options, &host.at(rank)).status();
  });
  EXPECT_EQ(results[0].code(), StatusCode::kInvalidArgument) << results[0];
  EXPECT_THAT(results[0].message(), HasSubstr("device=1000"));
  EXPECT_EQ(results[1].code(), StatusCode::kInvalidArgument) << results[1];
  EXPECT_THAT(results[1].message(), HasSubstr("worker 0 could not set up NCCL"));
}

TEST(CreateNcclCollectivesOnDeviceTest, RanksSharingADeviceFailCleanly) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kShortTimeoutMs = 5000;
  const auto start = std::chrono::steady_clock::now();
  auto created = NcclWorld::Create(2, kShortTimeoutMs, true, /*share_device_0=*/true);
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(2 * kShortTimeoutMs + 1000));
  if (created.ok()) {
    GTEST_SKIP() << "this NCCL accepts two ranks on one device";
  }
  EXPECT_THAT(created.status().message(), HasSubstr("ncclCommInitRankConfig")) << created.status();
}

}  // namespace
}  // namespace tessera::worker
