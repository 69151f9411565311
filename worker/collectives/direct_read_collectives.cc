#include "worker/collectives/direct_read_collectives.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/base/role.h"
#include "worker/collectives/channel/cma/cross_memory.h"
#include "worker/collectives/element_reduction.h"

namespace tessera::worker {
namespace {

std::string Worker(int rank) { return MemberName(Role::kWorker, rank); }

std::string Range(size_t begin, size_t count) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")";
}

// How much of a failed rank's message its peers quote.
constexpr size_t kQuoteBytes = 240;

}  // namespace

// ---------------------------------------------------------------------------------------------
// The probe

StatusOr<DirectReadProbe> ProbeDirectReads(Collectives& control, uint64_t tag) {
  const int rank = control.rank();
  const int world = control.world_size();
  const size_t r = static_cast<size_t>(rank);
  const std::string who = Worker(rank) + ": probing direct reads";
  // Kept until every peer has said it is done reading it (the second exchange below).
  const ProbeBuffer buffer;
  std::vector<int64_t> table(3 * static_cast<size_t>(world));
  table[3 * r] = buffer.pid();
  table[3 * r + 1] = static_cast<int64_t>(buffer.address());
  table[3 * r + 2] = static_cast<int64_t>(buffer.value());
  RETURN_IF_ERROR(control
                      .AllGather(table.data() + 3 * r, table.data(), table.size(),
                                 DataType::kInt64, "direct-read-probe", tag)
                      .WithContext(who + ": exchanging pids and addresses"));
  DirectReadProbe probe;
  for (int q = 0; q < world; ++q) probe.pids.push_back(static_cast<pid_t>(table[3 * q]));
  Status mine;
  for (int q = 0; q < world && mine.ok(); ++q) {
    if (q == rank) continue;
    const size_t at = 3 * static_cast<size_t>(q);
    mine = CheckProbe({static_cast<pid_t>(table[at]), static_cast<uint64_t>(table[at + 1]),
                       Worker(q)},
                      static_cast<uint64_t>(table[at + 2]));
  }
  // Agree, so that every rank decides alike (one that could read all its peers may be read by
  // none of them).
  std::vector<uint8_t> unable(static_cast<size_t>(world), 0);
  unable[r] = mine.ok() ? 0 : 1;
  RETURN_IF_ERROR(control
                      .AllGather(unable.data() + r, unable.data(), unable.size(),
                                 DataType::kUInt8, "direct-read-probe", tag)
                      .WithContext(who + ": agreeing whether every rank can"));
  std::string ranks;
  for (int q = 0; q < world; ++q) {
    if (unable[static_cast<size_t>(q)] != 0) ranks += (ranks.empty() ? "" : ", ") + Worker(q);
  }
  probe.usable = ranks.empty();
  if (!probe.usable) {
    probe.refused = ranks + " cannot read its peers' memory" +
                    (mine.ok() ? "" : "; this rank: " + mine.message());
  }
  return probe;
}

// ---------------------------------------------------------------------------------------------
// One call
//
// The algorithms, and the words the code below uses for them.
//
//   slice    slice q is rank q's partition of the buffer, PartitionOf(count, W, q): the part
//            rank q reduces (all-reduce, reduce-scatter) or contributes (all-gather).
//   chunk    a slice is read and combined chunk_bytes at a time: the chunk read from a peer
//            into the scratch buffer is still in cache when it is combined into our own.
//   table    each call's first step: every rank publishes, over the control collectives, what
//            it calls (op, count, dtype, reduce op) and where its buffers lie; each checks that
//            every peer calls the same (every rank sees the same table, so all fail alike).
//   phase    a step after which a rank's reads are done: every rank says over the control
//            whether it failed (an all-gather of a few bytes each), and none goes on, or returns,
//            before every peer has finished reading its buffers.
//
//   all-reduce      table; reduce slice r (read slice r of each peer's buffer, combine in the
//                   ring's order; the last combination divides an average); phase; read each peer's
//                   reduced slice q into our slice q; phase.
//   reduce-scatter  table; copy our input's slice r to the output; reduce into it from each
//                   peer's input; phase.
//   all-gather      table; copy our input to our slice of the output; read each peer's input
//                   into its slice; phase.
//
// While rank r reduces slice r in place, its peers read only its other slices, which nobody
// writes until the first phase has passed.

class DirectReadCollectives::Run {
 public:
  Run(DirectReadCollectives& self, CollectiveOp op, DataType dtype, ReduceOp reduce_op,
      size_t count, const std::string& tensor, uint64_t tag)
      : self_(self),
        options_(self.options_),
        op_(op),
        dtype_(dtype),
        reduce_op_(reduce_op),
        count_(count),
        tensor_(tensor),
        tag_(tag),
        element_bytes_(DataTypeSize(dtype)),
        deadline_(Deadline::AfterMillis(self.options_.timeout_ms)) {}

  ~Run() {
    if (scratch_ != nullptr) self_.GiveScratch(std::move(scratch_));
  }

  Status AllReduce(uint8_t* data) {
    RETURN_IF_ERROR(Table(data, data));
    const Partition own = Slice(options_.rank);
    Status reduced = ReduceSlice(own, data + own.offset * element_bytes_);
    RETURN_IF_ERROR(Phase(1, reduced, "reducing its slice"));
    return Phase(2, GatherSlices(data, /*peers_whole=*/true), "gathering the reduced slices");
  }

  Status ReduceScatter(const uint8_t* input, uint8_t* output) {
    RETURN_IF_ERROR(Table(input, output));
    const Partition own = Slice(options_.rank);
    const uint8_t* in_place = input + own.offset * element_bytes_;
    if (output != in_place && own.size > 0) {
      std::memcpy(output, in_place, own.size * element_bytes_);
    }
    return Phase(1, ReduceSlice(own, output), "reducing its slice");
  }

  Status AllGather(const uint8_t* input, uint8_t* output) {
    RETURN_IF_ERROR(Table(input, output));
    const Partition own = Slice(options_.rank);
    uint8_t* in_place = output + own.offset * element_bytes_;
    if (input != in_place && own.size > 0) {
      std::memcpy(in_place, input, own.size * element_bytes_);
    }
    return Phase(1, GatherSlices(output, /*peers_whole=*/false), "gathering the slices");
  }

  // A failed call's error, naming first a peer that has exited if there is one. A peer that is
  // alive leaves a call early (and frees the buffers its peers may still be reading) only when
  // the control failed it: when another rank exited. So the error this rank met may name that
  // peer (its range no longer mapped, its control frames gone) rather than the one that exited.
  Status Blame(const Status& failed) const {
    if (failed.ok()) return failed;
    for (int p = 0; p < options_.world_size; ++p) {
      if (p == options_.rank) continue;
      const std::string peer = Worker(p);
      const pid_t pid = options_.pids[static_cast<size_t>(p)];
      if (!ProcessExited(pid)) continue;
      if (failed.message().find(peer) != std::string::npos &&
          failed.message().find("exited") != std::string::npos) {
        return failed;  // named already
      }
      return UnavailableError(Prefix() + ": " + peer + " (pid " + std::to_string(pid) +
                              ") exited, which failed this call: " + failed.message());
    }
    return failed;
  }

  // Arguments this rank can check alone.
  Status CheckCall() const {
    if (element_bytes_ == 0) {
      return InvalidArgumentError(Prefix() + ": unknown dtype " +
                                  std::to_string(static_cast<int>(dtype_)));
    }
    if (Reduces() && ReduceOpName(reduce_op_) == "invalid") {
      return InvalidArgumentError(Prefix() + ": unknown reduce op " +
                                  std::to_string(static_cast<int>(reduce_op_)));
    }
    if (Reduces() && reduce_op_ == ReduceOp::kAverage && !IsFloatingPoint(dtype_)) {
      return InvalidArgumentError(Prefix() + ": average needs a floating-point dtype (float32, "
                                  "float64, float16 or bfloat16), not " +
                                  std::string(DataTypeName(dtype_)));
    }
    return OkStatus();
  }

  // Publishes a rank whose arguments are wrong, so that its peers fail at once too.
  Status Refuse(const Status& why) {
    Status told = Table(nullptr, nullptr, /*refused=*/true);
    (void)told;  // our own error is the root cause
    return why;
  }

 private:
  enum Field : size_t { kOp, kCount, kDtype, kReduceOp, kFirst, kSecond, kFields };

  bool Reduces() const {
    return op_ == CollectiveOp::kAllReduce || op_ == CollectiveOp::kReduceScatter;
  }

  Partition Slice(int rank) const { return PartitionOf(count_, options_.world_size, rank); }

  std::string Prefix() const {
    std::string prefix = std::string(CollectiveOpName(op_)) + " tag=" + std::to_string(tag_);
    if (!tensor_.empty()) prefix += " tensor=" + tensor_;
    return prefix + " rank=" + std::to_string(options_.rank);
  }

  std::string Describe(int64_t op, int64_t count, int64_t dtype, int64_t reduce_op) const {
    if (op < 0) return "rejected its arguments";
    std::string text = std::string(CollectiveOpName(static_cast<CollectiveOp>(op))) + " of " +
                       std::to_string(count) + " x " +
                       std::string(DataTypeName(static_cast<DataType>(dtype)));
    if (Reduces()) text += " (" + std::string(ReduceOpName(static_cast<ReduceOp>(reduce_op))) + ")";
    return text;
  }

  // The table (see above): where every rank's buffers lie, checked to describe the same call.
  Status Table(const void* first, const void* second, bool refused = false) {
    const size_t world = static_cast<size_t>(options_.world_size);
    const size_t r = static_cast<size_t>(options_.rank);
    table_.assign(kFields * world, 0);
    int64_t* mine = table_.data() + kFields * r;
    mine[kOp] = refused ? -1 : static_cast<int64_t>(op_);
    mine[kCount] = static_cast<int64_t>(count_);
    mine[kDtype] = static_cast<int64_t>(dtype_);
    mine[kReduceOp] = Reduces() ? static_cast<int64_t>(reduce_op_) : 0;
    mine[kFirst] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(first));
    mine[kSecond] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(second));
    RETURN_IF_ERROR(options_.control
                        ->AllGather(mine, table_.data(), table_.size(), DataType::kInt64,
                                    tensor_, tag_)
                        .WithContext(Prefix() + ": exchanging buffer addresses"));
    if (refused) return OkStatus();
    for (size_t q = 0; q < world; ++q) {
      const int64_t* theirs = table_.data() + kFields * q;
      if (std::equal(theirs, theirs + kFirst, mine)) continue;
      return InvalidArgumentError(
          Prefix() + ": " + Worker(static_cast<int>(q)) + " " +
          (theirs[kOp] < 0 ? "" : "calls ") +
          Describe(theirs[kOp], theirs[kCount], theirs[kDtype], theirs[kReduceOp]) +
          "; this rank calls " + Describe(mine[kOp], mine[kCount], mine[kDtype], mine[kReduceOp]));
    }
    return OkStatus();
  }

  PeerMemory Peer(int q, Field field, size_t offset_bytes) const {
    const int64_t address = table_[kFields * static_cast<size_t>(q) + field];
    return {options_.pids[static_cast<size_t>(q)],
            static_cast<uint64_t>(address) + offset_bytes, Worker(q)};
  }

  // Between chunks: the call's deadline and the process's failure.
  Status Continue(const std::string& doing) const {
    if (options_.failures != nullptr) {
      Status failed = options_.failures->failure();
      if (!failed.ok()) return failed.WithContext(Prefix() + ": " + doing);
    }
    if (deadline_.Expired()) {
      return DeadlineExceededError(Prefix() + ": " + doing + ": not done within " +
                                   std::to_string(options_.timeout_ms) + " ms");
    }
    return OkStatus();
  }

  // Reduces slice `own` into `out` (which holds our elements of it already), chunk by chunk,
  // in the ring's order of combination (ring_collectives.cc), so that both give the same bits:
  // the partial result starts as rank r + 1's elements and each rank after it combines its own
  // with it, its own first, up to ours: x_r op (x_{r-1} op (... op (x_{r+2} op x_{r+1}))). So
  // the ranks read different peers at once (r + 1 first). A peer's elements lie at its kFirst
  // address + the slice's offset. The scratch holds the partial result and the chunk read.
  Status ReduceSlice(const Partition& own, uint8_t* out) {
    const int world = options_.world_size;
    const size_t chunk = std::max<size_t>(1, options_.chunk_bytes / element_bytes_);
    const std::string doing = "reducing its slice " + Range(own.offset, own.size);
    if (own.size > 0 && scratch_ == nullptr) scratch_ = self_.TakeScratch();
    for (size_t begin = 0; begin < own.size; begin += chunk) {
      const size_t n = std::min(chunk, own.size - begin);
      const size_t at = (own.offset + begin) * element_bytes_;
      uint8_t* partial = scratch_.get();
      uint8_t* theirs = scratch_.get() + chunk * element_bytes_;
      for (int step = 1; step < world; ++step) {
        RETURN_IF_ERROR(Continue(doing));
        const int q = (options_.rank + step) % world;
        RETURN_IF_ERROR(ReadPeerMemory(Peer(q, kFirst, at), step == 1 ? partial : theirs,
                                       n * element_bytes_)
                            .WithContext(Prefix() + ": " + doing));
        if (step == 1) continue;
        Combine(dtype_, reduce_op_, /*last=*/false, theirs, partial, theirs, n, world);
        std::swap(partial, theirs);
      }
      uint8_t* into = out + begin * element_bytes_;
      Combine(dtype_, reduce_op_, /*last=*/true, into, partial, into, n, world);
    }
    return OkStatus();
  }

  // Reads every peer's slice q into `out` at slice q's offset: from the peer's kFirst address at
  // that offset (peers_whole: the peer's buffer is whole, as in an all-reduce), or from its
  // start (an all-gather's input holds the slice alone).
  Status GatherSlices(uint8_t* out, bool peers_whole) {
    const int world = options_.world_size;
    for (int step = 1; step < world; ++step) {
      const int q = (options_.rank + step) % world;
      const Partition slice = Slice(q);
      if (slice.size == 0) continue;
      const std::string doing = "gathering the slice " + Range(slice.offset, slice.size) +
                                " of " + Worker(q);
      RETURN_IF_ERROR(Continue(doing));
      const size_t at = slice.offset * element_bytes_;
      RETURN_IF_ERROR(ReadPeerMemory(Peer(q, kFirst, peers_whole ? at : 0), out + at,
                                     slice.size * element_bytes_)
                          .WithContext(Prefix() + ": " + doing));
    }
    return OkStatus();
  }

  // A phase (see above), the call's `number`-th. `mine`: how this rank's reads went. Returns
  // `mine` if it failed (the root cause), else the first failed peer's error, quoted. Each rank
  // says it in `number` bytes of (number << 4) | failed, so that the phases of a call (under
  // one tag) differ on the wire in size and in value, and a mix-up is named, never taken for
  // a peer's failure.
  Status Phase(int number, const Status& mine, const std::string& what) {
    const size_t world = static_cast<size_t>(options_.world_size);
    const size_t r = static_cast<size_t>(options_.rank);
    const size_t n = static_cast<size_t>(number);
    const uint8_t said = static_cast<uint8_t>(number << 4);
    std::vector<uint8_t> words(world * n, said);
    std::fill_n(words.begin() + static_cast<ptrdiff_t>(r * n), n,
                static_cast<uint8_t>(said | (mine.ok() ? 0 : 1)));
    Status told = options_.control->AllGather(words.data() + r * n, words.data(), words.size(),
                                              DataType::kUInt8, tensor_, tag_);
    if (!mine.ok()) {
      if (told.ok()) (void)Quote(mine);  // the peers wait for our words
      return mine;
    }
    if (!told.ok()) return told.WithContext(Prefix() + ": after " + what);
    std::optional<size_t> failed;
    for (size_t i = 0; i < words.size(); ++i) {
      if ((words[i] & ~uint8_t{1}) != said) {
        return InternalError(Prefix() + ": after " + what + ": " +
                             Worker(static_cast<int>(i / n)) + "'s word of phase " +
                             std::to_string(number) + " reads " + std::to_string(words[i]) +
                             ", not " + std::to_string(said) + " or " +
                             std::to_string(said | 1) + " (control frames mixed up)");
      }
      if ((words[i] & 1) != 0 && !failed) failed = i / n;
    }
    if (!failed) return OkStatus();
    StatusOr<std::string> quoted = Quote(mine);
    return AbortedError(Prefix() + ": " + Worker(static_cast<int>(*failed)) + " failed " + what +
                        (quoted.ok() && !quoted->empty()
                             ? ": " + *quoted
                             : " (its own error says why; quoting it failed too)"));
  }

  // Every failed rank's message, the first quoted to the others (only after a failure).
  StatusOr<std::string> Quote(const Status& mine) {
    const size_t world = static_cast<size_t>(options_.world_size);
    const size_t r = static_cast<size_t>(options_.rank);
    std::vector<uint8_t> words(world * kQuoteBytes, 0);
    if (!mine.ok()) {
      const std::string text = mine.ToString().substr(0, kQuoteBytes - 1);
      std::memcpy(words.data() + r * kQuoteBytes, text.data(), text.size());
    }
    RETURN_IF_ERROR(options_.control->AllGather(words.data() + r * kQuoteBytes, words.data(),
                                                words.size(), DataType::kUInt8, tensor_, tag_));
    for (size_t q = 0; q < world; ++q) {
      const char* text = reinterpret_cast<const char*>(words.data() + q * kQuoteBytes);
      if (text[0] != '\0') return std::string(text, strnlen(text, kQuoteBytes));
    }
    return std::string();
  }

  DirectReadCollectives& self_;
  const DirectReadCollectivesOptions& options_;
  const CollectiveOp op_;
  const DataType dtype_;
  const ReduceOp reduce_op_;
  const size_t count_;
  const std::string& tensor_;
  const uint64_t tag_;
  const size_t element_bytes_;
  const Deadline deadline_;
  std::vector<int64_t> table_;
  std::unique_ptr<uint8_t[]> scratch_;
};

// ---------------------------------------------------------------------------------------------

StatusOr<std::unique_ptr<DirectReadCollectives>> DirectReadCollectives::Create(
    DirectReadCollectivesOptions options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError("DirectReadCollectivesOptions.rank " +
                                std::to_string(options.rank) + " is not in [0, " +
                                std::to_string(options.world_size) + ")");
  }
  if (options.control == nullptr || options.control->rank() != options.rank ||
      options.control->world_size() != options.world_size) {
    return InvalidArgumentError(
        "DirectReadCollectivesOptions.control: none, or not this rank's of this world");
  }
  if (options.pids.size() != static_cast<size_t>(options.world_size)) {
    return InvalidArgumentError("DirectReadCollectivesOptions.pids: " +
                                std::to_string(options.pids.size()) + " for " +
                                std::to_string(options.world_size) + " ranks");
  }
  if (options.timeout_ms <= 0) {
    return InvalidArgumentError("DirectReadCollectivesOptions.timeout_ms must be positive, not " +
                                std::to_string(options.timeout_ms));
  }
  if (options.chunk_bytes == 0) {
    return InvalidArgumentError("DirectReadCollectivesOptions.chunk_bytes must be positive");
  }
  return std::unique_ptr<DirectReadCollectives>(new DirectReadCollectives(std::move(options)));
}

DirectReadCollectives::DirectReadCollectives(DirectReadCollectivesOptions options)
    : options_(std::move(options)) {}

std::unique_ptr<uint8_t[]> DirectReadCollectives::TakeScratch() {
  {
    std::lock_guard<std::mutex> lock(scratch_mu_);
    if (!scratch_.empty()) {
      std::unique_ptr<uint8_t[]> taken = std::move(scratch_.back());
      scratch_.pop_back();
      return taken;
    }
  }
  // The partial result and the chunk read, each of at most max(chunk_bytes, one element).
  return std::unique_ptr<uint8_t[]>(new uint8_t[2 * (options_.chunk_bytes + 8)]);
}

void DirectReadCollectives::GiveScratch(std::unique_ptr<uint8_t[]> scratch) {
  std::lock_guard<std::mutex> lock(scratch_mu_);
  if (scratch_.size() < 4) scratch_.push_back(std::move(scratch));
}

// A world of one and zero elements go to the ring whole: reads would not speed them up.

Status DirectReadCollectives::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                                        const std::string& tensor, uint64_t tag) {
  if (options_.world_size == 1 || count == 0) {
    return options_.control->AllReduce(data, count, dtype, op, tensor, tag);
  }
  Run run(*this, CollectiveOp::kAllReduce, dtype, op, count, tensor, tag);
  if (Status bad = run.CheckCall(); !bad.ok()) return run.Refuse(bad);
  return run.Blame(run.AllReduce(static_cast<uint8_t*>(data)));
}

Status DirectReadCollectives::ReduceScatter(const void* input, void* output, size_t count,
                                            DataType dtype, ReduceOp op,
                                            const std::string& tensor, uint64_t tag) {
  if (options_.world_size == 1 || count == 0) {
    return options_.control->ReduceScatter(input, output, count, dtype, op, tensor, tag);
  }
  Run run(*this, CollectiveOp::kReduceScatter, dtype, op, count, tensor, tag);
  if (Status bad = run.CheckCall(); !bad.ok()) return run.Refuse(bad);
  return run.Blame(run.ReduceScatter(static_cast<const uint8_t*>(input), static_cast<uint8_t*>(output)));
}

Status DirectReadCollectives::AllGather(const void* input, void* output, size_t count,
                                        DataType dtype, const std::string& tensor,
                                        uint64_t tag) {
  if (options_.world_size == 1 || count == 0) {
    return options_.control->AllGather(input, output, count, dtype, tensor, tag);
  }
  Run run(*this, CollectiveOp::kAllGather, dtype, ReduceOp::kSum, count, tensor, tag);
  if (Status bad = run.CheckCall(); !bad.ok()) return run.Refuse(bad);
  return run.Blame(run.AllGather(static_cast<const uint8_t*>(input), static_cast<uint8_t*>(output)));
}

Status DirectReadCollectives::Broadcast(void* data, size_t count, DataType dtype, int root,
                                        const std::string& tensor, uint64_t tag) {
  return options_.control->Broadcast(data, count, dtype, root, tensor, tag);
}

Status DirectReadCollectives::Barrier(uint64_t tag) { return options_.control->Barrier(tag); }

StatusOr<std::unique_ptr<DirectReadCollectives>> ConnectDirectReads(
    DirectReadCollectivesOptions options, uint64_t tag) {
  if (options.control == nullptr) {
    return InvalidArgumentError("DirectReadCollectivesOptions.control: none");
  }
  ASSIGN_OR_RETURN(DirectReadProbe probe, ProbeDirectReads(*options.control, tag));
  if (!probe.usable) {
    TLOG(WARNING) << "direct reads between this host's ranks are refused, so the ring carries "
                     "every collective: "
                  << probe.refused;
    return std::unique_ptr<DirectReadCollectives>();
  }
  options.pids = std::move(probe.pids);
  return DirectReadCollectives::Create(std::move(options));
}

}  // namespace tessera::worker
