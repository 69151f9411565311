// TestRing: W ranks of RingCollectives in one process, each wired as tessera-worker wires its
// own (an RPC endpoint, a FailureBus, a CollectiveMailbox for ring frames, the channel that
// ConnectRingChannel sets up), for the tests of the ring (ring_collectives_test.cc over every
// channel, ring_faults_test.cc over in-process transports that lose, delay and repeat frames).
// Plus the naive reference the tests compare results with.
//
//   TestRingOptions options;
//   options.channel = "links";
//   TestRing ring(3, options);
//   std::vector<Status> results = ring.RunAll([&](int rank) {
//     return ring.at(rank).AllReduce(buffers[rank].data(), n, dtype, op, "w", ring.NextTag());
//   });
//
// Thread-safety: the accessors may be called from the threads Run starts; Remake and
// CloseChannel only while no call runs on that rank.
#ifndef TESSERA_WORKER_COLLECTIVES_RING_TEST_HARNESS_H_
#define TESSERA_WORKER_COLLECTIVES_RING_TEST_HARNESS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/data_type.h"
#include "common/base/failure_bus.h"
#include "common/base/status.h"
#include "common/messages/ring_frame.h"
#include "common/transport/faulty/faulty_transport.h"
#include "common/transport/rpc_endpoint.h"
#include "worker/collectives/channel/ring_channel.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/collectives/ring_collectives.h"

namespace tessera::worker {

using Bytes = std::vector<uint8_t>;

// Small segments, so that even short test buffers are cut into several segments per block and
// the pipeline has something to overlap.
inline constexpr size_t kTestSegmentBytes = 1024;
inline constexpr int64_t kTestTimeoutMs = 30000;

// Every dtype and reduce op collectives.h defines, for the suites that cover them all.
inline constexpr DataType kAllDTypes[] = {
    DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
    DataType::kInt8,    DataType::kUInt8,   DataType::kInt32,   DataType::kInt64,
    DataType::kBool};
inline constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax,
                                       ReduceOp::kMin, ReduceOp::kProduct};

struct TestRingOptions {
  // ConnectRingChannel's kind: zmq, links, shm or auto; links_encrypted: links under
  // Credentials kEncrypt (AEAD records, ring_link_cipher.h); or mixed: auto where worker 1 cannot
  // make its shared-memory segment (it asks for far more than /dev/shm holds), so that the
  // hops to and from it use links and the others shared memory, as across hosts. links, auto
  // and mixed need real sockets (in_process false).
  std::string channel = "zmq";
  // Even ranks listen on 127.0.0.1 and odd ones on 127.0.0.2, as if on two hosts: the ring's
  // order is then not the ranks' (RingOrder: 0, 2, 4, ..., 1, 3, ...). Needs real sockets.
  bool interleaved_hosts = false;
  // InProcessTransport endpoints instead of ZeroMQ ones on 127.0.0.1.
  bool in_process = false;
  size_t segment_bytes = kTestSegmentBytes;
  // RingCollectivesOptions::one_shot_max_bytes: by default all-reduces of up to one segment
  // (kTestSegmentBytes) are one-shot, so the suites' short and long buffers run both.
  size_t one_shot_max_bytes = kDefaultOneShotMaxBytes;
  int64_t timeout_ms = kTestTimeoutMs;
  // By rank: the faults a FaultyTransport around that rank's transport injects into what the
  // rank sends (ring frames and setup alike). Ranks beyond the vector's end send faithfully.
  std::vector<std::optional<FaultOptions>> faults;
};

class TestRing {
 public:
  // Sets up every rank's channel at once (on a thread each) and its RingCollectives; a failure
  // is a test failure (ADD_FAILURE), after which ok() is false.
  TestRing(int world, TestRingOptions options);
  ~TestRing();
  TestRing(const TestRing&) = delete;
  TestRing& operator=(const TestRing&) = delete;

  bool ok() const { return ok_; }
  int world() const { return static_cast<int>(ranks_.size()); }
  Collectives& at(int rank) { return *ranks_[rank].collectives; }
  RingChannel& channel(int rank) { return *ranks_[rank].channel; }
  // What ConnectRingChannel said it set up.
  const std::string& description(int rank) const { return ranks_[rank].description; }
  CollectiveMailbox& mailbox(int rank) { return *ranks_[rank].mailbox; }
  FailureBus& failures(int rank) { return *ranks_[rank].failures; }
  // Null for a rank without faults.
  FaultyTransport* faults(int rank) { return ranks_[rank].faulty; }
  const std::string& address(int rank) const { return ranks_[rank].address; }
  // What rank's channel setup and frames travel over (the FaultyTransport, if any).
  Transport& transport(int rank) { return ranks_[rank].endpoint->transport(); }

  // The options rank's RingCollectives was made with, with another segment size and timeout.
  RingCollectivesOptions Options(int rank, size_t segment_bytes, int64_t timeout_ms) const;
  // Replaces rank's collectives (another timeout or segment size for one rank).
  void Remake(int rank, size_t segment_bytes, int64_t timeout_ms);
  // Closes rank's channel, as when its process dies. REQUIRES: rank makes no call any more.
  void CloseChannel(int rank);

  // Ring frames each rank's endpoint delivered to its mailbox, and the largest payload among
  // them (the zmq channel's frames; the direct channels' pass elsewhere).
  uint64_t frames_delivered(int rank) const { return ranks_[rank].stats->frames.load(); }
  uint64_t max_payload_bytes(int rank) const {
    return ranks_[rank].stats->max_payload_bytes.load();
  }

  uint64_t NextTag() { return ++last_tag_; }
  std::vector<int> AllRanks() const;

  // Runs body(rank) for each of `ranks` at once, each on its own thread; the results by rank
  // (OK for ranks not run).
  std::vector<Status> Run(const std::vector<int>& ranks, const std::function<Status(int)>& body);
  std::vector<Status> RunAll(const std::function<Status(int)>& body);

 private:
  struct Stats {
    std::atomic<uint64_t> frames{0};
    std::atomic<uint64_t> max_payload_bytes{0};
  };
  struct Rank {
    std::shared_ptr<Stats> stats = std::make_shared<Stats>();
    std::unique_ptr<RpcEndpoint> endpoint;
    FaultyTransport* faulty = nullptr;  // owned by endpoint
    std::string address;
    std::shared_ptr<FailureBus> failures;
    std::shared_ptr<CollectiveMailbox> mailbox;
    std::shared_ptr<RingChannel> channel;
    std::vector<int> order;  // the ring's (ConnectedRingChannel::order)
    std::string description;
    std::unique_ptr<RingCollectives> collectives;
  };

  std::unique_ptr<RingCollectives> Make(int rank, size_t segment_bytes, int64_t timeout_ms);

  const TestRingOptions options_;
  std::vector<Rank> ranks_;
  bool ok_ = true;
  uint64_t last_tag_ = 100;
};

// ADD_FAILURE for every rank of `ranks` whose result is not OK; whether all were.
bool AllOk(const std::vector<Status>& results, const std::vector<int>& ranks);
// ADD_FAILURE for every rank whose channel or mailbox still keeps frames; whether none does.
bool NothingKept(TestRing& ring);

// ---------------------------------------------------------------------------------------------
// Values and the naive reference

// Element i of a float32, float16 or bfloat16 buffer, as a float, and back.
float Get(DataType dtype, const uint8_t* buffer, size_t i);
void Set(DataType dtype, uint8_t* buffer, size_t i, float value);

// Each of `world` ranks' `count` input elements, deterministic in `salt`:
//   float32             integers in [-20, 20], so that sums are exact in any order and can be
//                       compared bit for bit;
//   float64             the same plus a multiple of 2^-30 below 2^-20: sums are still exact in
//                       double, but float32 would round every element;
//   float16, bfloat16   multiples of 2^-8 in (-1, 1);
//   integers            any value (bytes that depend on rank, element and salt): sums and
//                       products overflow;
//   bool                0 or 1, three times in four 1 (so that an and over a few ranks is
//                       often 1 too).
std::vector<Bytes> Inputs(DataType dtype, int world, size_t count, uint64_t salt);

// Checks got[j] (j = 0 .. n-1) against the reduction over ranks of inputs[q][begin + j] as
// collectives.h defines it for the dtype and op: exactly for integers, bool, max, min and the
// sums and averages of float32 and float64 (of Inputs' values), within the stated tolerance
// (ring_test_harness.cc) for products and 16-bit sums; ADD_FAILURE naming `what` otherwise.
bool MatchesReference(DataType dtype, ReduceOp op, const std::vector<Bytes>& inputs, size_t begin,
                      size_t n, const uint8_t* got, const std::string& what);

// 0, 1, W-1, W, W+1 and a few odd larger lengths, sorted, without repeats.
std::vector<size_t> AwkwardLengths(int world);

// "97 x float16, sum".
std::string Describe(size_t count, DataType dtype, ReduceOp op);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_RING_TEST_HARNESS_H_
