#include "worker/collectives/channel/links/ring_links.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/base/role.h"
#include "common/metrics/metric_names.h"
#include "worker/collectives/channel/links/ring_link_cipher.h"
#include "worker/collectives/channel/links/ring_link_handshake.h"

namespace tessera::worker {

// ---------------------------------------------------------------------------------------------
// Receive buffers: a frame's payload is read into one and lent to the Recv caller as a Payload;
// when the caller (or a Send that forwarded it) drops it, the buffer goes back here, so large
// segments do not fault in fresh pages every time.
class RingLinks::BufferPool : public std::enable_shared_from_this<RingLinks::BufferPool> {
 public:
  std::shared_ptr<uint8_t> Acquire(size_t bytes) {
    std::unique_ptr<uint8_t[]> chosen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
      }
      size_t capacity = bytes;
      if (best != free_.end()) {
        chosen = std::move(best->first);
        capacity = best->second;
        free_.erase(best);
      } else {
        chosen.reset(new uint8_t[bytes]);
      }
      uint8_t* data = chosen.release();
      std::weak_ptr<BufferPool> pool = weak_from_this();
      return std::shared_ptr<uint8_t>(data, [pool, capacity](uint8_t* p) {
        std::unique_ptr<uint8_t[]> owned(p);
        if (auto alive = pool.lock()) alive->Release(std::move(owned), capacity);
      });
    }
  }

 private:
  static constexpr size_t kMaxFree = 16;

  void Release(std::unique_ptr<uint8_t[]> buffer, size_t capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < kMaxFree) free_.emplace_back(std::move(buffer), capacity);
  }

  std::mutex mu_;
  std::vector<std::pair<std::unique_ptr<uint8_t[]>, size_t>> free_;  // guarded by mu_
};

namespace {

constexpr uint32_t kHelloMagic = kLinkPlainHelloMagic;  // "HELO", unauthenticated

// kEncrypt: the buffer of sealed records to write holds a frame's header record and one full
// payload record, so a frame's first bytes go out in one write with its header; smaller frames
// share it. A record is cut to fit the room left only if at least kMinRecordBytes fit.
constexpr size_t kSealedBytes = kFrameHeaderBytes + kSendRecordBytes + 2 * kRecordOverheadBytes;
constexpr size_t kMinRecordBytes = 4096;

template <typename T>
void Put(uint8_t* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}
template <typename T>
T Get(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }

std::string Errno(int error) { return std::strerror(error); }

// "tcp://HOST:PORT" -> HOST and PORT.
Status SplitAddress(const std::string& address, std::string* host, int* port) {
  const std::string prefix = "tcp://";
  const size_t colon = address.rfind(':');
  if (address.compare(0, prefix.size(), prefix) != 0 || colon == std::string::npos ||
      colon < prefix.size()) {
    return InvalidArgumentError("address " + address + " is not tcp://HOST:PORT");
  }
  *host = address.substr(prefix.size(), colon - prefix.size());
  if (*host == "*") *host = "0.0.0.0";
  char* end = nullptr;
  const long value = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (end == nullptr || *end != '\0' || value < 0 || value > 65535) {
    return InvalidArgumentError("address " + address + " has no valid port");
  }
  *port = static_cast<int>(value);
  return OkStatus();
}

Status Resolve(const std::string& host, int port, sockaddr_in* out) {
  std::memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  out->sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &out->sin_addr) == 1) return OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (error != 0 || found == nullptr) {
    return UnavailableError("cannot resolve " + host + ": " + gai_strerror(error));
  }
  out->sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
  freeaddrinfo(found);
  return OkStatus();
}

void Tune(int fd, int buffer_bytes) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
}

// Waits for `events` on fd until the deadline: true when ready.
bool PollOne(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(deadline.RemainingMillis(),
                                                                      1000)));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
    if (deadline.Expired()) return false;
  }
}

// Writes all of [data, data + bytes) to a blocking-mode socket within the deadline.
Status WriteAll(int fd, const uint8_t* data, size_t bytes, Deadline deadline) {
  while (bytes > 0) {
    if (!PollOne(fd, POLLOUT, deadline)) return DeadlineExceededError("write timed out");
    const ssize_t n = send(fd, data, bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return UnavailableError("write failed: " + Errno(errno));
    }
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return OkStatus();
}

Status ReadAll(int fd, uint8_t* data, size_t bytes, Deadline deadline) {
  while (bytes > 0) {
    if (!PollOne(fd, POLLIN, deadline)) return DeadlineExceededError("read timed out");
    const ssize_t n = recv(fd, data, bytes, MSG_DONTWAIT);
    if (n == 0) return UnavailableError("closed by the peer");
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return UnavailableError("read failed: " + Errno(errno));
    }
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return OkStatus();
}

// A hello: magic and the connecting rank.
void EncodeHello(int rank, uint8_t* hello) {
  Put<uint32_t>(hello, kHelloMagic);
  Put<int32_t>(hello + 4, rank);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Setup

RingLinks::Listener::~Listener() {
  if (fd >= 0) close(fd);
}

StatusOr<std::unique_ptr<RingLinks::Listener>> RingLinks::Listen(const std::string& host) {
  const std::string where = "ring links: listening on " + host + ": ";
  sockaddr_in local{};
  RETURN_IF_ERROR(Resolve(host, 0, &local).WithContext("ring links: listening on " + host));
  auto listener = std::make_unique<Listener>();
  listener->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener->fd < 0) return UnavailableError(where + "socket: " + Errno(errno));
  if (bind(listener->fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      listen(listener->fd, 8) != 0) {
    return UnavailableError(where + Errno(errno));
  }
  socklen_t length = sizeof(local);
  getsockname(listener->fd, reinterpret_cast<sockaddr*>(&local), &length);
  listener->address = "tcp://" + host + ":" + std::to_string(ntohs(local.sin_port));
  return listener;
}

namespace {

// Closes a socket unless released.
struct Closer {
  int fd = -1;
  ~Closer() {
    if (fd >= 0) close(fd);
  }
  int Release() { return std::exchange(fd, -1); }
};

// Connects to next's link address: the socket, non-blocking. Under kNone it greets next with
// the bare hello too; an authenticated handshake follows in Connect.
StatusOr<int> ConnectToNext(const RingLinksOptions& options, int next, Deadline deadline,
                            const std::string& where) {
  const std::string& next_link = options.next_address;
  std::string next_host;
  int next_port = 0;
  RETURN_IF_ERROR(SplitAddress(next_link, &next_host, &next_port)
                      .WithContext(where + Worker(next) + "'s link address"));
  sockaddr_in remote{};
  RETURN_IF_ERROR(Resolve(next_host, next_port, &remote).WithContext(where + Worker(next)));
  const std::string to_next_name = Worker(next) + " at " + next_link;
  Closer to_next{socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (to_next.fd < 0) return UnavailableError(where + "socket: " + Errno(errno));
  Tune(to_next.fd, options.socket_buffer_bytes);
  fcntl(to_next.fd, F_SETFL, fcntl(to_next.fd, F_GETFL) | O_NONBLOCK);
  if (connect(to_next.fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) != 0 &&
      errno != EINPROGRESS) {
    return UnavailableError(where + "cannot connect to " + to_next_name + ": " + Errno(errno));
  }
  if (!PollOne(to_next.fd, POLLOUT, deadline)) {
    return DeadlineExceededError(where + "connecting to " + to_next_name + " timed out");
  }
  int error = 0;
  socklen_t error_length = sizeof(error);
  getsockopt(to_next.fd, SOL_SOCKET, SO_ERROR, &error, &error_length);
  if (error != 0) {
    return UnavailableError(where + "cannot connect to " + to_next_name + ": " + Errno(error));
  }
  if (options.credentials.authenticated()) return to_next.Release();
  uint8_t hello[8];
  EncodeHello(options.rank, hello);
  RETURN_IF_ERROR(WriteAll(to_next.fd, hello, sizeof(hello), deadline)
                      .WithContext(where + "greeting " + to_next_name));
  return to_next.Release();
}

// Accepts prev's connection, whose hello must name prev: the socket, non-blocking, and where it
// came from ("tcp://HOST:PORT").
StatusOr<std::pair<int, std::string>> AcceptFromPrev(const RingLinksOptions& options,
                                                     int listener, int prev, Deadline deadline,
                                                     const std::string& where) {
  if (!PollOne(listener, POLLIN, deadline)) {
    return DeadlineExceededError(where + Worker(prev) + " did not connect within " +
                                 std::to_string(options.timeout_ms) + " ms");
  }
  sockaddr_in peer{};
  socklen_t peer_length = sizeof(peer);
  Closer from_prev{accept4(listener, reinterpret_cast<sockaddr*>(&peer), &peer_length,
                           SOCK_CLOEXEC | SOCK_NONBLOCK)};
  if (from_prev.fd < 0) return UnavailableError(where + "accept: " + Errno(errno));
  Tune(from_prev.fd, options.socket_buffer_bytes);
  char peer_host[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &peer.sin_addr, peer_host, sizeof(peer_host));
  const std::string prev_name =
      std::string(peer_host) + ":" + std::to_string(ntohs(peer.sin_port));
  uint8_t their_hello[8];
  RETURN_IF_ERROR(ReadAll(from_prev.fd, their_hello, sizeof(their_hello), deadline)
                      .WithContext(where + "the hello of " + Worker(prev) + " from " + prev_name));
  if (Get<uint32_t>(their_hello) != kHelloMagic || Get<int32_t>(their_hello + 4) != prev) {
    return InternalError(where + "the connection from " + prev_name + " is not from " +
                         Worker(prev) + " (hello names rank " +
                         std::to_string(Get<int32_t>(their_hello + 4)) + ")");
  }
  return std::make_pair(from_prev.Release(), "tcp://" + prev_name);
}

}  // namespace

StatusOr<std::unique_ptr<RingLinks>> RingLinks::Connect(const RingLinksOptions& options,
                                                        std::unique_ptr<Listener> listener) {
  const int world = options.world_size;
  const int rank = options.rank;
  const std::string where = "ring links rank=" + std::to_string(rank) + ": ";
  const bool inbound = listener != nullptr;
  const bool outbound = !options.next_address.empty();
  if (world < 2 || rank < 0 || rank >= world || (inbound && listener->fd < 0) ||
      !(inbound || outbound) || options.timeout_ms <= 0) {
    return InvalidArgumentError(where + "needs world_size >= 2, a rank in it, a listener or "
                                "next's address, and a positive timeout");
  }
  const bool authenticated = options.credentials.authenticated();
  if (authenticated && options.credentials.key == nullptr) {
    return InvalidArgumentError(where + "credentials ask for authentication but hold no key");
  }
  Counter* auth_failures = nullptr;
  if (authenticated && options.metrics != nullptr) {
    namespace names = metric_names;
    ASSIGN_OR_RETURN(CounterFamily* family,
                     options.metrics->RegisterCounter(names::kAuthFailuresTotal.name,
                                                      names::kAuthFailuresTotal.help,
                                                      {"reason"}));
    ASSIGN_OR_RETURN(auth_failures, family->WithLabels({"handshake"}));
  }
  const int next = options.next >= 0 ? options.next : (rank + 1) % world;
  const int prev = options.prev >= 0 ? options.prev : (rank + world - 1) % world;
  const Deadline deadline = Deadline::AfterMillis(options.timeout_ms);
  // Connect first, then accept: every rank's connect completes against its next's listen
  // backlog, so nobody waits for an accept that waits for it.
  Closer to_next;
  if (outbound) {
    ASSIGN_OR_RETURN(to_next.fd, ConnectToNext(options, next, deadline, where));
  }
  Closer from_prev;
  std::string prev_address;
  std::unique_ptr<RecordSealer> sealer;
  std::unique_ptr<RecordOpener> opener;
  if (authenticated) {
    // Both ends' handshakes at once: next answers our hello only while it runs its own
    // Connect, which waits for its next in turn, so connecting and accepting one after the
    // other would deadlock round the ring.
    RingLinkHandshakeOptions handshake;
    handshake.rank = rank;
    handshake.next = next;
    handshake.prev = prev;
    handshake.next_address = options.next_address;
    handshake.link_key = RingLinkKey(*options.credentials.key);
    handshake.records =
        options.credentials.encrypted() ? PreferredLinkCipher() : LinkCipher::kNone;
    handshake.deadline = deadline;
    handshake.timeout_ms = options.timeout_ms;
    handshake.auth_failures = auth_failures;
    handshake.where = where;
    ASSIGN_OR_RETURN(AuthenticatedPrev accepted,
                     RunRingLinkHandshakes(handshake, to_next.fd,
                                           inbound ? listener->fd : -1));
    from_prev.fd = accepted.fd;
    prev_address = std::move(accepted.address);
    if (from_prev.fd >= 0) Tune(from_prev.fd, options.socket_buffer_bytes);
    if (options.credentials.encrypted()) {
      // Each connection's records under a key of its own (ring_link_cipher.h).
      const KeyBytes aead_key = RingLinkAeadKey(*options.credentials.key);
      const auto text = [](const LinkNonce& nonce) { return AsText(nonce.data(), nonce.size()); };
      if (to_next.fd >= 0) {
        const LinkSession& session = accepted.to_next;
        sealer = std::make_unique<RecordSealer>(
            session.cipher, RecordKey(aead_key, session.cipher, rank, next,
                                      text(session.nonce_c), text(session.nonce_a)));
      }
      if (from_prev.fd >= 0) {
        const LinkSession& session = accepted.from_prev;
        opener = std::make_unique<RecordOpener>(
            session.cipher, RecordKey(aead_key, session.cipher, prev, rank,
                                      text(session.nonce_c), text(session.nonce_a)));
      }
    }
  } else if (inbound) {
    ASSIGN_OR_RETURN(auto accepted, AcceptFromPrev(options, listener->fd, prev, deadline, where));
    from_prev.fd = accepted.first;
    prev_address = std::move(accepted.second);
  }
  const int to_next_fd = to_next.Release();
  const int from_prev_fd = from_prev.Release();
  return std::unique_ptr<RingLinks>(new RingLinks(rank, next, prev, to_next_fd, from_prev_fd,
                                                  options.next_address, std::move(prev_address),
                                                  options.failures, options.max_payload_bytes,
                                                  options.spin_us, std::move(sealer),
                                                  std::move(opener)));
}

std::unique_ptr<RingLinks> RingLinks::FromSockets(int rank, int world_size, int to_next,
                                                  int from_prev, std::string next_address,
                                                  std::string prev_address,
                                                  std::shared_ptr<FailureBus> failures,
                                                  size_t max_payload_bytes, int64_t spin_us) {
  fcntl(to_next, F_SETFL, fcntl(to_next, F_GETFL) | O_NONBLOCK);
  fcntl(from_prev, F_SETFL, fcntl(from_prev, F_GETFL) | O_NONBLOCK);
  return std::unique_ptr<RingLinks>(new RingLinks(rank, (rank + 1) % world_size,
                                                  (rank + world_size - 1) % world_size, to_next,
                                                  from_prev,
                                                  std::move(next_address),
                                                  std::move(prev_address), std::move(failures),
                                                  max_payload_bytes, spin_us));
}

RingLinks::RingLinks(int rank, int next, int prev, int to_next, int from_prev,
                     std::string next_address, std::string prev_address,
                     std::shared_ptr<FailureBus> failures, size_t max_payload_bytes,
                     int64_t spin_us, std::unique_ptr<RecordSealer> sealer,
                     std::unique_ptr<RecordOpener> opener)
    : rank_(rank),
      next_(next),
      prev_(prev),
      to_next_(to_next),
      from_prev_(from_prev),
      wake_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      next_address_(std::move(next_address)),
      prev_address_(std::move(prev_address)),
      failures_(std::move(failures)),
      max_payload_bytes_(max_payload_bytes),
      pool_(std::make_shared<BufferPool>()),
      recv_spin_(spin_us),
      flush_spin_(spin_us),
      sealer_(std::move(sealer)),
      opener_(std::move(opener)) {
  if (sealer_ != nullptr) {
    sealed_.reset(new uint8_t[kSealedBytes]);
  }
  if (to_next_ < 0) send_failure_ = FailedPreconditionError(LinkTo() + ": not this channel's");
  if (from_prev_ < 0) recv_failure_ = FailedPreconditionError(LinkFrom() + ": not this channel's");
}

RingLinks::~RingLinks() {
  if (to_next_ >= 0) close(to_next_);
  if (from_prev_ >= 0) close(from_prev_);
  if (wake_ >= 0) close(wake_);
}

std::string RingLinks::LinkTo() const {
  return "ring link to " + Worker(next_) + " (" + next_address_ + ")";
}
std::string RingLinks::LinkFrom() const {
  return "ring link from " + Worker(prev_) + " (" + prev_address_ + ")";
}

// ---------------------------------------------------------------------------------------------
// Progress

Status RingLinks::Send(RingFrame frame) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!send_failure_.ok()) return send_failure_;
  frame.sender_rank = rank_;
  out_.emplace_back();
  OutFrame& out = out_.back();
  out.payload = FramePayload(frame);
  EncodeFrameHeader(frame, out.payload.size(), out.header);
  WriteSome();
  if (HasUnsent() && polling_ && wake_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_, &one, sizeof(one));  // the poller adds POLLOUT
  }
  return send_failure_;
}

bool RingLinks::HasUnsent() const { return !out_.empty() || sealed_sent_ < sealed_end_; }

void RingLinks::WriteSome() {
  if (sealer_ != nullptr) return WriteSealed();
  constexpr size_t kMaxIov = 64;
  while (!out_.empty() && send_failure_.ok()) {
    iovec iov[kMaxIov];
    size_t count = 0;
    size_t total = 0;
    for (auto it = out_.begin(); it != out_.end() && count + 2 <= kMaxIov; ++it) {
      size_t skip = it->written;
      if (skip < kFrameHeaderBytes) {
        iov[count++] = {it->header + skip, kFrameHeaderBytes - skip};
        total += kFrameHeaderBytes - skip;
        skip = 0;
      } else {
        skip -= kFrameHeaderBytes;
      }
      if (it->payload.size() > skip) {
        iov[count++] = {const_cast<uint8_t*>(it->payload.data()) + skip,
                        it->payload.size() - skip};
        total += it->payload.size() - skip;
      }
    }
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = count;
    const ssize_t n = sendmsg(to_next_, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      send_failure_ = UnavailableError(LinkTo() + ": send failed: " + Errno(errno));
      return;
    }
    size_t left = static_cast<size_t>(n);
    while (!out_.empty()) {
      OutFrame& front = out_.front();
      const size_t frame_left = kFrameHeaderBytes + front.payload.size() - front.written;
      if (left < frame_left) {
        front.written += left;
        break;
      }
      left -= frame_left;
      out_.pop_front();  // releases the payload: its buffer may be reused now
    }
    if (static_cast<size_t>(n) < total) return;  // the socket is full
  }
}

size_t RingLinks::RecvSome(uint8_t* at, size_t bytes, bool mid_frame) {
  while (true) {
    const ssize_t n = recv(from_prev_, at, bytes, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) {
      recv_failure_ = UnavailableError(LinkFrom() + ": closed by the peer" +
                                       (mid_frame ? " in the middle of a frame" : ""));
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      recv_failure_ = UnavailableError(LinkFrom() + ": receive failed: " + Errno(errno));
    }
    return 0;
  }
}

void RingLinks::ReadSome() {
  if (opener_ != nullptr) return ReadSealed();
  while (recv_failure_.ok()) {
    if (in_header_got_ < kFrameHeaderBytes) {
      const size_t n = RecvSome(in_header_ + in_header_got_,
                                kFrameHeaderBytes - in_header_got_, in_header_got_ > 0);
      if (n == 0) return;
      in_header_got_ += n;
      if (in_header_got_ < kFrameHeaderBytes) continue;
      if (!OnHeader()) return;
    } else {
      const size_t n = RecvSome(in_target_ + in_payload_got_,
                                in_payload_bytes_ - in_payload_got_, /*mid_frame=*/true);
      if (n == 0) return;
      in_payload_got_ += n;
    }
    if (in_header_got_ == kFrameHeaderBytes && in_payload_got_ == in_payload_bytes_) {
      OnFrame();
      return;  // one frame at a time: the waiter may be done
    }
  }
}

bool RingLinks::OnHeader() {
  Status decoded =
      DecodeFrameHeader(in_header_, max_payload_bytes_, &in_frame_, &in_payload_bytes_);
  if (decoded.ok() && in_frame_.sender_rank != prev_) {
    decoded = InvalidArgumentError("a frame names sender rank " +
                                   std::to_string(in_frame_.sender_rank));
  }
  if (!decoded.ok()) {
    recv_failure_ = DataLossError(LinkFrom() + ": " + decoded.message());
    return false;
  }
  in_payload_got_ = 0;
  in_buffer_.reset();
  in_target_ = nullptr;
  auto landing = landings_.find({in_frame_.tag, in_frame_.slot});
  if (landing != landings_.end() && landing->second.second == in_payload_bytes_) {
    in_target_ = landing->second.first;  // straight into the caller's buffer
  } else if (in_payload_bytes_ > 0) {
    in_buffer_ = pool_->Acquire(in_payload_bytes_);
    in_target_ = in_buffer_.get();
  }
  return true;
}

void RingLinks::OnFrame() {
  Payload payload;
  if (in_payload_bytes_ > 0) payload = Payload::Borrow(in_target_, in_payload_bytes_, in_buffer_);
  in_buffer_.reset();
  in_target_ = nullptr;
  in_header_got_ = 0;
  if (Status attached = AttachFramePayload(&in_frame_, std::move(payload)); !attached.ok()) {
    recv_failure_ = DataLossError(LinkFrom() + ": " + attached.message());
    return;
  }
  const uint64_t tag = in_frame_.tag;
  kept_.Keep(std::move(in_frame_));
  if (kept_.size() > kMaxKeptFrames) {
    recv_failure_ = ResourceExhaustedError(
        LinkFrom() + ": " + std::to_string(kept_.size()) +
        " frames wait for no running collective (the last for tag=" + std::to_string(tag) + ")");
  }
}

// ---------------------------------------------------------------------------------------------
// kEncrypt's records (ring_link_cipher.h)

void RingLinks::WriteSealed() {
  while (send_failure_.ok()) {
    if (sealed_sent_ == sealed_end_) {
      sealed_sent_ = sealed_end_ = 0;
      SealSome();
      if (sealed_end_ == 0 || !send_failure_.ok()) return;
    }
    const ssize_t n = send(to_next_, sealed_.get() + sealed_sent_, sealed_end_ - sealed_sent_,
                           MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      send_failure_ = UnavailableError(LinkTo() + ": send failed: " + Errno(errno));
      return;
    }
    sealed_sent_ += static_cast<size_t>(n);
    if (sealed_sent_ < sealed_end_) return;  // the socket is full
  }
}

void RingLinks::SealSome() {
  while (!out_.empty()) {
    OutFrame& front = out_.front();
    const uint8_t* in;
    size_t bytes;
    const size_t room = kSealedBytes - sealed_end_;
    if (front.sealed < kFrameHeaderBytes) {  // the header: a record of its own
      in = front.header;
      bytes = kFrameHeaderBytes;
      if (room < bytes + kRecordOverheadBytes) return;
    } else {
      const size_t offset = front.sealed - kFrameHeaderBytes;
      in = front.payload.data() + offset;
      bytes = std::min(front.payload.size() - offset, kSendRecordBytes);
      if (room < bytes + kRecordOverheadBytes) {
        if (room < kMinRecordBytes + kRecordOverheadBytes) return;
        bytes = room - kRecordOverheadBytes;
      }
    }
    if (Status sealed = sealer_->Seal(in, bytes, sealed_.get() + sealed_end_); !sealed.ok()) {
      send_failure_ = sealed.WithContext(LinkTo());
      return;
    }
    sealed_end_ += bytes + kRecordOverheadBytes;
    front.sealed += bytes;
    if (front.sealed == kFrameHeaderBytes + front.payload.size()) {
      out_.pop_front();  // releases the payload: its buffer may be reused now
    }
  }
}

uint8_t* RingLinks::RecordTarget() {
  return in_header_got_ < kFrameHeaderBytes ? in_header_ : in_target_ + in_payload_got_;
}

size_t RingLinks::PayloadBytesAtTarget() const {
  size_t bytes = in_payload_got_;
  if (opener_ != nullptr && in_header_got_ == kFrameHeaderBytes &&
      in_record_got_ > sizeof(in_record_length_)) {
    bytes += std::min(in_record_got_ - sizeof(in_record_length_), in_record_bytes_);
  }
  return bytes;
}

void RingLinks::ReadSealed() {
  constexpr size_t kLength = sizeof(in_record_length_);
  constexpr size_t kTag = sizeof(in_record_tag_);
  static_assert(kLength == kRecordLengthBytes && kTag == kRecordTagBytes);
  while (recv_failure_.ok()) {
    const bool mid_frame = in_header_got_ > 0 || in_record_got_ > 0;
    if (in_record_got_ < kLength) {
      const size_t n = RecvSome(in_record_length_ + in_record_got_, kLength - in_record_got_,
                                mid_frame);
      if (n == 0) return;
      in_record_got_ += n;
      if (in_record_got_ < kLength) continue;
      // The length is checked before a byte of the body is read: a record of the header is
      // the header's size; one of the payload at most what the payload has left.
      StatusOr<size_t> length = DecodeRecordLength(in_record_length_);
      const bool header = in_header_got_ < kFrameHeaderBytes;
      const size_t left = header ? kFrameHeaderBytes : in_payload_bytes_ - in_payload_got_;
      if (!length.ok() || (header ? *length != left : *length > left)) {
        recv_failure_ = DataLossError(
            LinkFrom() + ": a record failed authentication (tampered or not from the job): " +
            (length.ok() ? "it declares " + std::to_string(*length) + " bytes where the " +
                               (header ? "frame header has " : "frame's payload has ") +
                               std::to_string(left)
                         : std::string(length.status().message())));
        return;
      }
      in_record_bytes_ = *length;
      continue;
    }
    const size_t body_got = in_record_got_ - kLength;
    if (body_got < in_record_bytes_) {
      const size_t n =
          RecvSome(RecordTarget() + body_got, in_record_bytes_ - body_got, /*mid_frame=*/true);
      if (n == 0) return;
      in_record_got_ += n;
      continue;
    }
    const size_t tag_got = body_got - in_record_bytes_;
    if (tag_got < kTag) {
      const size_t n = RecvSome(in_record_tag_ + tag_got, kTag - tag_got, /*mid_frame=*/true);
      if (n == 0) return;
      in_record_got_ += n;
      if (tag_got + n < kTag) continue;
    }
    // A whole record: opened where its plaintext belongs.
    const Status opened =
        opener_->Open(in_record_length_, RecordTarget(), in_record_bytes_, in_record_tag_);
    in_record_got_ = 0;
    if (!opened.ok()) {
      recv_failure_ = DataLossError(LinkFrom() + ": " + opened.message());
      return;
    }
    if (in_header_got_ < kFrameHeaderBytes) {
      in_header_got_ = kFrameHeaderBytes;
      if (!OnHeader()) return;
    } else {
      in_payload_got_ += in_record_bytes_;
    }
    if (in_payload_got_ == in_payload_bytes_) {
      OnFrame();
      return;  // one frame at a time: the waiter may be done
    }
  }
}

Status RingLinks::Wait(const std::function<bool()>& done, Deadline deadline, bool for_recv) {
  const SteadyClock::time_point started = SteadyClock::now();
  std::unique_lock<std::mutex> lock(mu_);
  AdaptiveSpin& spin = for_recv ? recv_spin_ : flush_spin_;
  const SteadyClock::time_point spin_until =
      started + std::chrono::microseconds(spin.budget_us());
  while (true) {
    // The process's failure first, as CollectiveMailbox::Pop does: it is the root cause, and
    // a peer's abort notice read meanwhile only quotes the same thing second-hand.
    if (failures_ != nullptr) {
      Status failed = failures_->failure();  // the bus never calls into the links
      if (!failed.ok()) return failed;
    }
    if (done()) {
      spin.Record(std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() -
                                                                        started)
                      .count());
      return OkStatus();
    }
    if (for_recv && !recv_failure_.ok()) return recv_failure_;
    if (!for_recv && !send_failure_.ok()) return send_failure_;
    if (deadline.Expired()) return DeadlineExceededError("");
    if (!polling_ && spin_until > SteadyClock::now()) {
      // Spin before sleeping in poll: a frame due within microseconds is read without a
      // wake-up, as MPI's progress engine does. Each round yields the core, so that on an
      // oversubscribed machine a runnable peer (which we may be waiting for) runs first.
      ReadSome();
      if (HasUnsent()) WriteSome();
      if (done()) continue;
      lock.unlock();
      sched_yield();
      lock.lock();
      continue;
    }
    const auto slice = std::min(deadline.when(), SteadyClock::now() +
                                                     std::chrono::milliseconds(kFailureCheckMs));
    if (polling_) {
      progressed_.wait_until(lock, slice);
      continue;
    }
    polling_ = true;
    const bool want_out = HasUnsent() && send_failure_.ok();
    const bool want_in = recv_failure_.ok();
    lock.unlock();
    pollfd fds[3] = {{from_prev_, static_cast<short>(want_in ? POLLIN : 0), 0},
                     {to_next_, static_cast<short>(want_out ? POLLOUT : 0), 0},
                     {wake_, POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        slice - SteadyClock::now());
    const int ready = poll(fds, 3, static_cast<int>(std::max<int64_t>(0, left.count())));
    lock.lock();
    polling_ = false;
    if (ready > 0) {
      if (fds[2].revents != 0) {
        uint64_t drained;
        (void)!read(wake_, &drained, sizeof(drained));
      }
      if (fds[0].revents != 0) ReadSome();
      if (fds[1].revents != 0 || HasUnsent()) WriteSome();
    }
    progressed_.notify_all();
  }
}

StatusOr<RingFrame> RingLinks::Recv(uint64_t tag, uint32_t slot, Deadline deadline,
                                        uint8_t* into, size_t into_bytes) {
  const std::pair<uint64_t, uint32_t> key{tag, slot};
  if (into != nullptr && into_bytes > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    landings_[key] = {into, into_bytes};
  }
  Status waited = Wait([&] { return kept_.Has(tag, slot); }, deadline, /*for_recv=*/true);
  std::lock_guard<std::mutex> lock(mu_);
  if (into != nullptr && into_bytes > 0) {
    landings_.erase(key);
    if (in_target_ == into && in_buffer_ == nullptr) {
      // Half read into `into` when the wait ended: the rest must not land there after we
      // return, so the frame moves to a buffer of its own (with the part of the record being
      // read under kEncrypt).
      in_buffer_ = pool_->Acquire(in_payload_bytes_);
      std::memcpy(in_buffer_.get(), into, PayloadBytesAtTarget());
      in_target_ = in_buffer_.get();
    }
  }
  if (!waited.ok()) return waited;
  return kept_.Take(tag, slot);  // still there: only this call takes (tag, slot)
}

Status RingLinks::Flush(Deadline deadline) {
  Status waited = Wait([&] { return !HasUnsent(); }, deadline, /*for_recv=*/false);
  if (waited.code() == StatusCode::kDeadlineExceeded && waited.message().empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t bytes = sealed_end_ - sealed_sent_;
    for (const OutFrame& frame : out_) {
      bytes += kFrameHeaderBytes + frame.payload.size() -
               (sealer_ != nullptr ? frame.sealed : frame.written);
    }
    return DeadlineExceededError(LinkTo() + ": " + std::to_string(bytes) +
                                 " bytes still unsent at the deadline (is it reading?)");
  }
  return waited;
}

void RingLinks::CopyUnsentPayloads() {
  std::lock_guard<std::mutex> lock(mu_);
  for (OutFrame& frame : out_) {
    if (frame.payload.empty() || frame.payload.owner() != nullptr) continue;
    // The whole payload, so `written` keeps its meaning; a frame already half on the wire
    // must still be completed, or the byte stream to next loses its framing.
    frame.payload = Payload::Copy(frame.payload.data(), frame.payload.size());
  }
}

size_t RingLinks::unsent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return out_.size() + (sealed_sent_ < sealed_end_ ? 1 : 0);
}

Status RingLinks::failure() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!recv_failure_.ok()) return recv_failure_;
  }
  return failures_ == nullptr ? OkStatus() : failures_->failure();
}

void RingLinks::Discard(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.Discard(tag);
}

size_t RingLinks::kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_.size();
}

}  // namespace tessera::worker
