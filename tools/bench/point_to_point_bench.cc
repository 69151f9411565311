#include "tools/bench/point_to_point_bench.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "common/base/deadline.h"
#include "common/base/failure_bus.h"
#include "common/base/role.h"
#include "common/security/credentials.h"
#include "common/security/job_key.h"
#include "common/transport/rpc_endpoint.h"
#include "common/transport/zmq/zmq_endpoint.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/collectives/communicator.h"

namespace tessera::tools {
namespace {

using worker::CollectiveMailbox;
using worker::Communicator;
using worker::CommunicatorOptions;

constexpr char kBench[] = "groups_p2p";
constexpr uint32_t kTag = 1;  // every message of a pair: Send / Recv keep them in order

// One side of a pair of processes: a message of `bytes` each way.
class Pair {
 public:
  virtual ~Pair() = default;
  virtual Status Send(const void* data, size_t bytes) = 0;
  virtual Status Recv(void* data, size_t bytes) = 0;
};

// Writes `text` to `path` whole (the peer polls for the name, and must not read half of it).
Status Publish(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << text;
    if (!out.flush()) return UnavailableError("writing " + temporary + " failed");
  }
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    return UnavailableError("rename " + temporary + ": " + std::strerror(errno));
  }
  return OkStatus();
}

// The text of `path` once the peer has published it.
StatusOr<std::string> AwaitPublished(const std::string& path, const Deadline& deadline) {
  while (true) {
    std::ifstream in(path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      return text.str();
    }
    if (deadline.Expired()) return DeadlineExceededError("the peer never published " + path);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// tessera: the world of two, wired as tessera-worker wires its own (communicator_test.cc).
class TesseraPair final : public Pair {
 public:
  static StatusOr<std::unique_ptr<TesseraPair>> Connect(const PointToPointPeerFlags& flags) {
    auto pair = std::unique_ptr<TesseraPair>(new TesseraPair(flags.rank));
    const Deadline deadline = Deadline::AfterMillis(flags.timeout_ms);
    ASSIGN_OR_RETURN(JobKey key, ReadKeyFile(flags.directory + "/job.key"));
    ZmqTransportOptions zmq;
    zmq.role = Role::kWorker;
    zmq.rank = flags.rank;
    zmq.credentials = Credentials::Authenticate(key);
    ASSIGN_OR_RETURN(pair->endpoint_, StartZmqEndpoint(zmq, nullptr));
    pair->failures_ = std::make_shared<FailureBus>();
    pair->mailbox_ = std::make_shared<CollectiveMailbox>(pair->failures_);
    pair->endpoint_->SetHandler(MessageType::kRingFrame,
                                CollectiveMailbox::Handler(pair->mailbox_));
    auto address_file = [&](int rank) {
      return flags.directory + "/tessera-" + std::to_string(rank) + ".address";
    };
    RETURN_IF_ERROR(Publish(address_file(flags.rank), pair->endpoint_->address()));
    CommunicatorOptions options;
    options.rank = flags.rank;
    options.world_size = 2;
    for (int rank = 0; rank < 2; ++rank) {
      ASSIGN_OR_RETURN(std::string address, AwaitPublished(address_file(rank), deadline));
      options.peer_addresses.push_back(address);
    }
    options.transport = &pair->endpoint_->transport();
    options.mailbox = pair->mailbox_;
    options.failures = pair->failures_;
    options.timeout_ms = flags.timeout_ms;
    options.credentials = zmq.credentials;
    ASSIGN_OR_RETURN(pair->world_, Communicator::Connect(options));
    return pair;
  }

  Status Send(const void* data, size_t bytes) override {
    return world_->Send(data, bytes, 1 - rank_, kTag, "ping-pong");
  }
  Status Recv(void* data, size_t bytes) override {
    return world_->Recv(data, bytes, 1 - rank_, kTag, "ping-pong");
  }

 private:
  explicit TesseraPair(int rank) : rank_(rank) {}

  const int rank_;
  // Declared in the order they are made, so that they go in reverse: the communicator first.
  std::unique_ptr<RpcEndpoint> endpoint_;
  std::shared_ptr<FailureBus> failures_;
  std::shared_ptr<CollectiveMailbox> mailbox_;
  std::unique_ptr<Communicator> world_;
};

// zmq: a PAIR socket; rank 0 binds, rank 1 connects to the address it published.
class ZmqPair final : public Pair {
 public:
  static StatusOr<std::unique_ptr<ZmqPair>> Connect(const PointToPointPeerFlags& flags) {
    auto pair = std::unique_ptr<ZmqPair>(new ZmqPair());
    zmq::socket_t& socket = pair->socket_;
    socket.set(zmq::sockopt::linger, kLingerMs);  // rank 0's last word must leave
    socket.set(zmq::sockopt::rcvtimeo, static_cast<int>(flags.timeout_ms));
    socket.set(zmq::sockopt::sndtimeo, static_cast<int>(flags.timeout_ms));
    const std::string address_file = flags.directory + "/zmq.address";
    if (flags.rank == 0) {
      socket.bind("tcp://127.0.0.1:*");
      RETURN_IF_ERROR(Publish(address_file, socket.get(zmq::sockopt::last_endpoint)));
    } else {
      ASSIGN_OR_RETURN(std::string address,
                       AwaitPublished(address_file, Deadline::AfterMillis(flags.timeout_ms)));
      socket.connect(address);
    }
    return pair;
  }

  Status Send(const void* data, size_t bytes) override {
    if (!socket_.send(zmq::const_buffer(data, bytes), zmq::send_flags::none)) {
      return DeadlineExceededError("zmq send of " + std::to_string(bytes) + " bytes timed out");
    }
    return OkStatus();
  }
  Status Recv(void* data, size_t bytes) override {
    const zmq::recv_buffer_result_t got = socket_.recv(zmq::mutable_buffer(data, bytes));
    if (!got) return DeadlineExceededError("zmq recv timed out");
    if (got->untruncated_size != bytes) {
      return DataLossError("zmq recv: " + std::to_string(got->untruncated_size) +
                           " bytes, expected " + std::to_string(bytes));
    }
    return OkStatus();
  }

 private:
  static constexpr int kLingerMs = 5000;

  ZmqPair() : context_(1), socket_(context_, zmq::socket_type::pair) {}

  zmq::context_t context_;
  zmq::socket_t socket_;
};

// shm: a shared file mapping holding one slot per direction (slot r: rank r's messages). A
// sequence word says how many messages the slot has held; the receiver spins on it. In a
// ping-pong the sender never overwrites a message not yet copied out: the reply comes after.
class ShmPair final : public Pair {
 public:
  static StatusOr<std::unique_ptr<ShmPair>> Connect(const PointToPointPeerFlags& flags) {
    const std::string path = flags.directory + "/shm.region";
    const size_t slot_bytes = kHeaderBytes + (flags.latency_bytes + 63) / 64 * 64;
    const size_t region_bytes = 2 * slot_bytes;
    if (flags.rank == 0) {
      // Made whole under another name, then renamed: the peer maps only a sized file.
      const std::string temporary = path + ".tmp";
      const int fd = open(temporary.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd < 0) return UnavailableError("open " + temporary + ": " + std::strerror(errno));
      const bool sized = ftruncate(fd, static_cast<off_t>(region_bytes)) == 0;
      close(fd);
      if (!sized || rename(temporary.c_str(), path.c_str()) != 0) {
        return UnavailableError("making " + path + ": " + std::strerror(errno));
      }
    } else {
      RETURN_IF_ERROR(AwaitPublished(path, Deadline::AfterMillis(flags.timeout_ms)).status());
    }
    const int fd = open(path.c_str(), O_RDWR);
    if (fd < 0) return UnavailableError("open " + path + ": " + std::strerror(errno));
    void* region = mmap(nullptr, region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (region == MAP_FAILED) return UnavailableError("mmap " + path + ": " + std::strerror(errno));
    return std::unique_ptr<ShmPair>(
        new ShmPair(flags.rank, static_cast<char*>(region), region_bytes, slot_bytes,
                    flags.timeout_ms));
  }

  ~ShmPair() override { munmap(region_, region_bytes_); }

  Status Send(const void* data, size_t bytes) override {
    char* slot = region_ + static_cast<size_t>(rank_) * slot_bytes_;
    std::memcpy(slot + kHeaderBytes, data, bytes);
    Sequence(slot)->store(++sent_, std::memory_order_release);
    return OkStatus();
  }

  Status Recv(void* data, size_t bytes) override {
    char* slot = region_ + static_cast<size_t>(1 - rank_) * slot_bytes_;
    const uint64_t expected = received_ + 1;
    const Deadline deadline = Deadline::AfterMillis(timeout_ms_);
    // Spin first (the limit: no system call); then yield, since the two cores are shared and
    // the sender may be waiting for this one's.
    for (uint64_t spins = 0; Sequence(slot)->load(std::memory_order_acquire) != expected;
         ++spins) {
      if (spins < kSpinsBeforeYield) continue;
      std::this_thread::yield();
      if (spins % 1024 == 0 && deadline.Expired()) {
        return DeadlineExceededError("shm recv: no message " + std::to_string(expected) +
                                     " within " + std::to_string(timeout_ms_) + " ms");
      }
    }
    std::memcpy(data, slot + kHeaderBytes, bytes);
    received_ = expected;
    return OkStatus();
  }

 private:
  static constexpr size_t kHeaderBytes = 64;  // the sequence word, alone on its cache line
  static constexpr uint64_t kSpinsBeforeYield = 1 << 16;
  static_assert(std::atomic<uint64_t>::is_always_lock_free);  // so it works between processes

  ShmPair(int rank, char* region, size_t region_bytes, size_t slot_bytes, int64_t timeout_ms)
      : rank_(rank), region_(region), region_bytes_(region_bytes), slot_bytes_(slot_bytes),
        timeout_ms_(timeout_ms) {}

  static std::atomic<uint64_t>* Sequence(char* slot) {
    return reinterpret_cast<std::atomic<uint64_t>*>(slot);
  }

  const int rank_;
  char* const region_;
  const size_t region_bytes_, slot_bytes_;
  const int64_t timeout_ms_;
  uint64_t sent_ = 0, received_ = 0;
};

// Half the median round trip of `iters` ping-pongs of `bytes` (after `warmup` untimed); rank 1
// answers and returns 0.
StatusOr<double> PingPong(Pair& pair, int rank, size_t bytes, int warmup, int iters) {
  std::vector<char> buffer(bytes, static_cast<char>(rank + 1));
  std::vector<double> round_trips;
  for (int i = 0; i < warmup + iters; ++i) {
    if (rank == 1) {
      RETURN_IF_ERROR(pair.Recv(buffer.data(), bytes));
      RETURN_IF_ERROR(pair.Send(buffer.data(), bytes));
      continue;
    }
    const Clock::time_point start = Clock::now();
    RETURN_IF_ERROR(pair.Send(buffer.data(), bytes));
    RETURN_IF_ERROR(pair.Recv(buffer.data(), bytes));
    if (i >= warmup) round_trips.push_back(Seconds(Clock::now() - start));
  }
  return rank == 0 ? Median(round_trips) / 2 : 0.0;
}

Status RunPeer(const PointToPointPeerFlags& flags) {
  std::unique_ptr<Pair> pair;
  if (flags.kind == "tessera") {
    ASSIGN_OR_RETURN(pair, TesseraPair::Connect(flags));
  } else if (flags.kind == "zmq") {
    ASSIGN_OR_RETURN(pair, ZmqPair::Connect(flags));
  } else if (flags.kind == "shm") {
    ASSIGN_OR_RETURN(pair, ShmPair::Connect(flags));
  } else {
    return InvalidArgumentError("--p2p-peer \"" + flags.kind + "\" is not tessera, zmq or shm");
  }
  nlohmann::json record = {{"bench", kBench}, {"kind", flags.kind}};
  ASSIGN_OR_RETURN(double latency,
                   PingPong(*pair, flags.rank, flags.latency_bytes,
                            std::max(1, flags.latency_iters / 10), flags.latency_iters));
  record["latency_s"] = latency;
  if (flags.bandwidth_bytes > 0) {
    ASSIGN_OR_RETURN(double half_round_trip, PingPong(*pair, flags.rank, flags.bandwidth_bytes,
                                                      1, flags.bandwidth_iters));
    if (flags.rank == 0) {
      record["bytes_per_second"] = static_cast<double>(flags.bandwidth_bytes) / half_round_trip;
    }
  }
  // Rank 1 waits for a last word: leaving after its last reply could drop that reply from the
  // queue it was still in when the socket closed.
  char done = 0;
  if (flags.rank == 0) {
    RETURN_IF_ERROR(pair->Send(&done, 1));
    std::cout << record.dump() << std::endl;
  } else {
    RETURN_IF_ERROR(pair->Recv(&done, 1));
  }
  return OkStatus();
}

// Bytes per second of one memcpy of `bytes` between two buffers (touched first: no page
// faults in the copies), median of `iters` copies.
double MemcpyBytesPerSecond(size_t bytes, int iters) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  std::vector<double> seconds;
  for (int i = 0; i <= iters; ++i) {
    from[static_cast<size_t>(i) % bytes] = static_cast<char>(i);  // a copy that is not elided
    const Clock::time_point start = Clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    if (i > 0) seconds.push_back(Seconds(Clock::now() - start));  // the first one warms up
  }
  volatile char sink = to[bytes / 2];
  (void)sink;
  return static_cast<double>(bytes) / Median(seconds);
}

StatusOr<std::string> SelfPath() {
  std::vector<char> buffer(4096);
  const ssize_t length = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (length <= 0) {
    return UnavailableError(std::string("readlink /proc/self/exe: ") + std::strerror(errno));
  }
  return std::string(buffer.data(), static_cast<size_t>(length));
}

}  // namespace

void AddPointToPointPeerFlags(CLI::App* app, PointToPointPeerFlags* flags) {
  // Hidden (group ""): for the children MeasurePointToPoint starts, not for people.
  app->add_option("--p2p-peer", flags->kind)->group("");
  app->add_option("--p2p-rank", flags->rank)->check(CLI::Range(0, 1))->group("");
  app->add_option("--p2p-dir", flags->directory)->group("");
  app->add_option("--p2p-latency-bytes", flags->latency_bytes)->group("");
  app->add_option("--p2p-bandwidth-bytes", flags->bandwidth_bytes)->group("");
  app->add_option("--p2p-latency-iters", flags->latency_iters)->group("");
  app->add_option("--p2p-bandwidth-iters", flags->bandwidth_iters)->group("");
  app->add_option("--p2p-timeout-ms", flags->timeout_ms)->group("");
}

int RunPointToPointPeer(const PointToPointPeerFlags& flags) {
  Status status;
  try {
    status = RunPeer(flags);
  } catch (const zmq::error_t& error) {  // cppzmq throws what the C calls return
    status = UnavailableError(std::string("zmq: ") + error.what());
  }
  if (!status.ok()) {
    std::cerr << "groups point-to-point " << flags.kind << " peer rank " << flags.rank << ": "
              << status << "\n";
    return 1;
  }
  return 0;
}

StatusOr<PointToPointFigures> MeasurePointToPoint(const PointToPointOptions& o) {
  ASSIGN_OR_RETURN(std::string self, SelfPath());
  ASSIGN_OR_RETURN(std::unique_ptr<ScratchDirectory> scratch, ScratchDirectory::Create());
  PointToPointFigures figures;
  // zmq first, then tessera: the two that are compared run next to each other.
  for (const std::string kind : {"zmq", "tessera", "shm"}) {
    if (o.progress) std::cerr << "measuring point-to-point, " << kind << "...\n";
    const std::string directory = scratch->path() + "/" + kind;
    if (mkdir(directory.c_str(), 0700) != 0) {
      return UnavailableError("mkdir " + directory + ": " + std::strerror(errno));
    }
    if (kind == "tessera") {
      RETURN_IF_ERROR(WriteKeyFile(directory + "/job.key", JobKey::Generate()));
    }
    const size_t bandwidth_bytes = kind == "shm" ? 0 : o.bandwidth_bytes;
    std::vector<ChildSpec> children;
    for (int rank = 0; rank < 2; ++rank) {
      children.push_back(
          {"point-to-point " + kind + " peer rank " + std::to_string(rank),
           {self, "groups", "--p2p-peer", kind, "--p2p-rank", std::to_string(rank),
            "--p2p-dir", directory, "--p2p-latency-bytes", std::to_string(o.latency_bytes),
            "--p2p-bandwidth-bytes", std::to_string(bandwidth_bytes), "--p2p-latency-iters",
            std::to_string(o.latency_iters), "--p2p-bandwidth-iters",
            std::to_string(o.bandwidth_iters), "--p2p-timeout-ms", std::to_string(o.timeout_ms)}});
    }
    ASSIGN_OR_RETURN(std::vector<ChildOutput> outputs,
                     RunAllToCompletion(children, o.timeout_ms + 10'000));
    const std::vector<nlohmann::json> lines = BenchLines(outputs, kBench);
    if (lines.size() != 1 || !(lines[0].value("latency_s", 0.0) > 0) ||
        (bandwidth_bytes > 0 && !(lines[0].value("bytes_per_second", 0.0) > 0))) {
      return DataLossError("the point-to-point " + kind + " pair reported no figures");
    }
    const double latency = lines[0].at("latency_s").get<double>();
    const double rate = lines[0].value("bytes_per_second", 0.0);
    if (kind == "zmq") {
      figures.zmq_latency_s = latency;
      figures.zmq_bytes_per_second = rate;
    } else if (kind == "tessera") {
      figures.tessera_latency_s = latency;
      figures.tessera_bytes_per_second = rate;
    } else {
      figures.shm_latency_s = latency;
    }
  }
  if (o.progress) std::cerr << "measuring memcpy...\n";
  figures.memcpy_bytes_per_second = MemcpyBytesPerSecond(o.bandwidth_bytes, o.bandwidth_iters);
  return figures;
}

}  // namespace tessera::tools
