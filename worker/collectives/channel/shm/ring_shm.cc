#include "worker/collectives/channel/shm/ring_shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>

#include "common/base/process_alive.h"
#include "common/base/role.h"
#include "common/security/mac.h"

namespace tessera::worker {
namespace {

constexpr uint64_t kSegmentMagic = 0x4d48535f41525354;  // "TSRA_SHM"
constexpr size_t kControlBytes = 4096;                   // the first page: ControlBlock
constexpr uint64_t kAlign = 64;                          // frames start on cache lines

// The first page of a segment. Written by its creator before it announces the name; the
// atomics are lock-free and address-free, so they work between processes.
struct ControlBlock {
  uint64_t magic;
  uint64_t token[2];
  uint64_t capacity;  // bytes of the ring
  int32_t creator_rank;
  int32_t creator_pid;
  std::atomic<uint32_t> producer_closed;  // the creator's RingShm is gone
  std::atomic<uint32_t> consumer_closed;  // next's RingShm is gone
  alignas(64) std::atomic<uint64_t> head;  // bytes written, ever (the producer's)
  alignas(64) std::atomic<uint64_t> tail;  // bytes freed, ever (the consumer's)
  // The creator's doorbell: prev rings it after writing a frame, next after freeing space,
  // the creator's own threads after keeping a frame for another thread.
  alignas(64) std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> sleepers;  // threads in FUTEX_WAIT on doorbell
};
static_assert(sizeof(ControlBlock) <= kControlBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

uint64_t Pad(uint64_t bytes) { return (bytes + kAlign - 1) & ~(kAlign - 1); }

std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }
std::string Errno(int error) { return std::strerror(error); }

// Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
  timespec timeout{static_cast<time_t>(timeout_us / 1000000),
                   static_cast<long>((timeout_us % 1000000) * 1000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr,
          0);
}
void RingBell(ControlBlock* control) {
  control->doorbell.fetch_add(1);
  if (control->sleepers.load() > 0) FutexWake(&control->doorbell);
}

std::string Hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Segments

class RingShm::Segment {
 public:
  ~Segment() {
    Unlink();
    if (base_ != nullptr) munmap(base_, mapped_bytes_);
  }

  // Creates and maps a segment with a ring of `ring_bytes` (rounded up to pages).
  static StatusOr<std::shared_ptr<Segment>> Create(int rank, size_t ring_bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const uint64_t capacity = std::max<uint64_t>(page, (ring_bytes + page - 1) / page * page);
    // From the kernel's random source: the name's suffix keeps others from guessing it (and
    // from creating it first), the token tells the segment apart from any other.
    auto draw = [] {
      uint64_t value;
      RandomBytes(reinterpret_cast<uint8_t*>(&value), sizeof(value));
      return value;
    };
    auto segment = std::shared_ptr<Segment>(new Segment());
    segment->name_ = "/tessera-ring-" + std::to_string(getpid()) + "-" + std::to_string(rank) +
                     "-" + Hex(draw());
    const std::string where = "shared memory segment " + segment->name_ + ": ";
    const int fd = shm_open(segment->name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return FailedPreconditionError(where + "shm_open: " + Errno(errno));
    segment->linked_ = true;
    // Reserve the pages now: tmpfs grows lazily, and a full /dev/shm would otherwise be a
    // SIGBUS at the first write to a page it cannot back.
    const int reserved = posix_fallocate(fd, 0, static_cast<off_t>(kControlBytes + capacity));
    if (reserved != 0) {
      close(fd);
      return FailedPreconditionError(where + "cannot reserve " +
                                     std::to_string(kControlBytes + capacity) +
                                     " bytes in /dev/shm: " + Errno(reserved) +
                                     " (df -h /dev/shm)");
    }
    Status mapped = segment->Map(fd, capacity, /*whole=*/true);
    close(fd);
    RETURN_IF_ERROR(mapped.WithContext("shared memory segment " + segment->name_));
    ControlBlock* control = segment->control();
    control->token[0] = draw();
    control->token[1] = draw();
    control->capacity = capacity;
    control->creator_rank = rank;
    control->creator_pid = getpid();
    control->magic = kSegmentMagic;
    return segment;
  }

  // Opens `name`, checks that it is ours alone (owner, mode), its token and that it is
  // `creator_rank`'s, and maps it: the ring too if `whole`, else only the control page.
  // FailedPrecondition saying what is wrong.
  static StatusOr<std::shared_ptr<Segment>> Open(const RingShmSegmentName& name,
                                                 int creator_rank, bool whole) {
    const std::string where = Worker(creator_rank) + "'s shared memory segment " + name.name +
                              ": ";
    const int fd = shm_open(name.name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
      return FailedPreconditionError(where + "shm_open: " + Errno(errno) +
                                     " (another host, or another /dev/shm?)");
    }
    struct stat info {};
    if (fstat(fd, &info) != 0) {
      const int error = errno;
      close(fd);
      return FailedPreconditionError(where + "fstat: " + Errno(error));
    }
    // Ours (Create makes it 0600 as this user): a segment someone else made, or that others
    // may read or write, could be watched or forged, so we neither read nor write it.
    if (info.st_uid != geteuid()) {
      close(fd);
      return FailedPreconditionError(where + "owned by uid " + std::to_string(info.st_uid) +
                                     ", not ours: refusing to map it");
    }
    if ((info.st_mode & 077) != 0) {
      close(fd);
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(info.st_mode & 07777));
      return FailedPreconditionError(where + "has mode " + mode +
                                     " (its group or others may access it): refusing to map it");
    }
    if (static_cast<size_t>(info.st_size) < kControlBytes) {
      close(fd);
      return FailedPreconditionError(where + "too small to hold a ring");
    }
    auto segment = std::shared_ptr<Segment>(new Segment());
    segment->name_ = name.name;
    const ControlBlock* peek = static_cast<const ControlBlock*>(
        mmap(nullptr, kControlBytes, PROT_READ, MAP_SHARED, fd, 0));
    if (peek == MAP_FAILED) {
      close(fd);
      return FailedPreconditionError(where + "mmap: " + Errno(errno));
    }
    const uint64_t capacity = peek->capacity;
    const bool token_ok = peek->magic == kSegmentMagic && peek->token[0] == name.token[0] &&
                          peek->token[1] == name.token[1];
    const int32_t rank = peek->creator_rank;
    const pid_t pid = peek->creator_pid;
    munmap(const_cast<ControlBlock*>(peek), kControlBytes);
    if (!token_ok) {
      close(fd);
      return FailedPreconditionError(where + "holds another token: not the segment " +
                                     Worker(creator_rank) + " created");
    }
    if (static_cast<uint64_t>(info.st_size) != kControlBytes + capacity || rank != creator_rank) {
      close(fd);
      return FailedPreconditionError(where + "its size or creator rank does not match its header");
    }
    if (!ProcessAlive(pid)) {
      close(fd);
      return FailedPreconditionError(where + "its creator, pid " + std::to_string(pid) +
                                     ", is not a live process here (another PID namespace?)");
    }
    Status mapped = segment->Map(fd, whole ? capacity : 0, whole);
    close(fd);
    RETURN_IF_ERROR(mapped.WithContext(Worker(creator_rank) + "'s shared memory segment " +
                                       name.name));
    return segment;
  }

  void Unlink() {
    if (linked_) shm_unlink(name_.c_str());
    linked_ = false;
  }

  const std::string& name() const { return name_; }
  ControlBlock* control() const { return static_cast<ControlBlock*>(base_); }
  // The ring, mapped twice in a row: [data, data + 2 * capacity) is valid. Null if only the
  // control page is mapped.
  uint8_t* data() const { return data_; }
  uint64_t capacity() const { return capacity_; }
  pid_t creator_pid() const { return control()->creator_pid; }

 private:
  Segment() = default;

  // Maps the control page and, if `whole`, the ring twice right after it.
  Status Map(int fd, uint64_t capacity, bool whole) {
    mapped_bytes_ = kControlBytes + (whole ? 2 * capacity : 0);
    void* reserved = mmap(nullptr, mapped_bytes_, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserved == MAP_FAILED) return FailedPreconditionError("mmap: " + Errno(errno));
    base_ = reserved;
    uint8_t* at = static_cast<uint8_t*>(reserved);
    if (mmap(at, kControlBytes + (whole ? capacity : 0), PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      return FailedPreconditionError("mmap: " + Errno(errno));
    }
    if (whole) {
      if (mmap(at + kControlBytes + capacity, capacity, PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_FIXED, fd, kControlBytes) == MAP_FAILED) {
        return FailedPreconditionError("mmap of the ring's mirror: " + Errno(errno));
      }
      data_ = at + kControlBytes;
      capacity_ = capacity;
    }
    return OkStatus();
  }

  std::string name_;
  bool linked_ = false;  // this process created it and has not unlinked it yet
  void* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  uint8_t* data_ = nullptr;
  uint64_t capacity_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The consumer's side of prev's ring: which bytes are free again. Frames are taken in ring
// order but their payloads may be dropped in any order (and on any thread); the tail advances
// over a prefix of freed frames only.
class RingShm::Inbound : public std::enable_shared_from_this<RingShm::Inbound> {
 public:
  explicit Inbound(std::shared_ptr<Segment> segment) : segment_(std::move(segment)) {}

  Segment& segment() const { return *segment_; }
  bool Contains(const uint8_t* p) const {
    return p >= segment_->data() && p < segment_->data() + 2 * segment_->capacity();
  }

  // The bytes up to `end` are taken and already copied out.
  void Freed(uint64_t end) { Add(end, /*released=*/true); }
  // The bytes up to `end` are taken and lent out: the returned owner frees them when dropped.
  std::shared_ptr<const void> Lend(uint64_t end) {
    Add(end, /*released=*/false);
    auto self = shared_from_this();
    return std::shared_ptr<const void>(segment_->data(),
                                       [self, end](const void*) { self->Release(end); });
  }

 private:
  void Add(uint64_t end, bool released) {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.emplace_back(end, released);
    Advance();
  }
  void Release(uint64_t end) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& region : regions_) {
      if (region.first == end) region.second = true;
    }
    Advance();
  }
  // REQUIRES mu_ held.
  void Advance() {
    bool moved = false;
    while (!regions_.empty() && regions_.front().second) {
      segment_->control()->tail.store(regions_.front().first, std::memory_order_release);
      regions_.pop_front();
      moved = true;
    }
    if (moved) RingBell(segment_->control());  // prev may wait for space
  }

  const std::shared_ptr<Segment> segment_;
  std::mutex mu_;
  std::deque<std::pair<uint64_t, bool>> regions_;  // (end, released), in ring order; guarded by mu_
};

// ---------------------------------------------------------------------------------------------
// Setup

StatusOr<std::shared_ptr<RingShm::Segment>> RingShm::Create(int rank, size_t ring_bytes) {
  return Segment::Create(rank, ring_bytes);
}

RingShmSegmentName RingShm::NameOf(const Segment& segment) {
  RingShmSegmentName name;
  name.name = segment.name();
  name.token = {segment.control()->token[0], segment.control()->token[1]};
  return name;
}

StatusOr<std::unique_ptr<RingShm>> RingShm::Attach(int rank, int world_size,
                                                   std::shared_ptr<Segment> own,
                                                   const RingShmSegmentName& prev,
                                                   const RingShmSegmentName& next,
                                                   std::shared_ptr<FailureBus> failures,
                                                   size_t max_payload_bytes, int64_t spin_us) {
  const std::string who = "ring shm rank=" + std::to_string(rank);
  if (world_size < 2 || rank < 0 || rank >= world_size || own == nullptr) {
    return InvalidArgumentError(who + ": needs world_size >= 2, a rank in it and its segment");
  }
  std::shared_ptr<Segment> prev_ring;
  if (!prev.name.empty()) {
    auto opened = OpenRing(prev, (rank + world_size - 1) % world_size);
    if (!opened.ok()) return opened.status().WithContext(who);
    prev_ring = std::move(opened).value();
  }
  std::shared_ptr<Segment> next_bell;
  if (!next.name.empty()) {
    auto opened = OpenBell(next, (rank + 1) % world_size);
    if (!opened.ok()) return opened.status().WithContext(who);
    next_bell = std::move(opened).value();
  }
  return FromSegments(rank, (rank + 1) % world_size, (rank + world_size - 1) % world_size,
                      std::move(own), std::move(prev_ring), std::move(next_bell),
                      std::move(failures), max_payload_bytes, spin_us);
}

StatusOr<std::shared_ptr<RingShm::Segment>> RingShm::OpenRing(const RingShmSegmentName& prev,
                                                               int prev_rank) {
  return Segment::Open(prev, prev_rank, /*whole=*/true);
}

StatusOr<std::shared_ptr<RingShm::Segment>> RingShm::OpenBell(const RingShmSegmentName& next,
                                                               int next_rank) {
  return Segment::Open(next, next_rank, /*whole=*/false);
}

StatusOr<std::unique_ptr<RingShm>> RingShm::FromSegments(
    int rank, int next, int prev, std::shared_ptr<Segment> own,
    std::shared_ptr<Segment> prev_ring, std::shared_ptr<Segment> next_bell,
    std::shared_ptr<FailureBus> failures, size_t max_payload_bytes, int64_t spin_us) {
  if (rank < 0 || next < 0 || prev < 0 || next == rank || prev == rank || own == nullptr ||
      (prev_ring == nullptr && next_bell == nullptr)) {
    return InvalidArgumentError("ring shm rank=" + std::to_string(rank) +
                                ": needs neighbours other than itself, its segment and a "
                                "neighbour's");
  }
  return std::unique_ptr<RingShm>(new RingShm(rank, next, prev, std::move(own),
                                              std::move(prev_ring), std::move(next_bell),
                                              std::move(failures), max_payload_bytes, spin_us));
}

std::string EncodeSegmentName(const RingShmSegmentName& name) {
  if (name.name.empty()) return std::string();
  return name.name + " " + Hex(name.token[0]) + " " + Hex(name.token[1]);
}

StatusOr<RingShmSegmentName> DecodeSegmentName(const std::string& text) {
  RingShmSegmentName name;
  if (text.empty()) return name;
  char segment[256];
  unsigned long long token0 = 0, token1 = 0;
  if (text.size() >= sizeof(segment) ||
      std::sscanf(text.c_str(), "%255s %llx %llx", segment, &token0, &token1) != 3) {
    return InvalidArgumentError("a segment name is malformed: " + text);
  }
  name.name = segment;
  name.token = {token0, token1};
  return name;
}

RingShm::RingShm(int rank, int next, int prev, std::shared_ptr<Segment> own,
                 std::shared_ptr<Segment> prev_ring, std::shared_ptr<Segment> next_bell,
                 std::shared_ptr<FailureBus> failures, size_t max_payload_bytes,
                 int64_t spin_us)
    : rank_(rank),
      next_(next),
      prev_(prev),
      own_(std::move(own)),
      next_bell_(std::move(next_bell)),
      inbound_(prev_ring == nullptr ? nullptr : std::make_shared<Inbound>(std::move(prev_ring))),
      failures_(std::move(failures)),
      max_payload_bytes_(max_payload_bytes),
      spin_us_(spin_us),
      next_pid_(next_bell_ == nullptr ? 0 : next_bell_->creator_pid()),
      prev_pid_(inbound_ == nullptr ? 0 : inbound_->segment().creator_pid()) {
  if (next_bell_ == nullptr) send_failure_ = FailedPreconditionError(To() + ": not this channel's");
  if (inbound_ == nullptr) recv_failure_ = FailedPreconditionError(From() + ": not this channel's");
}

RingShm::~RingShm() {
  own_->Unlink();
  own_->control()->producer_closed.store(1);
  if (next_bell_ != nullptr) RingBell(next_bell_->control());  // next may wait for our frames
  if (inbound_ != nullptr) {
    inbound_->segment().control()->consumer_closed.store(1);
    RingBell(inbound_->segment().control());  // prev may wait for space
  }
}

void RingShm::UnlinkOwnSegment() { own_->Unlink(); }

size_t RingShm::ring_bytes() const { return own_->capacity(); }

std::string RingShm::To() const {
  return "ring shm to " + Worker(next_) + " (pid " + std::to_string(next_pid_) + ")";
}
std::string RingShm::From() const {
  return "ring shm from " + Worker(prev_) + " (pid " + std::to_string(prev_pid_) + ")";
}

Status RingShm::Send(RingFrame frame) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!send_failure_.ok()) return send_failure_;
  frame.sender_rank = rank_;
  OutFrame out;
  out.payload = FramePayload(frame);
  EncodeFrameHeader(frame, out.payload.size(), out.header);
  out.total = kFrameHeaderBytes + Pad(out.payload.size());
  out_.push_back(std::move(out));
  WriteSome();
  // A queued payload that lives in prev's ring would hold prev's space until next takes ours:
  // around the ring that can close a cycle of full rings. Copy it out instead.
  for (OutFrame& queued : out_) {
    if (queued.written == 0 && !queued.payload.empty() && inbound_ != nullptr &&
        inbound_->Contains(queued.payload.data())) {
      queued.payload = Payload::Copy(queued.payload.data(), queued.payload.size());
    }
  }
  return OkStatus();
}

void RingShm::CopyUnsentPayloads() {
  std::lock_guard<std::mutex> lock(mu_);
  for (OutFrame& frame : out_) {
    if (frame.payload.empty() || frame.payload.owner() != nullptr) continue;
    // The whole payload, so `written` keeps its meaning for a frame half streamed.
    frame.payload = Payload::Copy(frame.payload.data(), frame.payload.size());
  }
}

void RingShm::WriteSome() {
  if (!send_failure_.ok()) return;  // also when this channel has no outbound ring
  ControlBlock* control = own_->control();
  const uint64_t capacity = own_->capacity();
  uint64_t head = control->head.load(std::memory_order_relaxed);  // ours alone
  const uint64_t start = head;
  while (!out_.empty()) {
    OutFrame& frame = out_.front();
    const uint64_t free = capacity - (head - control->tail.load(std::memory_order_acquire));
    uint8_t* at = own_->data() + head % capacity;
    if (frame.total <= capacity) {  // whole, so that the consumer can read it in place
      if (free < frame.total) break;
      std::memcpy(at, frame.header, kFrameHeaderBytes);
      if (!frame.payload.empty()) {
        std::memcpy(at + kFrameHeaderBytes, frame.payload.data(), frame.payload.size());
      }
      head += frame.total;
      out_.pop_front();
      continue;
    }
    // Larger than the ring: streamed through it in pieces.
    if (free == 0) break;
    const uint64_t n = std::min(free, frame.total - frame.written);
    // The piece [written, written + n) of header + payload + padding.
    uint64_t from = frame.written;
    const uint64_t to = frame.written + n;
    uint8_t* dst = at;
    if (from < kFrameHeaderBytes) {
      const uint64_t part = std::min<uint64_t>(to, kFrameHeaderBytes) - from;
      std::memcpy(dst, frame.header + from, part);
      dst += part;
      from += part;
    }
    const uint64_t payload_end = kFrameHeaderBytes + frame.payload.size();
    if (from < to && from < payload_end) {
      const uint64_t part = std::min(to, payload_end) - from;
      std::memcpy(dst, frame.payload.data() + (from - kFrameHeaderBytes), part);
    }
    head += n;
    frame.written += n;
    if (frame.written < frame.total) break;
    out_.pop_front();
  }
  if (head != start) {
    control->head.store(head, std::memory_order_release);
    RingBell(next_bell_->control());
  }
}

void RingShm::ReadSome() {
  if (!recv_failure_.ok()) return;  // also when this channel has no inbound ring
  Segment& segment = inbound_->segment();
  const uint64_t capacity = segment.capacity();
  const uint64_t head = segment.control()->head.load(std::memory_order_acquire);
  bool kept_any = false;
  // Gives `frame` its payload and keeps it; false (the direction failed) for a bad payload.
  auto keep = [&](RingFrame frame, Payload payload) {
    if (Status attached = AttachFramePayload(&frame, std::move(payload)); !attached.ok()) {
      recv_failure_ = DataLossError(From() + ": " + attached.message());
      return false;
    }
    kept_.Keep(std::move(frame));
    kept_any = true;
    return true;
  };
  while (read_pos_ < head) {
    const uint8_t* at = segment.data() + read_pos_ % capacity;
    if (streaming_ != nullptr) {
      Streaming& s = *streaming_;
      const uint64_t n = std::min(head - read_pos_, s.total - s.got);
      const uint64_t payload_end = kFrameHeaderBytes + s.payload_bytes;
      if (s.got < payload_end) {
        const uint64_t part = std::min(s.got + n, payload_end) - s.got;
        std::memcpy(s.target + (s.got - kFrameHeaderBytes), at, part);
      }
      s.got += n;
      read_pos_ += n;
      inbound_->Freed(read_pos_);
      if (s.got < s.total) break;
      Payload payload = Payload::Borrow(s.target, s.payload_bytes, s.buffer);
      RingFrame frame = std::move(s.frame);
      streaming_.reset();
      if (!keep(std::move(frame), std::move(payload))) break;
      continue;
    }
    if (head - read_pos_ < kFrameHeaderBytes) break;  // cannot happen: frames are padded
    RingFrame frame;
    uint64_t payload_bytes = 0;
    Status decoded = DecodeFrameHeader(at, max_payload_bytes_, &frame, &payload_bytes);
    if (decoded.ok() && frame.sender_rank != prev_) {
      decoded = InvalidArgumentError("a frame claims to come from " +
                                     Worker(frame.sender_rank));
    }
    if (!decoded.ok()) {
      recv_failure_ = DataLossError(From() + ": " + decoded.message());
      break;
    }
    const uint64_t total = kFrameHeaderBytes + Pad(payload_bytes);
    const auto waiting = waiting_.find({frame.tag, frame.slot});
    uint8_t* into = nullptr;
    // Only the frame the waiter will take lands in its `into`: not one behind a frame already
    // kept under the same (tag, slot) (the next call under a reused tag), whose payload would
    // then point into the waiter's memory after its Recv returned.
    if (waiting != waiting_.end() && waiting->second.first != nullptr &&
        waiting->second.second == payload_bytes && !kept_.Has(frame.tag, frame.slot)) {
      into = waiting->second.first;
    }
    if (total > capacity) {
      auto s = std::make_unique<Streaming>();
      s->frame = std::move(frame);
      s->payload_bytes = payload_bytes;
      s->total = total;
      s->got = kFrameHeaderBytes;
      if (into != nullptr) {
        s->target = into;
      } else {
        s->buffer.reset(new uint8_t[payload_bytes], std::default_delete<uint8_t[]>());
        s->target = s->buffer.get();
      }
      streaming_ = std::move(s);
      read_pos_ += kFrameHeaderBytes;
      inbound_->Freed(read_pos_);
      continue;
    }
    if (head - read_pos_ < total) {  // cannot happen: whole frames are published at once
      recv_failure_ = DataLossError(From() + ": a frame of " + std::to_string(total) +
                                    " bytes is only partly written");
      break;
    }
    const uint8_t* bytes = at + kFrameHeaderBytes;
    read_pos_ += total;
    Payload payload;
    if (payload_bytes == 0) {
      inbound_->Freed(read_pos_);
    } else if (into != nullptr) {
      std::memcpy(into, bytes, payload_bytes);
      inbound_->Freed(read_pos_);
      payload = Payload::Borrow(into, payload_bytes, nullptr);
    } else if (waiting != waiting_.end()) {  // in place: the waiter combines from the ring
      payload = Payload::Borrow(bytes, payload_bytes, inbound_->Lend(read_pos_));
    } else {  // nobody waits for it yet: out of the ring, so that it holds no space
      payload = Payload::Copy(bytes, payload_bytes);
      inbound_->Freed(read_pos_);
    }
    if (!keep(std::move(frame), std::move(payload))) break;
  }
  if (kept_.size() > kMaxKeptFrames) {
    recv_failure_ = ResourceExhaustedError(From() + ": " + std::to_string(kept_.size()) +
                                           " frames wait for no running collective");
  }
  // Another thread of ours may sleep waiting for what we kept.
  if (kept_any) RingBell(own_->control());
}

Status RingShm::PeerStatus(bool for_recv) {
  if (for_recv) {
    if (inbound_->segment().control()->producer_closed.load() != 0) {
      return UnavailableError(From() + ": closed by the peer");
    }
    if (!ProcessAlive(prev_pid_)) return UnavailableError(From() + ": the process exited");
  } else {
    if (own_->control()->consumer_closed.load() != 0) {
      return UnavailableError(To() + ": closed by the peer");
    }
    if (!ProcessAlive(next_pid_)) return UnavailableError(To() + ": the process exited");
  }
  return OkStatus();
}

Status RingShm::Wait(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done,
                     bool for_recv, Deadline deadline) {
  ControlBlock* bell = own_->control();
  while (true) {
    // Read the doorbell before looking: whatever happens after the look rings it anew.
    const uint32_t seen = bell->doorbell.load();
    // The process's failure first, as RingLinks and CollectiveMailbox::Pop do: it is the
    // root cause.
    if (failures_ != nullptr) {
      Status failed = failures_->failure();  // the bus never calls into the channel
      if (!failed.ok()) return failed;
    }
    WriteSome();
    ReadSome();
    if (done()) return OkStatus();
    if (for_recv && !recv_failure_.ok()) return recv_failure_;
    if (!for_recv && !send_failure_.ok()) return send_failure_;
    // A neighbour that died or closed never rings again: look before sleeping (not every
    // time: /proc costs microseconds).
    const bool look = SteadyClock::now() >= next_peer_check_;
    if (look) next_peer_check_ = SteadyClock::now() + std::chrono::milliseconds(kFailureCheckMs / 2);
    for (bool recv_side : {true, false}) {
      if (!look) break;
      Status& failure = recv_side ? recv_failure_ : send_failure_;
      if (!failure.ok()) continue;
      Status gone = PeerStatus(recv_side);
      if (gone.ok()) continue;
      if (recv_side) ReadSome();  // what it wrote before it went still counts
      failure = gone;
    }
    if (done()) return OkStatus();
    if (for_recv && !recv_failure_.ok()) return recv_failure_;
    if (!for_recv && !send_failure_.ok()) return send_failure_;
    if (deadline.Expired()) return DeadlineExceededError("");
    lock.unlock();
    const auto spin_until = SteadyClock::now() + std::chrono::microseconds(spin_us_);
    while (bell->doorbell.load() == seen && SteadyClock::now() < spin_until) sched_yield();
    if (bell->doorbell.load() == seen) {
      const int64_t slice_us =
          std::max<int64_t>(1, std::min<int64_t>(kFailureCheckMs, deadline.RemainingMillis()) *
                                   1000);
      bell->sleepers.fetch_add(1);
      FutexWait(&bell->doorbell, seen, slice_us);
      bell->sleepers.fetch_sub(1);
    }
    lock.lock();
  }
}

StatusOr<RingFrame> RingShm::Recv(uint64_t tag, uint32_t slot, Deadline deadline,
                                      uint8_t* into, size_t into_bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto key = std::make_pair(tag, slot);
  waiting_[key] = {into_bytes > 0 ? into : nullptr, into_bytes};
  Status waited = Wait(lock, [&] { return kept_.Has(tag, slot); }, /*for_recv=*/true, deadline);
  waiting_.erase(key);
  if (streaming_ != nullptr && into != nullptr && streaming_->target == into &&
      streaming_->buffer == nullptr) {
    // Half copied into `into` when the wait ended: the rest must not land there after we
    // return. Move it to a buffer of its own.
    Streaming& s = *streaming_;
    s.buffer.reset(new uint8_t[s.payload_bytes], std::default_delete<uint8_t[]>());
    const uint64_t got = std::min(s.got, kFrameHeaderBytes + s.payload_bytes) -
                         kFrameHeaderBytes;
    std::memcpy(s.buffer.get(), into, got);
    s.target = s.buffer.get();
  }
  if (!waited.ok()) return waited;
  return kept_.Take(tag, slot);
}

Status RingShm::Flush(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  Status flushed = Wait(lock, [this] { return out_.empty(); }, /*for_recv=*/false, deadline);
  if (flushed.code() == StatusCode::kDeadlineExceeded && flushed.message().empty()) {
    return DeadlineExceededError(To() + ": " + std::to_string(out_.size()) +
                                 " frames not taken in time (its ring stays full)");
  }
  return flushed;
}

size_t RingShm::unsent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return out_.size();
}

Status RingShm::failure() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!recv_failure_.ok()) return recv_failure_;
  }
  return failures_ == nullptr ? OkStatus() : failures_->failure();
}

void RingShm::Discard(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.Discard(tag);
}

size_t RingShm::kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_.size();
}

}  // namespace tessera::worker
