#include "worker/collectives/ring_test_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "common/transport/inproc/inproc_transport.h"
#include "common/transport/zmq/zmq_endpoint.h"
#include "worker/collectives/channel/ring_channel_setup.h"
#include "worker/collectives/half_float.h"

namespace tessera::worker {

// ---------------------------------------------------------------------------------------------
// TestRing

TestRing::TestRing(int world, TestRingOptions options)
    : options_(std::move(options)), ranks_(static_cast<size_t>(world)) {
  // One network per ring, so that rings of concurrent tests never meet.
  const auto network = std::make_shared<InProcessNetwork>();
  std::vector<std::string> addresses;
  for (int rank = 0; rank < world; ++rank) {
    Rank& r = ranks_[rank];
    const std::optional<FaultOptions> faults =
        static_cast<size_t>(rank) < options_.faults.size() ? options_.faults[rank]
                                                           : std::nullopt;
    std::unique_ptr<Transport> transport;
    if (options_.in_process) {
      auto created = InProcessTransport::Create(network, "worker" + std::to_string(rank));
      EXPECT_TRUE(created.ok()) << created.status();
      if (created.ok()) transport = std::move(created).value();
    } else {
      ZmqTransportOptions zmq;
      zmq.role = Role::kWorker;
      zmq.rank = rank;
      auto created = ZmqTransport::Create(zmq, nullptr);
      EXPECT_TRUE(created.ok()) << created.status();
      if (created.ok()) transport = std::move(created).value();
    }
    if (transport == nullptr) {
      ok_ = false;
      return;
    }
    if (faults.has_value()) {
      auto faulty = std::make_unique<FaultyTransport>(std::move(transport), *faults);
      r.faulty = faulty.get();
      transport = std::move(faulty);
    }
    auto endpoint = RpcEndpoint::Start(std::move(transport), Role::kWorker, rank, nullptr);
    EXPECT_TRUE(endpoint.ok()) << endpoint.status();
    if (!endpoint.ok()) {
      ok_ = false;
      return;
    }
    r.endpoint = std::move(endpoint).value();
    r.address = r.endpoint->address();
    r.failures = std::make_shared<FailureBus>();
    r.mailbox = std::make_shared<CollectiveMailbox>(r.failures);
    MessageHandler deliver = CollectiveMailbox::Handler(r.mailbox);
    r.endpoint->SetHandler(MessageType::kRingFrame,
                           [deliver, stats = r.stats](Envelope envelope) {
                             if (const RingFrame* frame = envelope.As<RingFrame>()) {
                               const uint64_t bytes = frame->data.size();
                               stats->frames.fetch_add(1);
                               uint64_t seen = stats->max_payload_bytes.load();
                               while (bytes > seen &&
                                      !stats->max_payload_bytes.compare_exchange_weak(seen,
                                                                                      bytes)) {
                               }
                             }
                             deliver(std::move(envelope));
                           });
    addresses.push_back(r.address);
  }
  // Every rank sets up its channel at once, as the workers of a job do.
  std::vector<std::thread> threads;
  std::vector<Status> results(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([this, rank, world, &addresses, &results] {
      Rank& r = ranks_[rank];
      RingChannelSetupOptions setup;
      setup.kind = options_.channel;
      setup.rank = rank;
      setup.world_size = world;
      setup.peer_addresses = addresses;
      setup.transport = &r.endpoint->transport();
      setup.mailbox = r.mailbox;
      setup.failures = r.failures;
      setup.timeout_ms = 10000;
      setup.segment_bytes = options_.segment_bytes;
      setup.links_spin_us = 20;  // exercises the spinning wait too
      StatusOr<ConnectedRingChannel> connected = ConnectRingChannel(setup);
      if (!connected.ok()) {
        results[rank] = connected.status();
        return;
      }
      r.channel = connected->channel;
      r.description = connected->description;
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < world; ++rank) {
    if (!results[rank].ok()) {
      ADD_FAILURE() << "rank " << rank << ": " << results[rank];
      ok_ = false;
    }
  }
  if (!ok_) return;
  for (int rank = 0; rank < world; ++rank) {
    ranks_[rank].collectives = Make(rank, options_.segment_bytes, options_.timeout_ms);
  }
}

TestRing::~TestRing() {
  for (Rank& r : ranks_) r.collectives.reset();
  // The channels refer to the transports; the endpoints' handlers to the mailboxes and stats.
  for (Rank& r : ranks_) r.channel.reset();
  for (Rank& r : ranks_) {
    if (r.endpoint != nullptr) r.endpoint->Shutdown();
  }
}

RingCollectivesOptions TestRing::Options(int rank, size_t segment_bytes,
                                         int64_t timeout_ms) const {
  RingCollectivesOptions options;
  options.rank = rank;
  options.world_size = world();
  options.channel = ranks_[rank].channel;
  options.timeout_ms = timeout_ms;
  options.segment_bytes = segment_bytes;
  return options;
}

std::unique_ptr<RingCollectives> TestRing::Make(int rank, size_t segment_bytes,
                                                int64_t timeout_ms) {
  auto collectives = RingCollectives::Create(Options(rank, segment_bytes, timeout_ms));
  EXPECT_TRUE(collectives.ok()) << collectives.status();
  if (!collectives.ok()) {
    ok_ = false;
    return nullptr;
  }
  return std::move(collectives).value();
}

void TestRing::Remake(int rank, size_t segment_bytes, int64_t timeout_ms) {
  ranks_[rank].collectives = Make(rank, segment_bytes, timeout_ms);
}

void TestRing::CloseChannel(int rank) {
  ranks_[rank].collectives.reset();
  ranks_[rank].channel.reset();
}

std::vector<int> TestRing::AllRanks() const {
  std::vector<int> ranks(ranks_.size());
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
  return ranks;
}

std::vector<Status> TestRing::Run(const std::vector<int>& ranks,
                                  const std::function<Status(int)>& body) {
  std::vector<Status> results(ranks_.size());
  std::vector<std::thread> threads;
  for (int rank : ranks) {
    threads.emplace_back([&results, &body, rank] { results[rank] = body(rank); });
  }
  for (auto& thread : threads) thread.join();
  return results;
}

std::vector<Status> TestRing::RunAll(const std::function<Status(int)>& body) {
  return Run(AllRanks(), body);
}

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

bool NothingKept(TestRing& ring) {
  bool none = true;
  for (int rank = 0; rank < ring.world(); ++rank) {
    if (ring.channel(rank).kept() != 0) {
      ADD_FAILURE() << "rank " << rank << "'s channel keeps " << ring.channel(rank).kept()
                    << " frames";
      none = false;
    }
    if (ring.mailbox(rank).queued() != 0) {
      ADD_FAILURE() << "rank " << rank << " has " << ring.mailbox(rank).queued()
                    << " frames left in its mailbox";
      none = false;
    }
  }
  return none;
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
    default:
      ADD_FAILURE() << "Get of " << DataTypeName(dtype);
      return 0;
  }
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
    default: ADD_FAILURE() << "Set of " << DataTypeName(dtype);
  }
}

namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser: deterministic, well spread
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float InputValue(DataType dtype, int rank, size_t i, uint64_t salt) {
  const uint64_t h = Mix(salt * 1000003 + static_cast<uint64_t>(rank) * 7919 + i);
  if (dtype == DataType::kFloat32) return static_cast<float>(static_cast<int>(h % 41) - 20);
  return static_cast<float>(static_cast<int>(h % 511) - 255) / 256.0f;
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

}  // namespace

std::vector<Bytes> Inputs(DataType dtype, int world, size_t count, uint64_t salt) {
  const size_t element_bytes = DataTypeSize(dtype);
  std::vector<Bytes> inputs(world, Bytes(count * element_bytes));
  for (int rank = 0; rank < world; ++rank) {
    if (IsFloatingPoint(dtype)) {
      for (size_t i = 0; i < count; ++i) {
        Set(dtype, inputs[rank].data(), i, InputValue(dtype, rank, i, salt));
      }
    } else {
      for (size_t i = 0; i < inputs[rank].size(); ++i) {
        inputs[rank][i] = static_cast<uint8_t>(Mix(salt * 1000003 + rank * 7919 + i));
      }
    }
  }
  return inputs;
}

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

std::string Describe(size_t count, DataType dtype, ReduceOp op) {
  return std::to_string(count) + " x " + std::string(DataTypeName(dtype)) + ", " +
         std::string(ReduceOpName(op));
}

}  // namespace tessera::worker
