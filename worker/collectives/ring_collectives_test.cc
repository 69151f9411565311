#include "worker/collectives/ring_collectives.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/transport/rpc_endpoint.h"
#include "common/transport/zmq/zmq_endpoint.h"
#include "worker/collectives/channel/links/ring_links.h"
#include "worker/collectives/channel/shm/ring_shm.h"
#include "worker/collectives/half_float.h"

namespace tessera::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using Bytes = std::vector<uint8_t>;

// ring_collectives_links_test builds this file with TESSERA_RING_TEST_LINKS=1: every ring then
// sends its segments over RingLinks instead of transport and mailbox.
// ring_collectives_shm_test builds it with TESSERA_RING_TEST_SHM=1: over RingShm (kUseLinks is
// then true as well: everything said of links holds for any RingChannel).
#ifndef TESSERA_RING_TEST_LINKS
#define TESSERA_RING_TEST_LINKS 0
#endif
#ifndef TESSERA_RING_TEST_SHM
#define TESSERA_RING_TEST_SHM 0
#endif
constexpr bool kUseShm = TESSERA_RING_TEST_SHM != 0;
constexpr bool kUseLinks = TESSERA_RING_TEST_LINKS != 0 || kUseShm;

constexpr int64_t kTimeoutMs = 30000;
// Small segments, so that even short test buffers are cut into several segments per block and
// the pipeline has something to overlap.
constexpr size_t kTestSegmentBytes = 1024;

// ---------------------------------------------------------------------------------------------
// PartitionOf

static_assert(PartitionOf(10, 4, 0) == Partition{0, 3});
static_assert(PartitionOf(10, 4, 1) == Partition{3, 3});
static_assert(PartitionOf(10, 4, 2) == Partition{6, 2});
static_assert(PartitionOf(10, 4, 3) == Partition{8, 2});
static_assert(PartitionOf(2, 3, 2) == Partition{2, 0});

TEST(PartitionOfTest, TilesTheBufferInRankOrderAsEvenlyAsPossible) {
  for (size_t count = 0; count <= 100; ++count) {
    for (int world = 1; world <= 9; ++world) {
      size_t next = 0;
      for (int rank = 0; rank < world; ++rank) {
        const Partition p = PartitionOf(count, world, rank);
        ASSERT_EQ(p.offset, next) << count << " " << world << " " << rank;
        const size_t expected_size =
            count / world + (static_cast<size_t>(rank) < count % world ? 1 : 0);
        ASSERT_EQ(p.size, expected_size) << count << " " << world << " " << rank;
        next = p.end();
      }
      ASSERT_EQ(next, count) << count << " " << world;
    }
  }
  const size_t huge = std::numeric_limits<size_t>::max();
  EXPECT_EQ(PartitionOf(huge, 7, 6).end(), huge);
}

// ---------------------------------------------------------------------------------------------
// Test fixtures

// A slow network: holds every message for `delay` before handing it, in order, to the real
// transport, as socket buffers keep frames after their sender has moved on.
class DelayingTransport final : public Transport {
 public:
  DelayingTransport(Transport& inner, std::chrono::milliseconds delay)
      : inner_(inner), delay_(delay), thread_([this] { Loop(); }) {}
  ~DelayingTransport() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  const std::string& address() const override { return inner_.address(); }
  Status Start(MessageHandler handler) override { return inner_.Start(std::move(handler)); }
  void SetIdentity(proto::Role role, int32_t rank) override { inner_.SetIdentity(role, rank); }
  Status Send(const std::string& address, Message message) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({SteadyClock::now() + delay_, address, std::move(message)});
    }
    cv_.notify_all();
    return OkStatus();
  }
  Status Reply(const Origin& origin, Message message) override {
    return inner_.Reply(origin, std::move(message));
  }
  void Shutdown() override {}

 private:
  struct Held {
    SteadyClock::time_point due;
    std::string address;
    Message message;
  };

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (queue_.empty()) {
        if (stopping_) return;
        cv_.wait(lock);
        continue;
      }
      if (SteadyClock::now() < queue_.front().due) {
        cv_.wait_until(lock, queue_.front().due);
        continue;
      }
      Held held = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      (void)inner_.Send(held.address, std::move(held.message));
      lock.lock();
    }
  }

  Transport& inner_;
  const std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Held> queue_;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::thread thread_;
};

// W workers on loopback, each with its own RPC endpoint, mailbox and RingCollectives, wired as
// in worker_main (optionally behind a DelayingTransport). Counts the chunks each rank receives
// and the largest payload among them.
class Ring {
 public:
  explicit Ring(int world, size_t segment_bytes = kTestSegmentBytes,
                int64_t timeout_ms = kTimeoutMs,
                const std::vector<std::chrono::milliseconds>& send_delays = {})
      : stats_(world), delayed_(world) {
    for (int rank = 0; rank < world; ++rank) {
      ZmqTransportOptions options;
      options.role = proto::Role::Worker;
      options.rank = rank;
      auto endpoint = StartZmqEndpoint(options, nullptr);
      EXPECT_TRUE(endpoint.ok()) << endpoint.status();
      auto mailbox = std::make_shared<CollectiveMailbox>();
      Stats* stats = &stats_[rank];
      (*endpoint)->SetHandler(proto::Body::CollectiveChunk, [mailbox, stats](Envelope envelope) {
        uint64_t bytes = 0;
        for (const Payload& payload : envelope.message.payloads) bytes += payload.size();
        stats->chunks.fetch_add(1);
        uint64_t seen = stats->max_payload_bytes.load();
        while (bytes > seen && !stats->max_payload_bytes.compare_exchange_weak(seen, bytes)) {
        }
        mailbox->Deliver(ToReceivedChunk(envelope));
      });
      addresses_.push_back((*endpoint)->address());
      endpoints_.push_back(std::move(endpoint).value());
      mailboxes_.push_back(std::move(mailbox));
      if (static_cast<size_t>(rank) < send_delays.size() && send_delays[rank].count() > 0) {
        delayed_[rank] = std::make_unique<DelayingTransport>(endpoints_.back()->transport(),
                                                             send_delays[rank]);
      }
    }
    links_.resize(world);
    if (kUseLinks && world > 1) {
      std::vector<std::thread> threads;
      for (int rank = 0; rank < world; ++rank) {
        threads.emplace_back([this, rank, world] {
#if TESSERA_RING_TEST_SHM
          RingShmOptions shm;
          shm.rank = rank;
          shm.world_size = world;
          shm.peer_addresses = addresses_;
          shm.transport = &endpoints_[rank]->transport();
          shm.mailbox = mailboxes_[rank].get();
          shm.ring_bytes = 4096;  // frames wrap, and large ones are streamed
          auto connected = RingShm::Connect(shm);
          EXPECT_TRUE(connected.ok()) << connected.status();
          if (connected.ok()) links_[rank] = std::move(connected).value();
          return;
#endif
          RingLinksOptions options;
          options.rank = rank;
          options.world_size = world;
          options.peer_addresses = addresses_;
          options.transport = &endpoints_[rank]->transport();
          options.mailbox = mailboxes_[rank].get();
          options.spin_us = 20;  // exercises the spinning wait too
          auto links = RingLinks::Connect(options);
          EXPECT_TRUE(links.ok()) << links.status();
          if (links.ok()) links_[rank] = std::move(links).value();
        });
      }
      for (auto& thread : threads) thread.join();
    }
    for (int rank = 0; rank < world; ++rank) {
      collectives_.push_back(Make(rank, segment_bytes, timeout_ms));
    }
  }

  ~Ring() {
    delayed_.clear();  // delivers what it still holds
    // The handlers refer to stats_: stop the endpoints first.
    for (auto& endpoint : endpoints_) endpoint->Shutdown();
  }

  RingCollectivesOptions Options(int rank, size_t segment_bytes, int64_t timeout_ms) {
    RingCollectivesOptions options;
    options.rank = rank;
    options.world_size = world();
    options.peer_addresses = addresses_;
    options.transport = delayed_[rank] == nullptr
                            ? &endpoints_[rank]->transport()
                            : static_cast<Transport*>(delayed_[rank].get());
    options.mailbox = mailboxes_[rank].get();
    options.links = links_[rank];
    options.timeout_ms = timeout_ms;
    options.segment_bytes = segment_bytes;
    return options;
  }

  std::unique_ptr<RingCollectives> Make(int rank, size_t segment_bytes, int64_t timeout_ms) {
    auto collectives = RingCollectives::Create(Options(rank, segment_bytes, timeout_ms));
    EXPECT_TRUE(collectives.ok()) << collectives.status();
    return std::move(collectives).value();
  }

  // Replaces rank's collectives (another timeout or segment size for one rank).
  void Remake(int rank, size_t segment_bytes, int64_t timeout_ms) {
    collectives_[rank] = Make(rank, segment_bytes, timeout_ms);
  }

  int world() const { return static_cast<int>(endpoints_.size()); }
  Collectives& at(int rank) { return *collectives_[rank]; }
  CollectiveMailbox& mailbox(int rank) { return *mailboxes_[rank]; }
  // Null without links.
  RingChannel* links(int rank) { return links_[rank].get(); }
  // Closes rank's links, as when its process dies. REQUIRES: rank makes no call any more.
  void CloseLinks(int rank) {
    collectives_[rank].reset();
    links_[rank].reset();
  }
  uint64_t chunks_received(int rank) const { return stats_[rank].chunks.load(); }
  uint64_t max_payload_bytes(int rank) const { return stats_[rank].max_payload_bytes.load(); }
  uint64_t NextTag() { return ++last_tag_; }

  std::vector<int> AllRanks() const {
    std::vector<int> ranks(endpoints_.size());
    for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
    return ranks;
  }

  // Runs body(rank) for each of `ranks` at once, each on its own thread.
  std::vector<Status> Run(const std::vector<int>& ranks, const std::function<Status(int)>& body) {
    std::vector<Status> results(world());
    std::vector<std::thread> threads;
    for (int rank : ranks) {
      threads.emplace_back([&results, &body, rank] { results[rank] = body(rank); });
    }
    for (auto& thread : threads) thread.join();
    return results;
  }
  std::vector<Status> RunAll(const std::function<Status(int)>& body) {
    return Run(AllRanks(), body);
  }

 private:
  struct Stats {
    std::atomic<uint64_t> chunks{0};
    std::atomic<uint64_t> max_payload_bytes{0};
  };

  std::vector<Stats> stats_;
  std::vector<std::unique_ptr<RpcEndpoint>> endpoints_;
  std::vector<std::shared_ptr<CollectiveMailbox>> mailboxes_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<DelayingTransport>> delayed_;  // by rank; null: none
  std::vector<std::shared_ptr<RingChannel>> links_;          // by rank; null: none
  std::vector<std::unique_ptr<RingCollectives>> collectives_;
  uint64_t last_tag_ = 100;
};

bool AllOk(const std::vector<Status>& results, const std::vector<int>& ranks) {
  bool ok = true;
  for (int rank : ranks) {
    if (!results[rank].ok()) {
      ADD_FAILURE() << "rank " << rank << ": " << results[rank];
      ok = false;
    }
  }
  return ok;
}

bool MailboxesEmpty(Ring& ring) {
  bool empty = true;
  for (int rank = 0; rank < ring.world(); ++rank) {
    if (ring.links(rank) != nullptr && ring.links(rank)->kept() != 0) {
      ADD_FAILURE() << "rank " << rank << " keeps " << ring.links(rank)->kept() << " frames";
      empty = false;
    }
    if (ring.mailbox(rank).queued() != 0) {
      ADD_FAILURE() << "rank " << rank << " has " << ring.mailbox(rank).queued()
                    << " chunks left in its mailbox";
      empty = false;
    }
  }
  return empty;
}

// ---------------------------------------------------------------------------------------------
// Values and the naive reference

float Get(DataType dtype, const uint8_t* buffer, size_t i) {
  switch (dtype) {
    case DataType::kFloat32: {
      float value;
      std::memcpy(&value, buffer + 4 * i, 4);
      return value;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      uint16_t bits;
      std::memcpy(&bits, buffer + 2 * i, 2);
      return dtype == DataType::kFloat16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
    }
  }
  return 0;
}

void Set(DataType dtype, uint8_t* buffer, size_t i, float value) {
  switch (dtype) {
    case DataType::kFloat32: std::memcpy(buffer + 4 * i, &value, 4); return;
    case DataType::kFloat16: {
      const uint16_t bits = FloatToHalf(value);
      std::memcpy(buffer + 2 * i, &bits, 2);
      return;
    }
    case DataType::kBFloat16: {
      const uint16_t bits = FloatToBFloat16(value);
      std::memcpy(buffer + 2 * i, &bits, 2);
      return;
    }
  }
}

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser: deterministic, well spread
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Exactly representable inputs: integers in [-20, 20] for float32 (so that float32 sums are
// exact in any order and can be compared bit for bit), multiples of 2^-8 in (-1, 1) for the
// 16-bit types (exact in float16 and bfloat16).
float InputValue(DataType dtype, int rank, size_t i, uint64_t salt) {
  const uint64_t h = Mix(salt * 1000003 + static_cast<uint64_t>(rank) * 7919 + i);
  if (dtype == DataType::kFloat32) return static_cast<float>(static_cast<int>(h % 41) - 20);
  return static_cast<float>(static_cast<int>(h % 511) - 255) / 256.0f;
}

// Each rank's `count` input elements.
std::vector<Bytes> Inputs(DataType dtype, int world, size_t count, uint64_t salt) {
  std::vector<Bytes> inputs(world, Bytes(count * DataTypeSize(dtype)));
  for (int rank = 0; rank < world; ++rank) {
    for (size_t i = 0; i < count; ++i) {
      Set(dtype, inputs[rank].data(), i, InputValue(dtype, rank, i, salt));
    }
  }
  return inputs;
}

// The stated tolerance. float32 (integer inputs): exact. float16 / bfloat16: every partial
// result is rounded to 16 bits once per ring step, at most W times in all, each time by at most
// half an ulp, 2^-11 (float16) or 2^-8 (bfloat16) relative, of a value no larger than
// sum|x_q|; so |got - exact| <= W * 2^-p * sum|x_q| for a sum, that divided by W for an average
// (plus float32's own rounding of the division). Max and min are exact in every dtype.
double Tolerance(DataType dtype, ReduceOp op, int world, double sum_of_magnitudes) {
  if (dtype == DataType::kFloat32 || op == ReduceOp::kMax || op == ReduceOp::kMin) return 0;
  const double half_ulp = dtype == DataType::kFloat16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  const double bound = world * half_ulp * sum_of_magnitudes;
  return op == ReduceOp::kAverage ? bound / world * (1 + std::ldexp(1.0, -20)) : bound;
}

// Checks got[j] (j = 0 .. n-1) against the reduction over ranks of inputs[q][begin + j].
bool MatchesReference(DataType dtype, ReduceOp op, const std::vector<Bytes>& inputs, size_t begin,
                      size_t n, const uint8_t* got, const std::string& what) {
  const int world = static_cast<int>(inputs.size());
  for (size_t j = 0; j < n; ++j) {
    double sum = 0, magnitudes = 0;
    double max = -std::numeric_limits<double>::infinity();
    double min = std::numeric_limits<double>::infinity();
    for (int q = 0; q < world; ++q) {
      const double x = Get(dtype, inputs[q].data(), begin + j);
      sum += x;
      magnitudes += std::fabs(x);
      max = std::max(max, x);
      min = std::min(min, x);
    }
    double want = sum;
    if (op == ReduceOp::kMax) want = max;
    if (op == ReduceOp::kMin) want = min;
    if (op == ReduceOp::kAverage) {
      want = dtype == DataType::kFloat32
                 ? static_cast<double>(static_cast<float>(sum) / static_cast<float>(world))
                 : sum / world;
    }
    const double value = Get(dtype, got, j);
    const double tolerance = Tolerance(dtype, op, world, magnitudes);
    if (!(std::fabs(value - want) <= tolerance)) {
      ADD_FAILURE() << what << ": element " << begin + j << " is " << value << ", expected "
                    << want << " within " << tolerance;
      return false;
    }
  }
  return true;
}

std::vector<size_t> AwkwardLengths(int world) {
  const size_t w = static_cast<size_t>(world);
  std::vector<size_t> lengths = {0, 1, w - 1, w, w + 1, 97, 1009, 4099};
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

const DataType kDTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax, ReduceOp::kMin};

std::string Describe(size_t count, DataType dtype, ReduceOp op) {
  return std::to_string(count) + " x " + std::string(DataTypeName(dtype)) + ", " +
         std::string(ReduceOpName(op));
}

// ---------------------------------------------------------------------------------------------
// Every collective against the naive reference, world sizes 1..8

class RingCollectivesWorld : public ::testing::TestWithParam<int> {};

TEST_P(RingCollectivesWorld, AllReduceMatchesTheReference) {
  const int world = GetParam();
  Ring ring(world);
  for (size_t count : AwkwardLengths(world)) {
    for (DataType dtype : kDTypes) {
      for (ReduceOp op : kOps) {
        const std::string what = Describe(count, dtype, op);
        SCOPED_TRACE(what);
        const uint64_t tag = ring.NextTag();
        const std::vector<Bytes> inputs = Inputs(dtype, world, count, tag);
        std::vector<Bytes> buffers = inputs;
        std::vector<Status> results = ring.RunAll([&](int rank) {
          return ring.at(rank).AllReduce(buffers[rank].data(), count, dtype, op, "test.w", tag);
        });
        ASSERT_TRUE(AllOk(results, ring.AllRanks()));
        for (int rank = 0; rank < world; ++rank) {
          ASSERT_TRUE(MatchesReference(dtype, op, inputs, 0, count, buffers[rank].data(),
                                       what + " rank " + std::to_string(rank)));
          ASSERT_EQ(buffers[rank], buffers[0]) << "every rank gets the same bits; rank " << rank;
        }
      }
    }
  }
  EXPECT_TRUE(MailboxesEmpty(ring));
}

TEST_P(RingCollectivesWorld, ReduceScatterMatchesTheReference) {
  const int world = GetParam();
  Ring ring(world);
  for (size_t count : AwkwardLengths(world)) {
    for (DataType dtype : kDTypes) {
      for (ReduceOp op : kOps) {
        for (bool in_place : {false, true}) {
          const std::string what =
              Describe(count, dtype, op) + (in_place ? ", in place" : ", out of place");
          SCOPED_TRACE(what);
          const size_t bytes = DataTypeSize(dtype);
          const uint64_t tag = ring.NextTag();
          const std::vector<Bytes> inputs = Inputs(dtype, world, count, tag);
          std::vector<Bytes> in = inputs;
          std::vector<Bytes> out(world);
          for (int rank = 0; rank < world; ++rank) {
            out[rank].assign(PartitionOf(count, world, rank).size * bytes, 0xab);
          }
          std::vector<Status> results = ring.RunAll([&](int rank) {
            uint8_t* output = in_place ? in[rank].data() +
                                             PartitionOf(count, world, rank).offset * bytes
                                       : out[rank].data();
            return ring.at(rank).ReduceScatter(in[rank].data(), output, count, dtype, op,
                                               "test.w", tag);
          });
          ASSERT_TRUE(AllOk(results, ring.AllRanks()));
          for (int rank = 0; rank < world; ++rank) {
            const Partition own = PartitionOf(count, world, rank);
            const uint8_t* got =
                in_place ? in[rank].data() + own.offset * bytes : out[rank].data();
            ASSERT_TRUE(MatchesReference(dtype, op, inputs, own.offset, own.size, got,
                                         what + " rank " + std::to_string(rank)));
            if (!in_place) {
              ASSERT_EQ(in[rank], inputs[rank]) << "input untouched, rank " << rank;
            }
          }
        }
      }
    }
  }
  EXPECT_TRUE(MailboxesEmpty(ring));
}

TEST_P(RingCollectivesWorld, AllGatherMatchesTheReference) {
  const int world = GetParam();
  Ring ring(world);
  for (size_t count : AwkwardLengths(world)) {
    for (DataType dtype : kDTypes) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::to_string(count) + " x " + std::string(DataTypeName(dtype)) +
                     (in_place ? ", in place" : ", out of place"));
        const size_t bytes = DataTypeSize(dtype);
        const uint64_t tag = ring.NextTag();
        // The gathered buffer, which rank q's share of comes from rank q.
        const Bytes whole = Inputs(dtype, 1, count, tag)[0];
        std::vector<Bytes> in(world), out(world, Bytes(count * bytes, 0xab));
        for (int rank = 0; rank < world; ++rank) {
          const Partition own = PartitionOf(count, world, rank);
          in[rank].assign(whole.begin() + own.offset * bytes, whole.begin() + own.end() * bytes);
          if (in_place) {
            std::copy(in[rank].begin(), in[rank].end(), out[rank].begin() + own.offset * bytes);
          }
        }
        std::vector<Status> results = ring.RunAll([&](int rank) {
          const uint8_t* input = in_place ? out[rank].data() +
                                                PartitionOf(count, world, rank).offset * bytes
                                          : in[rank].data();
          return ring.at(rank).AllGather(input, out[rank].data(), count, dtype, "test.w", tag);
        });
        ASSERT_TRUE(AllOk(results, ring.AllRanks()));
        for (int rank = 0; rank < world; ++rank) ASSERT_EQ(out[rank], whole) << "rank " << rank;
      }
    }
  }
  EXPECT_TRUE(MailboxesEmpty(ring));
}

TEST_P(RingCollectivesWorld, BroadcastFromEveryRoot) {
  const int world = GetParam();
  Ring ring(world);
  for (size_t count : AwkwardLengths(world)) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16}) {
      for (int root = 0; root < world; ++root) {
        SCOPED_TRACE(std::to_string(count) + " x " + std::string(DataTypeName(dtype)) +
                     " from root " + std::to_string(root));
        const uint64_t tag = ring.NextTag();
        const Bytes data = Inputs(dtype, 1, count, tag)[0];
        std::vector<Bytes> buffers(world, Bytes(data.size(), 0xab));
        buffers[root] = data;
        std::vector<Status> results = ring.RunAll([&](int rank) {
          return ring.at(rank).Broadcast(buffers[rank].data(), count, dtype, root, "test.w", tag);
        });
        ASSERT_TRUE(AllOk(results, ring.AllRanks()));
        for (int rank = 0; rank < world; ++rank) ASSERT_EQ(buffers[rank], data) << "rank " << rank;
      }
    }
  }
  EXPECT_TRUE(MailboxesEmpty(ring));
}

// No rank leaves the barrier before the last one has entered it.
TEST_P(RingCollectivesWorld, BarrierWaitsForTheLastRank) {
  const int world = GetParam();
  Ring ring(world);
  for (int late = 0; late < world; ++late) {
    const uint64_t tag = ring.NextTag();
    std::vector<SteadyClock::time_point> left(world);
    SteadyClock::time_point late_entered;
    std::vector<Status> results = ring.RunAll([&](int rank) {
      if (rank == late) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        late_entered = SteadyClock::now();
      }
      Status status = ring.at(rank).Barrier(tag);
      left[rank] = SteadyClock::now();
      return status;
    });
    ASSERT_TRUE(AllOk(results, ring.AllRanks()));
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_GE(left[rank], late_entered) << "rank " << rank << " left before rank " << late
                                          << " entered";
    }
  }
  EXPECT_TRUE(MailboxesEmpty(ring));
}

// A few MB with the default segment size (256 KiB), so blocks span several segments.
// Buffers cut into default-size (1 MiB) segments: 4 MiB of float32 gives every block at least
// one whole segment up to 4 ranks. Beyond that a block is under one segment, which the other
// tests cover with small buffers, and the larger worlds only multiplied the time (world 5-8 took
// four fifths of this test's 100 s under TSan).
class RingCollectivesLargeBuffers : public ::testing::TestWithParam<int> {};

TEST_P(RingCollectivesLargeBuffers, LargeBuffersWithTheDefaultSegmentSize) {
  const int world = GetParam();
  Ring ring(world, RingCollectivesOptions().segment_bytes);
  const size_t count = (size_t{1} << 20) + 3;  // 4 MiB of float32, 2 MiB of float16
  for (auto [dtype, op] : {std::pair{DataType::kFloat32, ReduceOp::kAverage},
                           std::pair{DataType::kFloat16, ReduceOp::kSum}}) {
    const std::string what = Describe(count, dtype, op);
    SCOPED_TRACE(what);
    const uint64_t tag = ring.NextTag();
    const std::vector<Bytes> inputs = Inputs(dtype, world, count, tag);
    std::vector<Bytes> buffers = inputs;
    std::vector<Status> results = ring.RunAll([&](int rank) {
      return ring.at(rank).AllReduce(buffers[rank].data(), count, dtype, op, "big", tag);
    });
    ASSERT_TRUE(AllOk(results, ring.AllRanks()));
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_TRUE(MatchesReference(dtype, op, inputs, 0, count, buffers[rank].data(),
                                   what + " rank " + std::to_string(rank)));
    }
  }
  // Reduce-scatter then all-gather of the same buffer: ZeRO's pattern.
  const uint64_t tag = ring.NextTag();
  const std::vector<Bytes> inputs = Inputs(DataType::kFloat32, world, count, tag);
  std::vector<Bytes> buffers = inputs;
  std::vector<Status> results = ring.RunAll([&](int rank) {
    uint8_t* shard = buffers[rank].data() + PartitionOf(count, world, rank).offset * 4;
    RETURN_IF_ERROR(ring.at(rank).ReduceScatter(buffers[rank].data(), shard, count,
                                                DataType::kFloat32, ReduceOp::kSum, "big", tag));
    return ring.at(rank).AllGather(shard, buffers[rank].data(), count, DataType::kFloat32, "big",
                                   tag + 1);
  });
  ASSERT_TRUE(AllOk(results, ring.AllRanks()));
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, 0, count,
                                 buffers[rank].data(), "rank " + std::to_string(rank)));
  }
  EXPECT_TRUE(MailboxesEmpty(ring));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RingCollectivesWorld, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });
INSTANTIATE_TEST_SUITE_P(WorldSizes, RingCollectivesLargeBuffers, ::testing::Range(1, 5),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

// ---------------------------------------------------------------------------------------------
// Segments, staging, concurrency

// A block is cut into segments of at most segment_bytes, one message each: an all-reduce of
// 10000 float32 among 3 ranks has blocks of 3334 elements (13336 bytes), so 14 segments of at
// most 1024 bytes, and 2 (W - 1) steps x 14 messages reach every rank.
TEST(RingCollectivesTest, CutsBlocksIntoSegmentsOfAtMostSegmentBytes) {
  if (kUseLinks) GTEST_SKIP() << "counts the chunks the transport delivers";
  Ring ring(3);
  const size_t count = 10000;
  std::vector<Bytes> buffers = Inputs(DataType::kFloat32, 3, count, 1);
  ASSERT_TRUE(AllOk(ring.RunAll([&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), count, DataType::kFloat32,
                                   ReduceOp::kSum, "", 1);
  }), ring.AllRanks()));
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(ring.chunks_received(rank), 2u * 2 * 14) << "rank " << rank;
    EXPECT_LE(ring.max_payload_bytes(rank), kTestSegmentBytes) << "rank " << rank;
    EXPECT_GT(ring.max_payload_bytes(rank), kTestSegmentBytes / 2) << "rank " << rank;
  }
}

// The caller may overwrite its buffers as soon as a call returns, even while the network still
// holds frames the call sent: what travels from the caller's memory was staged. Rank 0's
// messages take 200 ms; in a reduce-scatter or an all-gather among 3 ranks, rank 0 returns long
// before its successor has received its first block. Each rank scribbles over its buffers at
// once, and every rank's result must still be right.
TEST(RingCollectivesTest, BuffersMayChangeAsSoonAsACallReturns) {
  constexpr int kWorld = 3;
  Ring ring(kWorld, kTestSegmentBytes, kTimeoutMs, {std::chrono::milliseconds(200)});
  const size_t count = 3001;
  const std::vector<Bytes> inputs = Inputs(DataType::kFloat32, kWorld, count, 1);
  std::vector<Bytes> reduced(kWorld), scattered(kWorld), gathered(kWorld);
  std::vector<Status> results = ring.RunAll([&](int rank) -> Status {
    const Partition own = PartitionOf(count, kWorld, rank);
    Bytes buffer = inputs[rank];
    RETURN_IF_ERROR(ring.at(rank).AllReduce(buffer.data(), count, DataType::kFloat32,
                                            ReduceOp::kSum, "", 1));
    reduced[rank] = buffer;
    std::fill(buffer.begin(), buffer.end(), 0xcd);

    buffer = inputs[rank];
    Bytes out(own.size * 4);
    RETURN_IF_ERROR(ring.at(rank).ReduceScatter(buffer.data(), out.data(), count,
                                                DataType::kFloat32, ReduceOp::kSum, "", 2));
    scattered[rank] = out;
    std::fill(buffer.begin(), buffer.end(), 0xcd);
    std::fill(out.begin(), out.end(), 0xcd);

    Bytes part(inputs[0].begin() + own.offset * 4, inputs[0].begin() + own.end() * 4);
    Bytes whole(count * 4);
    RETURN_IF_ERROR(ring.at(rank).AllGather(part.data(), whole.data(), count, DataType::kFloat32,
                                            "", 3));
    gathered[rank] = whole;
    std::fill(part.begin(), part.end(), 0xcd);
    std::fill(whole.begin(), whole.end(), 0xcd);
    return OkStatus();
  });
  ASSERT_TRUE(AllOk(results, ring.AllRanks()));
  for (int rank = 0; rank < kWorld; ++rank) {
    const Partition own = PartitionOf(count, kWorld, rank);
    EXPECT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, 0, count,
                                 reduced[rank].data(), "allreduce rank " + std::to_string(rank)));
    EXPECT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, own.offset,
                                 own.size, scattered[rank].data(),
                                 "reducescatter rank " + std::to_string(rank)));
    EXPECT_EQ(gathered[rank], inputs[0]) << "allgather rank " << rank;
  }
}

// Back-to-back calls on one buffer reuse the staging buffers once the transport released them.
TEST(RingCollectivesTest, BackToBackCallsOnOneBuffer) {
  Ring ring(4);
  const size_t count = 3001;
  std::vector<Status> results = ring.RunAll([&](int rank) -> Status {
    Bytes buffer;
    for (uint64_t round = 0; round < 20; ++round) {
      const std::vector<Bytes> inputs = Inputs(DataType::kFloat32, 4, count, round);
      buffer = inputs[rank];
      RETURN_IF_ERROR(ring.at(rank).AllReduce(buffer.data(), count, DataType::kFloat32,
                                              ReduceOp::kSum, "", 1000 + round));
      if (!MatchesReference(DataType::kFloat32, ReduceOp::kSum, inputs, 0, count, buffer.data(),
                            "round " + std::to_string(round))) {
        return InternalError("wrong sum in round " + std::to_string(round));
      }
    }
    return OkStatus();
  });
  EXPECT_TRUE(AllOk(results, ring.AllRanks()));
  EXPECT_TRUE(MailboxesEmpty(ring));
}

// Operations with different tags run at the same time on every rank without mixing up.
TEST(RingCollectivesTest, ConcurrentOperationsAreKeptApartByTag) {
  constexpr int kWorld = 4;
  Ring ring(kWorld);
  const size_t count = 2053;
  const std::vector<Bytes> sum_inputs = Inputs(DataType::kFloat32, kWorld, count, 1);
  const std::vector<Bytes> max_inputs = Inputs(DataType::kBFloat16, kWorld, count, 2);
  const Bytes gathered = Inputs(DataType::kFloat16, 1, count, 3)[0];
  const Bytes broadcast = Inputs(DataType::kFloat32, 1, count, 4)[0];
  std::vector<Bytes> sums = sum_inputs, scattered(kWorld), gather_out(kWorld),
                     broadcast_out(kWorld, Bytes(broadcast.size()));
  broadcast_out[2] = broadcast;
  std::vector<Status> results = ring.RunAll([&](int rank) -> Status {
    const Partition own = PartitionOf(count, kWorld, rank);
    scattered[rank].resize(own.size * 2);
    gather_out[rank].resize(count * 2);
    Status statuses[5];
    std::vector<std::thread> threads;
    threads.emplace_back([&] {
      statuses[0] = ring.at(rank).AllReduce(sums[rank].data(), count, DataType::kFloat32,
                                            ReduceOp::kSum, "a", 1);
    });
    threads.emplace_back([&] {
      statuses[1] = ring.at(rank).ReduceScatter(max_inputs[rank].data(), scattered[rank].data(),
                                                count, DataType::kBFloat16, ReduceOp::kMax, "b",
                                                2);
    });
    threads.emplace_back([&] {
      statuses[2] = ring.at(rank).AllGather(gathered.data() + own.offset * 2,
                                            gather_out[rank].data(), count, DataType::kFloat16,
                                            "c", 3);
    });
    threads.emplace_back([&] {
      statuses[3] = ring.at(rank).Broadcast(broadcast_out[rank].data(), count,
                                            DataType::kFloat32, 2, "d", 4);
    });
    threads.emplace_back([&] { statuses[4] = ring.at(rank).Barrier(5); });
    for (auto& thread : threads) thread.join();
    for (const Status& status : statuses) RETURN_IF_ERROR(status);
    return OkStatus();
  });
  ASSERT_TRUE(AllOk(results, ring.AllRanks()));
  for (int rank = 0; rank < kWorld; ++rank) {
    const Partition own = PartitionOf(count, kWorld, rank);
    EXPECT_TRUE(MatchesReference(DataType::kFloat32, ReduceOp::kSum, sum_inputs, 0, count,
                                 sums[rank].data(), "allreduce"));
    EXPECT_TRUE(MatchesReference(DataType::kBFloat16, ReduceOp::kMax, max_inputs, own.offset,
                                 own.size, scattered[rank].data(), "reducescatter"));
    EXPECT_EQ(gather_out[rank], gathered) << "rank " << rank;
    EXPECT_EQ(broadcast_out[rank], broadcast) << "rank " << rank;
  }
  EXPECT_TRUE(MailboxesEmpty(ring));
}

// A tag may be used again once the operation that used it has ended everywhere.
TEST(RingCollectivesTest, ATagMayBeReusedSequentially) {
  Ring ring(3);
  std::vector<Status> results = ring.RunAll([&](int rank) -> Status {
    for (int i = 0; i < 10; ++i) {
      float value = static_cast<float>(rank + i);
      RETURN_IF_ERROR(ring.at(rank).AllReduce(&value, 1, DataType::kFloat32, ReduceOp::kMax,
                                              "", 7));
      if (value != static_cast<float>(2 + i)) return InternalError("wrong max");
      RETURN_IF_ERROR(ring.at(rank).Barrier(7));
    }
    return OkStatus();
  });
  EXPECT_TRUE(AllOk(results, ring.AllRanks()));
  EXPECT_TRUE(MailboxesEmpty(ring));
}

// ---------------------------------------------------------------------------------------------
// Disagreements: every rank fails, naming the peer, long before the deadline

constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;

// Runs body(rank) on every rank of `ring` and checks that each one failed with `code` well
// before the 30 s deadline.
std::vector<Status> RunExpectingFailures(Ring& ring, StatusCode code,
                                         const std::function<Status(int)>& body) {
  auto started = SteadyClock::now();
  std::vector<Status> results = ring.RunAll(body);
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(10000))
      << "the failure must travel round the ring, not wait for the deadline";
  for (int rank = 0; rank < ring.world(); ++rank) {
    EXPECT_EQ(results[rank].code(), code) << "rank " << rank << ": " << results[rank];
  }
  return results;
}

// Ranks 0 and 1 all-reduce 10 elements, rank 2 12. Rank 0 and rank 2 see the difference in
// their predecessor's chunks; rank 1, whose predecessor agrees with it, hears of it from rank 0.
TEST(RingCollectivesMismatchTest, AnotherCountFailsEveryRankNamingThePeer) {
  Ring ring(3);
  std::vector<Bytes> buffers = {Bytes(40), Bytes(40), Bytes(48)};
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), buffers[rank].size() / 4,
                                   DataType::kFloat32, ReduceOp::kSum, "layer3.w", 5);
  });
  EXPECT_THAT(results[0].message(),
              HasSubstr("allreduce tag=5 tensor=layer3.w rank=0: the chunk from worker 2 (step 0) "
                        "is for a buffer of 12 elements; this rank's has 10"));
  EXPECT_THAT(results[2].message(),
              HasSubstr("allreduce tag=5 tensor=layer3.w rank=2: the chunk from worker 1 (step 0) "
                        "is for a buffer of 10 elements; this rank's has 12"));
  EXPECT_THAT(results[1].message(),
              StartsWith("allreduce tag=5 tensor=layer3.w rank=1: worker 0 reported a failure: "
                         "allreduce tag=5 tensor=layer3.w rank=0: the chunk from worker 2"));
}

TEST(RingCollectivesMismatchTest, AnotherReduceOpFailsEveryRankNamingThePeer) {
  Ring ring(3);
  std::vector<Bytes> buffers(3, Bytes(4 * 100));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 100, DataType::kFloat32,
                                   rank == 1 ? ReduceOp::kMax : ReduceOp::kSum, "w", 6);
  });
  EXPECT_THAT(results[1].message(),
              HasSubstr("rank=1: the chunk from worker 0 (step 0) reduces with sum; this rank "
                        "with max"));
  EXPECT_THAT(results[2].message(),
              HasSubstr("rank=2: the chunk from worker 1 (step 0) reduces with max; this rank "
                        "with sum"));
  EXPECT_THAT(results[0].message(),
              AllOf(StartsWith("allreduce tag=6 tensor=w rank=0: worker 2 reported a failure: "),
                    HasSubstr("rank=2: the chunk from worker 1")));
}

TEST(RingCollectivesMismatchTest, AnotherDTypeFailsEveryRankNamingThePeer) {
  Ring ring(2);
  std::vector<Bytes> buffers(2, Bytes(4 * 64));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 64,
                                   rank == 0 ? DataType::kFloat16 : DataType::kFloat32,
                                   ReduceOp::kSum, "", 7);
  });
  EXPECT_THAT(results[0].message(),
              HasSubstr("allreduce tag=7 rank=0: the chunk from worker 1 (step 0) holds float32 "
                        "elements; this rank's are float16"));
  EXPECT_THAT(results[1].message(), HasSubstr("rank=1: the chunk from worker 0"));
}

TEST(RingCollectivesMismatchTest, AnotherCollectiveUnderTheSameTagFailsEveryRank) {
  Ring ring(3);
  std::vector<Bytes> buffers(3, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    if (rank == 1) {
      return ring.at(rank).Broadcast(buffers[rank].data(), 30, DataType::kFloat32, 0, "w", 8);
    }
    return ring.at(rank).AllReduce(buffers[rank].data(), 30, DataType::kFloat32, ReduceOp::kSum,
                                   "w", 8);
  });
  EXPECT_THAT(results[1].message(),
              HasSubstr("broadcast tag=8 tensor=w rank=1: the chunk from worker 0 (step 0) comes "
                        "from a call of allreduce; this rank calls broadcast"));
  EXPECT_THAT(results[2].message(), HasSubstr("rank=2: worker 1 reported a failure: broadcast"));
  EXPECT_THAT(results[0].message(), HasSubstr("rank=0: worker 2 reported a failure: broadcast"));
}

TEST(RingCollectivesMismatchTest, AnotherBroadcastRootFailsEveryRankTheRootIncluded) {
  Ring ring(3);
  std::vector<Bytes> buffers(3, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).Broadcast(buffers[rank].data(), 30, DataType::kFloat32,
                                   rank == 2 ? 1 : 0, "w", 9);
  });
  EXPECT_THAT(results[2].message(),
              HasSubstr("rank=2: the chunk from worker 1 (step 0) is root worker 0's elements "
                        "[0, 30), expected root worker 1's elements [0, 30): do all ranks "
                        "broadcast from the same root?"));
  EXPECT_THAT(results[0].message(), HasSubstr("rank=0: worker 2 reported a failure"));
  EXPECT_THAT(results[1].message(), HasSubstr("rank=1: worker 0 reported a failure"));
}

TEST(RingCollectivesMismatchTest, AnotherCountInABroadcastFailsTheRootToo) {
  Ring ring(4);
  std::vector<Bytes> buffers(4, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).Broadcast(buffers[rank].data(), rank == 2 ? 29 : 30, DataType::kFloat32,
                                   0, "w", 10);
  });
  EXPECT_THAT(results[2].message(),
              HasSubstr("rank=2: the chunk from worker 1 (step 0) is for a buffer of 30 "
                        "elements; this rank's has 29"));
  EXPECT_THAT(results[3].message(),
              HasSubstr("rank=3: worker 2 reported a failure: broadcast tag=10 tensor=w rank=2"));
  EXPECT_THAT(results[0].message(), HasSubstr("rank=0: worker 3 reported a failure"));
}

TEST(RingCollectivesMismatchTest, AnotherSegmentSizeFailsEveryRank) {
  Ring ring(3);
  ring.Remake(1, 512, kTimeoutMs);
  std::vector<Bytes> buffers(3, Bytes(4 * 3000));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 3000, DataType::kFloat32,
                                   ReduceOp::kSum, "w", 11);
  });
  EXPECT_THAT(results[1].message(),
              HasSubstr("rank=1: the chunk from worker 0 (step 0, segment 0 of 8) is block 2 "
                        "elements [2000, 2250), expected block 2 elements [2000, 2125): do all "
                        "ranks use the same segment_bytes?"));
  EXPECT_THAT(results[2].message(), HasSubstr("rank=2: the chunk from worker 1"));
  EXPECT_THAT(results[0].message(), HasSubstr("rank=0: worker 2 reported a failure"));
}

// A rank that rejects its own arguments tells the others rather than leaving them to time out.
TEST(RingCollectivesMismatchTest, BadArgumentsOnOneRankFailEveryRank) {
  Ring ring(3);
  std::vector<Bytes> buffers(3, Bytes(4 * 30));
  std::vector<Status> results = RunExpectingFailures(ring, kInvalid, [&](int rank) {
    return ring.at(rank).Broadcast(buffers[rank].data(), 30, DataType::kFloat32,
                                   rank == 1 ? 7 : 0, "w", 12);
  });
  EXPECT_EQ(results[1].message(),
            "broadcast tag=12 tensor=w rank=1: root 7 is not a rank in [0, 3)");
  EXPECT_EQ(results[2].message(),
            "broadcast tag=12 tensor=w rank=2: worker 1 reported a failure: " +
                results[1].message());
  EXPECT_EQ(results[0].message(),
            "broadcast tag=12 tensor=w rank=0: worker 2 reported a failure: " +
                results[1].message());
}

// ---------------------------------------------------------------------------------------------
// Silent and failed peers

// Worker 0 never takes part. Its successor, worker 1, waits for it until its deadline and says
// so; worker 2, which waits for worker 1, hears of it from worker 1 (its own deadline is later,
// so that the test is deterministic) and quotes the root cause.
TEST(RingCollectivesFailureTest, SilentPeerTimesOutNamingIt) {
  Ring ring(3);
  constexpr int64_t kShortMs = 500;
  ring.Remake(1, kTestSegmentBytes, kShortMs);
  ring.Remake(2, kTestSegmentBytes, 20000);
  std::vector<Bytes> buffers(3, Bytes(4 * 100));
  auto started = SteadyClock::now();
  std::vector<Status> results = ring.Run({1, 2}, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 100, DataType::kFloat32,
                                   ReduceOp::kSum, "test.w", 3);
  });
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2 * kShortMs + 1000));
  EXPECT_EQ(results[1].code(), StatusCode::kDeadlineExceeded) << results[1];
  EXPECT_EQ(results[1].message(),
            "allreduce tag=3 tensor=test.w rank=1: no chunk from worker 0 (step 0) within 500 ms");
  EXPECT_EQ(results[2].code(), StatusCode::kDeadlineExceeded) << results[2];
  EXPECT_EQ(results[2].message(),
            "allreduce tag=3 tensor=test.w rank=2: worker 1 reported a failure: " +
                results[1].message());
  EXPECT_EQ(ring.mailbox(1).queued(), 0u);
  EXPECT_EQ(ring.mailbox(2).queued(), 0u);
}

// The same with equal deadlines: worker 2 either times out itself or hears from worker 1 first;
// either way within the deadline, naming worker 1.
TEST(RingCollectivesFailureTest, SilentPeerWithEqualDeadlines) {
  constexpr int64_t kShortMs = 300;
  Ring ring(4, kTestSegmentBytes, kShortMs);
  std::vector<Bytes> buffers(4, Bytes(4 * 5000));
  auto started = SteadyClock::now();
  std::vector<Status> results = ring.Run({0, 1, 2}, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 5000, DataType::kFloat32,
                                   ReduceOp::kSum, "", 4);
  });
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2 * kShortMs + 1000));
  EXPECT_EQ(results[0].message(),
            "allreduce tag=4 rank=0: no chunk from worker 3 (step 0, segment 0 of 5) within "
            "300 ms");
  for (int rank : {1, 2}) {
    EXPECT_EQ(results[rank].code(), StatusCode::kDeadlineExceeded) << results[rank];
    EXPECT_THAT(results[rank].message(), HasSubstr("worker " + std::to_string(rank - 1)));
  }
}

TEST(RingCollectivesFailureTest, SilentBroadcastRootTimesOutNamingIt) {
  constexpr int64_t kShortMs = 300;
  Ring ring(3, kTestSegmentBytes, kShortMs);
  ring.Remake(2, kTestSegmentBytes, 20000);
  std::vector<Bytes> buffers(3, Bytes(4 * 10));
  std::vector<Status> results = ring.Run({1, 2}, [&](int rank) {
    return ring.at(rank).Broadcast(buffers[rank].data(), 10, DataType::kFloat32, 0, "p", 5);
  });
  EXPECT_EQ(results[1].message(),
            "broadcast tag=5 tensor=p rank=1: no chunk from worker 0 (step 0) within 300 ms");
  EXPECT_EQ(results[2].message(),
            "broadcast tag=5 tensor=p rank=2: worker 1 reported a failure: " +
                results[1].message());
}

// Worker 2 never enters. Worker 0, its successor, times out naming it; worker 1 (a later
// deadline) hears of it from worker 0.
TEST(RingCollectivesFailureTest, SilentPeerInABarrier) {
  constexpr int64_t kShortMs = 300;
  Ring ring(3, kTestSegmentBytes, kShortMs);
  ring.Remake(1, kTestSegmentBytes, 20000);
  auto started = SteadyClock::now();
  std::vector<Status> results =
      ring.Run({0, 1}, [&](int rank) { return ring.at(rank).Barrier(6); });
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2 * kShortMs + 1000));
  EXPECT_EQ(results[0].message(),
            "barrier tag=6 rank=0: no chunk from worker 2 (step 0) within 300 ms");
  EXPECT_EQ(results[1].message(),
            "barrier tag=6 rank=1: worker 0 reported a failure: " + results[0].message());
}

// The coordinator's failure notice reaches every survivor's mailbox (worker_main wires it
// through RendezvousClient::SetFailureCallback): all of them fail at once, quoting it. (Worker
// 2's mailbox fails first: otherwise worker 1's abort notice may reach worker 2 before the
// coordinator's does, and worker 2 quotes the same root cause through worker 1.)
TEST(RingCollectivesFailureTest, FailureNoticeWakesEverySurvivorWithTheRootCause) {
  Ring ring(3);
  std::vector<Bytes> buffers(3, Bytes(4 * 100));
  auto started = SteadyClock::now();
  std::thread coordinator([&ring] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int rank : {2, 1}) {
      ring.mailbox(rank).Fail(
          AbortedError("worker 0 (tcp://127.0.0.1:1234) failed: no heartbeat for 10000 ms"));
    }
  });
  std::vector<Status> results = ring.Run({1, 2}, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 100, DataType::kFloat32,
                                   ReduceOp::kSum, "test.w", 4);
  });
  coordinator.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
  for (int rank : {1, 2}) {
    EXPECT_EQ(results[rank].code(), StatusCode::kAborted) << results[rank];
    EXPECT_THAT(results[rank].message(), HasSubstr("allreduce tag=4 tensor=test.w rank=" +
                                                   std::to_string(rank) + ": waiting for worker"));
    EXPECT_THAT(results[rank].message(), HasSubstr("worker 0 (tcp://127.0.0.1:1234) failed"));
  }
}

// Over links: worker 0's process dies (its sockets close) while workers 1 and 2 are in a call.
// Worker 1 fails at once naming it; worker 2 hears of it from worker 1.
TEST(RingCollectivesFailureTest, APeerThatDiesMidCallFailsEverySurvivorNamingIt) {
  if (!kUseLinks) GTEST_SKIP() << "the transport has no connection to lose";
  Ring ring(3);
  std::vector<Bytes> buffers(3, Bytes(4 * 100));
  std::thread dies([&ring] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ring.CloseLinks(0);
  });
  auto started = SteadyClock::now();
  std::vector<Status> results = ring.Run({1, 2}, [&](int rank) {
    return ring.at(rank).AllReduce(buffers[rank].data(), 100, DataType::kFloat32,
                                   ReduceOp::kSum, "test.w", 4);
  });
  dies.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(5000));
  EXPECT_EQ(results[1].code(), StatusCode::kUnavailable) << results[1];
  EXPECT_THAT(results[1].message(),
              AllOf(StartsWith(std::string("allreduce tag=4 tensor=test.w rank=1: waiting for "
                                           "worker 0 (step 0): ") +
                               (kUseShm ? "ring shm from worker 0 (pid "
                                        : "ring link from worker 0 (tcp://127.0.0.1:")),
                    HasSubstr("closed by the peer")));
  EXPECT_EQ(results[2].code(), StatusCode::kUnavailable) << results[2];
  EXPECT_EQ(results[2].message(),
            "allreduce tag=4 tensor=test.w rank=2: worker 1 reported a failure: " +
                results[1].message());
}

// ---------------------------------------------------------------------------------------------
// Options and arguments

TEST(RingCollectivesTest, RejectsOptionsThatCannotWork) {
  Ring ring(2);
  auto error = [&](const std::function<void(RingCollectivesOptions&)>& change) {
    RingCollectivesOptions options = ring.Options(0, kTestSegmentBytes, 1000);
    change(options);
    auto created = RingCollectives::Create(options);
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
    return created.status().message();
  };
  EXPECT_EQ(error([](auto& o) { o.peer_addresses.pop_back(); }),
            "ring collectives: peer_addresses holds 1 addresses for a world_size of 2");
  EXPECT_EQ(error([](auto& o) { o.rank = 2; }), "ring collectives: rank 2 is not in [0, 2)");
  EXPECT_EQ(error([](auto& o) { o.world_size = 0; }),
            "ring collectives: world_size 0 is not at least 1");
  EXPECT_EQ(error([](auto& o) { o.transport = nullptr; }), "ring collectives: transport is null");
  EXPECT_EQ(error([](auto& o) { o.mailbox = nullptr; }), "ring collectives: mailbox is null");
  EXPECT_EQ(error([](auto& o) { o.timeout_ms = 0; }),
            "ring collectives: timeout_ms 0 is not positive");
  EXPECT_EQ(error([](auto& o) { o.segment_bytes = 0; }),
            "ring collectives: segment_bytes 0 is not in [1, 67108864]");
  // A world of one needs no transport.
  RingCollectivesOptions alone;
  alone.peer_addresses = {"tcp://127.0.0.1:1"};
  EXPECT_TRUE(RingCollectives::Create(alone).ok());
}

TEST(RingCollectivesTest, RejectsBadArguments) {
  RingCollectivesOptions options;
  options.peer_addresses = {"tcp://127.0.0.1:1"};
  auto alone = RingCollectives::Create(options);
  ASSERT_TRUE(alone.ok()) << alone.status();
  RingCollectives& c = **alone;
  std::vector<float> buffer(8);
  EXPECT_EQ(c.AllReduce(nullptr, 3, DataType::kFloat32, ReduceOp::kSum, "w", 1).message(),
            "allreduce tag=1 tensor=w rank=0: data is null but should hold 3 elements");
  EXPECT_TRUE(c.AllReduce(nullptr, 0, DataType::kFloat32, ReduceOp::kSum, "w", 1).ok());
  EXPECT_EQ(c.AllReduce(buffer.data(), 8, static_cast<DataType>(9), ReduceOp::kSum, "", 2)
                .message(),
            "allreduce tag=2 rank=0: unknown dtype 9");
  EXPECT_EQ(c.ReduceScatter(buffer.data(), buffer.data(), 8, DataType::kFloat32,
                            static_cast<ReduceOp>(7), "", 3)
                .message(),
            "reducescatter tag=3 rank=0: unknown reduce op 7");
  EXPECT_EQ(c.Broadcast(buffer.data(), 8, DataType::kFloat32, 1, "", 4).message(),
            "broadcast tag=4 rank=0: root 1 is not a rank in [0, 1)");
  EXPECT_EQ(c.AllGather(buffer.data() + 1, buffer.data(), 4, DataType::kFloat32, "", 5).message(),
            "allgather tag=5 rank=0: input and output overlap, but not in place (this rank's "
            "partition of 4 elements starts at element 0 of the whole buffer)");
  // In place is fine, and a world of one copies.
  EXPECT_TRUE(c.AllGather(buffer.data(), buffer.data(), 8, DataType::kFloat32, "", 6).ok());
  std::vector<float> in = {1, 2, 3}, out(3);
  EXPECT_TRUE(c.ReduceScatter(in.data(), out.data(), 3, DataType::kFloat32, ReduceOp::kAverage,
                              "", 7).ok());
  EXPECT_EQ(out, in);
}

}  // namespace
}  // namespace tessera::worker
