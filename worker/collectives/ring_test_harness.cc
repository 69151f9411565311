#include "worker/collectives/ring_test_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "common/security/credentials.h"
#include "common/transport/inproc/inproc_transport.h"
#include "common/transport/zmq/zmq_endpoint.h"
#include "worker/collectives/half_float.h"
#include "worker/collectives/ring_channel_setup.h"

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
      if (options_.interleaved_hosts && rank % 2 == 1) zmq.bind_host = "127.0.0.2";
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
      setup.kind = options_.channel == "mixed"             ? "auto"
                   : options_.channel == "links_encrypted" ? "links"
                                                           : options_.channel;
      if (options_.channel == "links_encrypted") {
        KeyBytes key;
        key.fill(0x42);
        setup.credentials = Credentials::Encrypt(JobKey::FromBytes(key));
      }
      setup.rank = rank;
      setup.world_size = world;
      setup.peer_addresses = addresses;
      setup.transport = &r.endpoint->transport();
      setup.mailbox = r.mailbox;
      setup.failures = r.failures;
      setup.timeout_ms = 10000;
      setup.segment_bytes = options_.segment_bytes;
      if (options_.channel == "mixed" && rank == 1) setup.segment_bytes = size_t{1} << 49;
      setup.links_spin_us = 20;  // exercises the spinning wait too
      StatusOr<ConnectedRingChannel> connected = ConnectRingChannel(setup);
      if (!connected.ok()) {
        results[rank] = connected.status();
        return;
      }
      r.channel = connected->channel;
      r.description = connected->description;
      r.order = connected->order;
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
  options.ring_order = ranks_[rank].order;
  options.timeout_ms = timeout_ms;
  options.segment_bytes = segment_bytes;
  options.one_shot_max_bytes = options_.one_shot_max_bytes;
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

uint64_t Hash(int rank, size_t i, uint64_t salt) {
  return Mix(salt * 1000003 + static_cast<uint64_t>(rank) * 7919 + i);
}

double InputValue(DataType dtype, int rank, size_t i, uint64_t salt) {
  const uint64_t h = Hash(rank, i, salt);
  const double integer = static_cast<double>(static_cast<int>(h % 41) - 20);
  switch (dtype) {
    case DataType::kFloat32: return integer;
    case DataType::kFloat64: return integer + std::ldexp(static_cast<double>((h >> 8) % 1024), -30);
    default: return static_cast<double>(static_cast<int>(h % 511) - 255) / 256.0;
  }
}

// Element i of a floating-point buffer, as a double (exactly).
double Real(DataType dtype, const uint8_t* buffer, size_t i) {
  if (dtype == DataType::kFloat64) {
    double value;
    std::memcpy(&value, buffer + 8 * i, 8);
    return value;
  }
  return Get(dtype, buffer, i);
}

// Element i of an integer or bool buffer, as an int64 (exactly).
int64_t Integer(DataType dtype, const uint8_t* buffer, size_t i) {
  switch (dtype) {
    case DataType::kInt8: return static_cast<int8_t>(buffer[i]);
    case DataType::kUInt8:
    case DataType::kBool: return buffer[i];
    case DataType::kInt32: {
      int32_t value;
      std::memcpy(&value, buffer + 4 * i, 4);
      return value;
    }
    case DataType::kInt64: {
      int64_t value;
      std::memcpy(&value, buffer + 8 * i, 8);
      return value;
    }
    default:
      ADD_FAILURE() << "Integer of " << DataTypeName(dtype);
      return 0;
  }
}

// `value` modulo 2^bits of `dtype`, read as `dtype` reads it (two's complement).
int64_t Wrapped(DataType dtype, uint64_t value) {
  switch (dtype) {
    case DataType::kInt8: return static_cast<int8_t>(static_cast<uint8_t>(value));
    case DataType::kUInt8: return static_cast<uint8_t>(value);
    case DataType::kInt32: return static_cast<int32_t>(static_cast<uint32_t>(value));
    default: return static_cast<int64_t>(value);
  }
}

// Integers: sums and products modulo 2^bits (computed modulo 2^64, which 2^bits divides); bool:
// sum and max are or, product and min are and. Exact.
bool MatchesIntegers(DataType dtype, ReduceOp op, const std::vector<Bytes>& inputs,
                     size_t begin, size_t n, const uint8_t* got, const std::string& what) {
  for (size_t j = 0; j < n; ++j) {
    uint64_t sum = 0, product = 1;
    int64_t max = std::numeric_limits<int64_t>::min();
    int64_t min = std::numeric_limits<int64_t>::max();
    for (const Bytes& input : inputs) {
      const int64_t x = Integer(dtype, input.data(), begin + j);
      sum += static_cast<uint64_t>(x);
      product *= static_cast<uint64_t>(x);
      max = std::max(max, x);
      min = std::min(min, x);
    }
    int64_t want = 0;
    if (dtype == DataType::kBool) {
      const bool any = max != 0, all = min != 0;
      want = op == ReduceOp::kSum || op == ReduceOp::kMax ? any : all;
    } else {
      switch (op) {
        case ReduceOp::kSum: want = Wrapped(dtype, sum); break;
        case ReduceOp::kProduct: want = Wrapped(dtype, product); break;
        case ReduceOp::kMax: want = max; break;
        case ReduceOp::kMin: want = min; break;
        case ReduceOp::kAverage:
          ADD_FAILURE() << what << ": no average of " << DataTypeName(dtype);
          return false;
      }
    }
    const int64_t value = Integer(dtype, got, j);
    if (value != want) {
      ADD_FAILURE() << what << ": element " << begin + j << " is " << value << ", expected "
                    << want;
      return false;
    }
  }
  return true;
}

// Half an ulp, relative: what one rounding to `dtype` may change a value by at most.
double UnitRoundoff(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat64: return std::ldexp(1.0, -53);
    case DataType::kFloat16: return std::ldexp(1.0, -11);
    case DataType::kBFloat16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);  // float32
  }
}

// The stated tolerance. Max and min are exact in every dtype; so are float32 and float64 sums
// and averages (Inputs' values sum exactly in any order; an average divides once, as the
// reference does).
// float16 / bfloat16 sums: every partial result is rounded to 16 bits once per ring step, at
// most W times in all, each time by at most u (half an ulp, relative) of a value no larger than
// sum|x_q|; so |got - exact| <= W * u * sum|x_q| for a sum, that divided by W for an average
// (plus float32's own rounding of the division).
// Products, every dtype: each of at most W roundings multiplies the result by some (1 + d),
// |d| <= u, so |got - exact| <= ((1 + u)^W - 1) |exact| (with a margin for the reference's own
// rounding in long double); float16 products of inputs below 1 may underflow, which costs at most
// half the smallest subnormal (2^-25) per step, and later factors below 1 only shrink it.
double Tolerance(DataType dtype, ReduceOp op, int world, double sum_of_magnitudes, double want) {
  if (op == ReduceOp::kMax || op == ReduceOp::kMin) return 0;
  const double u = UnitRoundoff(dtype);
  if (op == ReduceOp::kProduct) {
    const double relative = std::expm1(world * std::log1p(u)) * (1 + std::ldexp(1.0, -8));
    const double underflow = dtype == DataType::kFloat16 ? 2 * world * std::ldexp(1.0, -25) : 0;
    return relative * std::fabs(want) + underflow;
  }
  if (dtype == DataType::kFloat32 || dtype == DataType::kFloat64) return 0;
  const double bound = world * u * sum_of_magnitudes;
  return op == ReduceOp::kAverage ? bound / world * (1 + std::ldexp(1.0, -20)) : bound;
}

bool MatchesReals(DataType dtype, ReduceOp op, const std::vector<Bytes>& inputs, size_t begin,
                  size_t n, const uint8_t* got, const std::string& what) {
  const int world = static_cast<int>(inputs.size());
  for (size_t j = 0; j < n; ++j) {
    double sum = 0, magnitudes = 0;
    long double product = 1;
    double max = -std::numeric_limits<double>::infinity();
    double min = std::numeric_limits<double>::infinity();
    for (int q = 0; q < world; ++q) {
      const double x = Real(dtype, inputs[q].data(), begin + j);
      sum += x;
      magnitudes += std::fabs(x);
      product *= x;
      max = std::max(max, x);
      min = std::min(min, x);
    }
    double want = sum;
    switch (op) {
      case ReduceOp::kSum: break;
      case ReduceOp::kMax: want = max; break;
      case ReduceOp::kMin: want = min; break;
      case ReduceOp::kProduct: want = static_cast<double>(product); break;
      case ReduceOp::kAverage:
        want = dtype == DataType::kFloat32
                   ? static_cast<double>(static_cast<float>(sum) / static_cast<float>(world))
                   : sum / world;
        break;
    }
    const double value = Real(dtype, got, j);
    const double tolerance = Tolerance(dtype, op, world, magnitudes, want);
    if (!(std::fabs(value - want) <= tolerance)) {
      ADD_FAILURE() << what << ": element " << begin + j << " is " << value << ", expected "
                    << want << " within " << tolerance;
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<Bytes> Inputs(DataType dtype, int world, size_t count, uint64_t salt) {
  const size_t element_bytes = DataTypeSize(dtype);
  std::vector<Bytes> inputs(world, Bytes(count * element_bytes));
  for (int rank = 0; rank < world; ++rank) {
    uint8_t* input = inputs[rank].data();
    if (dtype == DataType::kFloat64) {
      for (size_t i = 0; i < count; ++i) {
        const double value = InputValue(dtype, rank, i, salt);
        std::memcpy(input + 8 * i, &value, 8);
      }
    } else if (IsFloatingPoint(dtype)) {
      for (size_t i = 0; i < count; ++i) {
        Set(dtype, input, i, static_cast<float>(InputValue(dtype, rank, i, salt)));
      }
    } else if (dtype == DataType::kBool) {
      for (size_t i = 0; i < count; ++i) input[i] = Hash(rank, i, salt) % 4 != 0 ? 1 : 0;
    } else {
      for (size_t i = 0; i < inputs[rank].size(); ++i) {
        input[i] = static_cast<uint8_t>(Hash(rank, i, salt));
      }
    }
  }
  return inputs;
}

bool MatchesReference(DataType dtype, ReduceOp op, const std::vector<Bytes>& inputs, size_t begin,
                      size_t n, const uint8_t* got, const std::string& what) {
  return IsFloatingPoint(dtype) ? MatchesReals(dtype, op, inputs, begin, n, got, what)
                                : MatchesIntegers(dtype, op, inputs, begin, n, got, what);
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
