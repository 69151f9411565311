// CUDA implementation of worker/collectives/nccl/nccl_collectives.h, compiled by nvcc (//third_party/cuda:cuda.bzl).
// nccl_collectives_cpu.cc serves the same header in builds without the toolkit.
//
// Layout of this file: NCCL loaded at run time, and its words for the NCCL error adapter
// (nccl_status.h; CUDA runtime errors go through common/cuda/cuda_status.h); the call descriptor
// of the agreement check; the NcclCollectives class, whose every operation runs as prepare ->
// agree -> execute -> wait; CreateNcclCollectives with the id broadcast.
//
// No kernels of our own: padding and unpadding are cudaMemcpyAsync / cudaMemcpy2DAsync /
// cudaMemsetAsync on the object's stream, ordered with NCCL's kernels by the stream.
#include "worker/collectives/nccl/nccl_collectives.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/logging.h"
#include "common/base/shared_library.h"
#include "common/cuda/cuda_status.h"
#include "worker/collectives/nccl/nccl_status.h"

namespace tessera::worker {
namespace {

// ---- NCCL, loaded at run time -------------------------------------------------------------------
//
// libnccl.so.2 is dlopen'ed when the first communicator is created instead of being linked, as
// cuBLAS is in cuda_backend.cu: the static TLS of a linked library is reserved on every thread's
// stack, which broke civetweb's small fixed-stack threads once already (cuBLAS). NCCL 2.28's TLS
// segment is small (`readelf -lW libnccl.so.2`: MemSiz 0x3000, 12 KiB, and no STATIC_TLS flag,
// so dlopen can place it), but linked it would still be loaded, all ~210 MiB of it, by every
// worker, CPU-only ones included, and a binary that needs it could not start where it is
// missing. Loaded here, it costs nothing where no NCCL communicator is created.
//
// The oldest library accepted: non-blocking communicators (ncclCommInitRankConfig, ncclInProgress,
// ncclCommFinalize) and ncclGetLastError arrived in 2.13/2.14; ncclAvg and bfloat16 before that.
constexpr int kMinNcclVersion = 21400;  // 2.14.0

struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclCommFinalize) comm_finalize = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  int version = 0;  // ncclGetVersion's code, e.g. 22809 for 2.28.9
};

// "2.28.9" for 22809 (the encoding of every version since 2.9).
std::string NcclVersionName(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

StatusOr<const NcclApi*> LoadNccl() {
  static const StatusOr<NcclApi> api = []() -> StatusOr<NcclApi> {
    ASSIGN_OR_RETURN(SharedLibrary shared,
                     SharedLibrary::Open("libnccl.so." + std::to_string(NCCL_MAJOR), "NCCL"));
    const std::string& library = shared.file();
    NcclApi loaded;
    RETURN_IF_ERROR(shared.Bind(&loaded.get_version, "ncclGetVersion"));
    RETURN_IF_ERROR(shared.Bind(&loaded.get_unique_id, "ncclGetUniqueId"));
    RETURN_IF_ERROR(shared.Bind(&loaded.comm_init_rank_config, "ncclCommInitRankConfig"));
    RETURN_IF_ERROR(shared.Bind(&loaded.comm_get_async_error, "ncclCommGetAsyncError"));
    RETURN_IF_ERROR(shared.Bind(&loaded.comm_finalize, "ncclCommFinalize"));
    RETURN_IF_ERROR(shared.Bind(&loaded.comm_destroy, "ncclCommDestroy"));
    RETURN_IF_ERROR(shared.Bind(&loaded.comm_abort, "ncclCommAbort"));
    RETURN_IF_ERROR(shared.Bind(&loaded.get_error_string, "ncclGetErrorString"));
    RETURN_IF_ERROR(shared.Bind(&loaded.get_last_error, "ncclGetLastError"));
    RETURN_IF_ERROR(shared.Bind(&loaded.all_reduce, "ncclAllReduce"));
    RETURN_IF_ERROR(shared.Bind(&loaded.reduce_scatter, "ncclReduceScatter"));
    RETURN_IF_ERROR(shared.Bind(&loaded.all_gather, "ncclAllGather"));
    RETURN_IF_ERROR(shared.Bind(&loaded.broadcast, "ncclBroadcast"));
    if (loaded.get_version(&loaded.version) != ncclSuccess) {
      return UnavailableError(library + ": ncclGetVersion failed");
    }
    if (loaded.version < kMinNcclVersion) {
      return UnavailableError(library + " is NCCL " + NcclVersionName(loaded.version) +
                              "; Tessera needs " + NcclVersionName(kMinNcclVersion) +
                              " or newer (non-blocking communicators)");
    }
    return loaded;
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

// Only called once LoadNccl succeeded (a communicator exists or is being made).
const NcclApi& Nccl() { return **LoadNccl(); }

// ---- Errors -------------------------------------------------------------------------------------

// The adapter's Status (nccl_status.h) for an NCCL call's result, with the loaded library's
// words: its description of the result and its last error message (which often names the peer
// or the system call that failed).
Status NcclCallStatus(ncclResult_t result, std::string_view call, ncclComm_t comm) {
  if (result == ncclSuccess) return OkStatus();
  const char* detail = Nccl().get_last_error(comm);
  return NcclStatus(result, call, Nccl().get_error_string(result),
                    detail != nullptr ? detail : "");
}

// Makes `device` current on the calling thread until destroyed, then restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    status_ = CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice");
    if (status_.ok() && previous_ != device) {
      status_ = CudaStatus(cudaSetDevice(device),
                           "cudaSetDevice(" + std::to_string(device) + ")");
      switched_ = status_.ok();
    }
  }
  ~DeviceScope() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  const Status& status() const { return status_; }

 private:
  Status status_;
  int previous_ = 0;
  bool switched_ = false;
};

ncclDataType_t NcclType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt8: return ncclInt8;
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kBool: return ncclUint8;  // bytes of 0 or 1; NcclOp makes sums ors
  }
  return ncclFloat32;  // unreachable: arguments are checked first
}

// collectives.h's ops: a bool sum is an or (the max of bytes 0 and 1), a bool product an and
// (their min).
ncclRedOp_t NcclOp(ReduceOp op, DataType dtype) {
  if (dtype == DataType::kBool) {
    if (op == ReduceOp::kSum) return ncclMax;
    if (op == ReduceOp::kProduct) return ncclMin;
  }
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAverage: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kProduct: return ncclProd;
  }
  return ncclSum;  // unreachable: arguments are checked first
}

bool ValidDataType(DataType dtype) { return DataTypeSize(dtype) != 0; }
bool ValidReduceOp(ReduceOp op) { return ReduceOpName(op) != "invalid"; }

// InvalidArgument for a reduce op outside the enum, or an average of a non-floating dtype (no
// average of integers or bools, as in the ring backend).
Status CheckReduceOp(ReduceOp op, DataType dtype) {
  if (!ValidReduceOp(op)) return InvalidArgumentError("invalid reduce op");
  if (op == ReduceOp::kAverage && !IsFloatingPoint(dtype)) {
    return InvalidArgumentError("average needs a floating-point dtype (float32, float64, "
                                "float16 or bfloat16), not " + std::string(DataTypeName(dtype)));
  }
  return OkStatus();
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto a_begin = reinterpret_cast<uintptr_t>(a);
  const auto b_begin = reinterpret_cast<uintptr_t>(b);
  return a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

std::string Worker(int rank) { return "worker " + std::to_string(rank); }

// A status code received from a peer; UNKNOWN for a value this build does not know.
StatusCode PeerCode(uint64_t wire) {
  if (wire == 0 || wire > static_cast<uint64_t>(StatusCode::kDataLoss)) return StatusCode::kUnknown;
  const auto code = static_cast<StatusCode>(wire);
  return StatusCodeName(code) == "UNKNOWN" ? StatusCode::kUnknown : code;
}

// ---- The call and its descriptor ----------------------------------------------------------------

enum class OpKind : uint64_t {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kBarrier = 5,
};

std::string OpLabel(uint64_t op) {
  switch (static_cast<OpKind>(op)) {
    case OpKind::kAllReduce: return "allreduce";
    case OpKind::kReduceScatter: return "reducescatter";
    case OpKind::kAllGather: return "allgather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
  }
  return "operation " + std::to_string(op);
}

// Fields that an operation does not have (a broadcast's reduce op, an all-reduce's root).
constexpr uint64_t kNone = ~uint64_t{0};

// What a rank is about to do, as every rank compares it in the agreement check. Plain uint64
// words, all-gathered as ncclUint64: the same on every rank whatever the call, so the exchange
// itself can never mismatch.
struct Descriptor {
  enum Word : size_t {
    kMagic,     // kDescriptorMagic: a peer running another build of this file fails cleanly
    kOp,        // OpKind
    kTag,
    kCount,
    kDtype,     // DataType, or kNone
    kReduce,    // ReduceOp, or kNone
    kRoot,      // or kNone
    kLocal,     // StatusCode of the rank's own checks before the call (0: ready)
    kWords,
  };
  std::array<uint64_t, kWords> word{};
};
constexpr uint64_t kDescriptorMagic = 0x7465737365726131ull;  // "tessera1"

// One operation as called on this rank: the descriptor's fields plus the tensor name, which is
// for messages only (never compared, as in the interface's contract).
struct Call {
  OpKind op;
  uint64_t tag;
  const std::string* tensor;  // may be null (barrier)
  size_t count = 0;
  uint64_t dtype = kNone;
  uint64_t reduce = kNone;
  uint64_t root = kNone;

  // "allreduce tag=42 tensor=layer3.w rank=2"
  std::string Prefix(int rank) const {
    std::string prefix = OpLabel(static_cast<uint64_t>(op)) + " tag=" + std::to_string(tag);
    if (tensor != nullptr && !tensor->empty()) prefix += " tensor=" + *tensor;
    return prefix + " rank=" + std::to_string(rank);
  }

  Descriptor Describe(StatusCode local) const {
    Descriptor d;
    d.word[Descriptor::kMagic] = kDescriptorMagic;
    d.word[Descriptor::kOp] = static_cast<uint64_t>(op);
    d.word[Descriptor::kTag] = tag;
    d.word[Descriptor::kCount] = count;
    d.word[Descriptor::kDtype] = dtype;
    d.word[Descriptor::kReduce] = reduce;
    d.word[Descriptor::kRoot] = root;
    d.word[Descriptor::kLocal] = static_cast<uint64_t>(local);
    return d;
  }
};

// The value of descriptor word `word` as a message shows it.
std::string DescribeWord(size_t word, uint64_t value) {
  switch (word) {
    case Descriptor::kOp: return OpLabel(value);
    case Descriptor::kDtype:
      return value == kNone ? "none" : std::string(DataTypeName(static_cast<DataType>(value)));
    case Descriptor::kReduce:
      return value == kNone ? "none" : std::string(ReduceOpName(static_cast<ReduceOp>(value)));
    case Descriptor::kRoot: return value == kNone ? "none" : std::to_string(value);
    default: return std::to_string(value);
  }
}

const char* WordName(size_t word) {
  switch (word) {
    case Descriptor::kMagic: return "build (descriptor magic)";
    case Descriptor::kOp: return "operation";
    case Descriptor::kTag: return "tag";
    case Descriptor::kCount: return "count";
    case Descriptor::kDtype: return "dtype";
    case Descriptor::kReduce: return "reduce op";
    case Descriptor::kRoot: return "root";
    default: return "field";
  }
}

// ---- Waiting ------------------------------------------------------------------------------------

// Polling: a few hundred cheap queries first (a small collective completes in microseconds),
// then sleeps that double up to 1 ms, so that a long wait costs little CPU and a deadline is
// noticed within about a millisecond.
class Backoff {
 public:
  void Wait() {
    if (++polls_ <= kSpinPolls) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, kMaxSleep);
  }

 private:
  static constexpr int kSpinPolls = 200;
  static constexpr std::chrono::microseconds kMaxSleep{1000};
  int polls_ = 0;
  std::chrono::microseconds sleep_{10};
};

// After an abort, how long the stream gets to drain NCCL's aborted kernels before the call
// returns anyway (so that a failed call still returns within about twice its deadline).
constexpr int64_t kAbortDrainMs = 5000;

// ---- Padding ------------------------------------------------------------------------------------
//
// Reduce-scatter and all-gather when count is not a multiple of W, in these words:
//   block    ceil(count / W) elements: what NCCL gives each rank in a reduce-scatter and takes
//            from each in an all-gather. In the scratch, block q is [q * block, (q + 1) * block).
//   full     the first rem = count mod W ranks: their PartitionOf partitions are exactly a block
//            long and start where their blocks do, so all of them move in one contiguous copy.
//   short    the other W - rem ranks: base = count / W elements, one less than a block, so they
//            move in one strided copy (pitch: base elements in the caller's buffer, block in
//            the scratch); the last element of a short block is padding, zeroed.
//   pad      caller's whole buffer -> scratch blocks; unpad: scratch blocks -> whole buffer.
// Reduce-scatter: pad, ncclReduceScatter in place on the scratch, copy this rank's partition
// out of its block. All-gather: copy this rank's partition into its block (the rest zeroed),
// ncclAllGather in place on the scratch, unpad.
struct Blocks {
  Blocks(size_t count, int world, DataType dtype)
      : w(static_cast<size_t>(world)),
        base(count / w),
        rem(count % w),
        block(base + (rem != 0 ? 1 : 0)),
        es(DataTypeSize(dtype)) {}

  bool padded() const { return rem != 0; }
  size_t scratch_bytes() const { return padded() ? block * w * es : 0; }
  size_t offset_bytes(int rank) const { return static_cast<size_t>(rank) * block * es; }
  size_t shorts_start_bytes() const { return rem * block * es; }

  size_t w;
  size_t base;
  size_t rem;
  size_t block;
  size_t es;  // bytes per element
};

// The argument checks of reduce-scatter and all-gather: `whole` holds count elements, `part`
// this rank's partition `own`; they may overlap only in place (part == whole + own.offset).
Status CheckPartitioned(const char* whole_name, const void* whole, const char* part_name,
                        const void* part, size_t count, DataType dtype, const Partition& own) {
  const size_t es = DataTypeSize(dtype);
  if (es == 0) return InvalidArgumentError("invalid dtype");
  if (whole == nullptr && count > 0) {
    return InvalidArgumentError(std::string(whole_name) + " is null but should hold " +
                                std::to_string(count) + " elements");
  }
  if (part == nullptr && own.size > 0) {
    return InvalidArgumentError(std::string(part_name) + " is null but should hold " +
                                std::to_string(own.size) + " elements");
  }
  if (part != static_cast<const uint8_t*>(whole) + own.offset * es &&
      Overlap(whole, count * es, part, own.size * es)) {
    return InvalidArgumentError(
        "input and output overlap, but not in place (this rank's partition of " +
        std::to_string(own.size) + " elements starts at element " + std::to_string(own.offset) +
        " of the whole buffer)");
  }
  return OkStatus();
}

// ---- NcclCollectives ----------------------------------------------------------------------------

class NcclCollectives final : public Collectives {
 public:
  explicit NcclCollectives(const NcclCollectivesOptions& options)
      : options_(options),
        name_("nccl rank=" + std::to_string(options.rank) + " cuda:" +
              std::to_string(options.device)) {}
  ~NcclCollectives() override;
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  // Creates the stream, the descriptor buffers and the communicator (waiting at most
  // timeout_ms for every rank to join). Called once, before the object is shared.
  Status Init(const ncclUniqueId& id);

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  Status AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                   const std::string& tensor, uint64_t tag) override;
  Status ReduceScatter(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                       const std::string& tensor, uint64_t tag) override;
  Status AllGather(const void* input, void* output, size_t count, DataType dtype,
                   const std::string& tensor, uint64_t tag) override;
  Status Broadcast(void* data, size_t count, DataType dtype, int root, const std::string& tensor,
                   uint64_t tag) override;
  Status Barrier(uint64_t tag) override;

 private:
  // Enqueues an operation's work on stream_ (copies and NCCL calls), having first set *what to
  // the NCCL call for messages; Run waits for it.
  using Execute = std::function<Status(const Deadline& deadline, std::string* what)>;

  // Every operation: take the object (within the deadline), prepare locally (`arguments`, the
  // operation's own checks, then scratch_bytes of scratch), agree with the peers, execute,
  // wait. A failure once the ranks have agreed aborts the communicator. Every error returned
  // starts with the call's prefix ("allreduce tag=42 tensor=w rank=2: ...").
  Status Run(const Call& call, Status arguments, size_t scratch_bytes, const Execute& execute);

  // The agreement check: all-gathers every rank's descriptor and compares them. Returns `local`
  // if this rank failed its own checks, else an error naming the first peer that failed or
  // disagrees. If the exchange itself fails (a timeout, an NCCL error), sets *exchanged = false
  // and returns that error.
  Status Agree(const Call& call, const Status& local, const Deadline& deadline, bool* exchanged);

  // Pad and unpad (see Padding above), enqueued on stream_.
  Status Pad(const Blocks& b, const uint8_t* whole, uint8_t* scratch);
  Status Unpad(const Blocks& b, const uint8_t* scratch, uint8_t* whole);
  Status CopyAsync(void* dst, const void* src, size_t bytes, const char* what);

  // An NCCL call's result: ncclInProgress (the non-blocking communicator is still enqueueing)
  // is waited out, as NCCL requires before anything else touches the stream.
  Status Enqueued(ncclResult_t result, const std::string& call, const Deadline& deadline);
  // Waits until the communicator leaves ncclInProgress (init, enqueue, finalize).
  Status AwaitCommunicator(const std::string& what, const Deadline& deadline);
  // Waits until everything enqueued on stream_ has completed, NCCL reports an error, or the
  // deadline passes.
  Status AwaitStream(const std::string& what, const Deadline& deadline);
  // The DEADLINE_EXCEEDED of both waits.
  Status Timeout(const std::string& what) const;

  // Aborts the communicator after `failure`, keeps it as the root cause that every later call
  // quotes, and returns it (saying that the communicator was aborted).
  Status Fail(const Status& failure);

  // Room for `bytes` in scratch_ (grow-only).
  Status ReserveScratch(size_t bytes);

  const NcclCollectivesOptions options_;
  const std::string name_;  // "nccl rank=1 cuda:0", for log lines

  // Serialises calls (NCCL matches operations by their order). Timed, so that a call waiting
  // for another still keeps its own deadline.
  std::timed_mutex mutex_;
  // The tag of the call holding mutex_, for the message of a call that times out waiting.
  std::atomic<uint64_t> busy_tag_{0};

  // Guarded by mutex_ once Init has returned:
  ncclComm_t comm_ = nullptr;  // null once aborted
  Status broken_;              // the root cause, once the communicator was aborted
  cudaStream_t stream_ = nullptr;
  // W descriptors of Descriptor::kWords words, on the device (all-gathered in place) and in
  // pinned host memory.
  uint64_t* device_descriptors_ = nullptr;
  uint64_t* host_descriptors_ = nullptr;
  float* barrier_value_ = nullptr;  // one float on the device: the barrier's all-reduce
  void* scratch_ = nullptr;         // padding for reduce-scatter and all-gather
  size_t scratch_bytes_ = 0;
};

Status NcclCollectives::Init(const ncclUniqueId& id) {
  DeviceScope scope(options_.device);
  RETURN_IF_ERROR(scope.status());
  const int world = options_.world_size;
  const size_t descriptor_bytes = static_cast<size_t>(world) * Descriptor::kWords * 8;
  Status status = [&]() -> Status {
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags"));
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&device_descriptors_, descriptor_bytes),
                               "cudaMalloc(call descriptors)"));
    RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&host_descriptors_, descriptor_bytes),
                               "cudaMallocHost(call descriptors)"));
    RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&barrier_value_, sizeof(float)), "cudaMalloc(barrier value)"));
    RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(barrier_value_, 0, sizeof(float), stream_),
                               "cudaMemsetAsync(barrier value)"));
    // Non-blocking, so that a rank that never joins cannot hold this thread past the deadline:
    // the call returns at once (ncclInProgress) and AwaitCommunicator polls.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "tessera";
    const Deadline deadline = Deadline::AfterMillis(options_.timeout_ms);
    return Enqueued(Nccl().comm_init_rank_config(&comm_, world, id, options_.rank, &config),
                    "ncclCommInitRankConfig(rank " + std::to_string(options_.rank) + " of " +
                        std::to_string(world) + ")",
                    deadline);
  }();
  if (!status.ok()) {
    // The destructor frees the rest; an aborted communicator is not finalised again.
    if (comm_ != nullptr) (void)Nccl().comm_abort(comm_);
    comm_ = nullptr;
    broken_ = status;
    return status;
  }
  TLOG(INFO) << name_ << ": NCCL " << NcclVersionName(Nccl().version)
             << " communicator ready, " << world << " ranks";
  return OkStatus();
}

NcclCollectives::~NcclCollectives() {
  // Best effort and never aborting the process: a failure here follows an earlier error that
  // was reported where it happened (or the process is going down anyway).
  std::lock_guard<std::timed_mutex> lock(mutex_);
  DeviceScope scope(options_.device);
  if (comm_ != nullptr) {
    // ncclCommFinalize flushes what was issued and may wait for the peers: bounded, then abort.
    const Deadline deadline = Deadline::AfterMillis(options_.timeout_ms);
    const Status finalized = Enqueued(Nccl().comm_finalize(comm_), "ncclCommFinalize", deadline);
    if (finalized.ok()) {
      const Status destroyed = NcclCallStatus(Nccl().comm_destroy(comm_), "ncclCommDestroy", comm_);
      if (!destroyed.ok()) TLOG(ERROR) << name_ << " shutdown: " << destroyed.message();
    } else {
      TLOG(ERROR) << name_ << " shutdown: " << finalized.message() << "; aborting instead";
      (void)Nccl().comm_abort(comm_);
    }
    comm_ = nullptr;
  }
  auto report = [this](const Status& status) {
    if (!status.ok()) TLOG(ERROR) << name_ << " shutdown: " << status.message();
  };
  if (stream_ != nullptr) {
    if (scratch_ != nullptr) {
      report(CudaStatus(cudaFreeAsync(scratch_, stream_), "cudaFreeAsync(scratch)"));
    }
    report(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  }
  if (barrier_value_ != nullptr) {
    report(CudaStatus(cudaFree(barrier_value_), "cudaFree(barrier value)"));
  }
  if (device_descriptors_ != nullptr) {
    report(CudaStatus(cudaFree(device_descriptors_), "cudaFree(call descriptors)"));
  }
  if (host_descriptors_ != nullptr) {
    report(CudaStatus(cudaFreeHost(host_descriptors_), "cudaFreeHost(call descriptors)"));
  }
  if (stream_ != nullptr) report(CudaStatus(cudaStreamDestroy(stream_), "cudaStreamDestroy"));
}

// ---- Waiting, failing, memory ----

Status NcclCollectives::Timeout(const std::string& what) const {
  return DeadlineExceededError(what + " not complete within " +
                               std::to_string(options_.timeout_ms) +
                               " ms: a peer has not made the same call or is hung (NCCL does "
                               "not say which)");
}

Status NcclCollectives::AwaitCommunicator(const std::string& what, const Deadline& deadline) {
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(NcclCallStatus(Nccl().comm_get_async_error(comm_, &state),
                                   "ncclCommGetAsyncError", comm_));
    if (state == ncclSuccess) return OkStatus();
    if (state != ncclInProgress) return NcclCallStatus(state, what, comm_);
    if (deadline.Expired()) return Timeout(what);
    backoff.Wait();
  }
}

Status NcclCollectives::Enqueued(ncclResult_t result, const std::string& call,
                                 const Deadline& deadline) {
  if (result == ncclSuccess) return OkStatus();
  if (result == ncclInProgress) return AwaitCommunicator(call, deadline);
  return NcclCallStatus(result, call, comm_);
}

Status NcclCollectives::AwaitStream(const std::string& what, const Deadline& deadline) {
  Backoff backoff;
  while (true) {
    // NCCL's errors first: a peer that went away shows up there, not in the stream.
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(NcclCallStatus(Nccl().comm_get_async_error(comm_, &state),
                                   "ncclCommGetAsyncError", comm_));
    if (state != ncclSuccess && state != ncclInProgress) {
      return NcclCallStatus(state, what + " (ncclCommGetAsyncError)", comm_);
    }
    const cudaError_t query = cudaStreamQuery(stream_);
    if (query == cudaSuccess) return OkStatus();
    if (query != cudaErrorNotReady) return CudaStatus(query, "cudaStreamQuery after " + what);
    if (deadline.Expired()) return Timeout(what);
    backoff.Wait();
  }
}

Status NcclCollectives::Fail(const Status& failure) {
  const Status cause(failure.code(), failure.message() + "; the NCCL communicator was aborted");
  if (comm_ != nullptr) {
    // Sets NCCL's abort flag, which its kernels poll, then frees the communicator.
    const Status aborted = NcclCallStatus(Nccl().comm_abort(comm_), "ncclCommAbort", nullptr);
    comm_ = nullptr;
    if (!aborted.ok()) TLOG(ERROR) << name_ << ": " << aborted.message();
  }
  // Let the aborted kernels leave the stream, so that the caller's buffers are out of use when
  // the call returns; bounded, since a kernel that ignores the flag must not hang us either.
  const int64_t drain_ms = std::min(options_.timeout_ms, kAbortDrainMs);
  const Deadline drain = Deadline::AfterMillis(drain_ms);
  Backoff backoff;
  cudaError_t query = cudaStreamQuery(stream_);
  while (query == cudaErrorNotReady && !drain.Expired()) {
    backoff.Wait();
    query = cudaStreamQuery(stream_);
  }
  if (query == cudaErrorNotReady) {
    TLOG(ERROR) << name_ << ": the stream still has work " << drain_ms
                << " ms after ncclCommAbort";
  }
  if (broken_.ok()) broken_ = cause;
  TLOG(ERROR) << name_ << ": " << cause.message();
  return cause;
}

Status NcclCollectives::ReserveScratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return OkStatus();
  const size_t capacity = std::max(bytes, 2 * scratch_bytes_);
  // Stream-ordered: no device-wide synchronisation, which could wait on the kernels of another
  // communicator on the device (NCCL warns that this can deadlock).
  if (scratch_ != nullptr) {
    RETURN_IF_ERROR(CudaStatus(cudaFreeAsync(scratch_, stream_), "cudaFreeAsync(scratch)"));
  }
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  const cudaError_t err = cudaMallocAsync(&scratch_, capacity, stream_);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: keep it from resurfacing at a later check
    scratch_ = nullptr;
    return CudaStatus(err, "cudaMallocAsync(padding scratch, " + std::to_string(capacity) +
                               " bytes)");
  }
  scratch_bytes_ = capacity;
  return OkStatus();
}

Status NcclCollectives::CopyAsync(void* dst, const void* src, size_t bytes, const char* what) {
  if (bytes == 0) return OkStatus();
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                    std::string("cudaMemcpyAsync(") + what + ", " + std::to_string(bytes) +
                        " bytes)");
}

Status NcclCollectives::Pad(const Blocks& b, const uint8_t* whole, uint8_t* scratch) {
  RETURN_IF_ERROR(CopyAsync(scratch, whole, b.rem * b.block * b.es, "pad full partitions"));
  const size_t shorts = b.w - b.rem;
  const size_t start = b.shorts_start_bytes();
  if (b.base > 0) {
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy2DAsync(scratch + start, b.block * b.es, whole + start, b.base * b.es,
                          b.base * b.es, shorts, cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpy2DAsync(pad short partitions)"));
  }
  return CudaStatus(cudaMemset2DAsync(scratch + start + b.base * b.es, b.block * b.es, 0, b.es,
                                      shorts, stream_),
                    "cudaMemset2DAsync(zero the padding)");
}

Status NcclCollectives::Unpad(const Blocks& b, const uint8_t* scratch, uint8_t* whole) {
  RETURN_IF_ERROR(CopyAsync(whole, scratch, b.rem * b.block * b.es, "unpad full partitions"));
  if (b.base == 0) return OkStatus();
  const size_t start = b.shorts_start_bytes();
  return CudaStatus(cudaMemcpy2DAsync(whole + start, b.base * b.es, scratch + start,
                                      b.block * b.es, b.base * b.es, b.w - b.rem,
                                      cudaMemcpyDeviceToDevice, stream_),
                    "cudaMemcpy2DAsync(unpad short partitions)");
}

// ---- The shape of every operation ----

Status NcclCollectives::Run(const Call& call, Status arguments, size_t scratch_bytes,
                            const Execute& execute) {
  const Deadline deadline = Deadline::AfterMillis(options_.timeout_ms);
  const std::string prefix = call.Prefix(options_.rank);
  std::unique_lock<std::timed_mutex> lock(mutex_, std::defer_lock);
  if (!lock.try_lock_until(deadline.when())) {
    return DeadlineExceededError(prefix + ": the NCCL communicator stayed busy with tag=" +
                                 std::to_string(busy_tag_.load()) + " for " +
                                 std::to_string(options_.timeout_ms) +
                                 " ms (this backend runs one operation at a time)");
  }
  busy_tag_.store(call.tag);
  if (!broken_.ok()) {
    return FailedPreconditionError(prefix + ": the NCCL communicator was aborted after an " +
                                   "earlier failure: " + broken_.message());
  }
  DeviceScope scope(options_.device);
  RETURN_IF_ERROR(scope.status().WithContext(prefix));

  Status local = std::move(arguments);
  if (local.ok()) local = ReserveScratch(scratch_bytes);
  if (options_.verify_agreement) {
    bool exchanged = true;
    const Status agreed = Agree(call, local, deadline, &exchanged).WithContext(prefix);
    if (!exchanged) return Fail(agreed);
    RETURN_IF_ERROR(agreed);
  } else if (!local.ok()) {
    // Unchecked, the peers have gone ahead with this call: their NCCL queues are now one
    // operation ahead of this rank's, so its communicator cannot be used again.
    return Fail(local.WithContext(prefix));
  }

  std::string what = OpLabel(static_cast<uint64_t>(call.op));
  Status status = execute(deadline, &what);
  if (status.ok()) status = AwaitStream(what, deadline);
  // Once the ranks have agreed, their NCCL queues hold this operation: a failure leaves this
  // rank's communicator out of step with its peers, so it cannot be used again.
  if (!status.ok()) return Fail(status.WithContext(prefix));
  return OkStatus();
}

Status NcclCollectives::Agree(const Call& call, const Status& local, const Deadline& deadline,
                              bool* exchanged) {
  constexpr size_t kWords = Descriptor::kWords;
  const size_t rank = static_cast<size_t>(options_.rank);
  const size_t world = static_cast<size_t>(options_.world_size);
  if (world == 1) return local;  // nobody to disagree with
  const Descriptor own = call.Describe(local.code());
  uint64_t* own_host = host_descriptors_ + rank * kWords;
  uint64_t* own_device = device_descriptors_ + rank * kWords;
  std::memcpy(own_host, own.word.data(), kWords * 8);

  const std::string gather = "ncclAllGather(call descriptors)";
  const Status exchange = [&]() -> Status {
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(own_device, own_host, kWords * 8, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync(call descriptor, host to device)"));
    RETURN_IF_ERROR(Enqueued(
        Nccl().all_gather(own_device, device_descriptors_, kWords, ncclUint64, comm_, stream_),
        gather, deadline));
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host_descriptors_, device_descriptors_,
                                               world * kWords * 8, cudaMemcpyDeviceToHost,
                                               stream_),
                               "cudaMemcpyAsync(call descriptors, device to host)"));
    return AwaitStream(gather, deadline);
  }();
  if (!exchange.ok()) {
    *exchanged = false;
    return exchange;
  }

  if (!local.ok()) return local;
  // A peer's own failure is the root cause of this rank's: report it first.
  for (size_t q = 0; q < world; ++q) {
    const uint64_t* theirs = host_descriptors_ + q * kWords;
    if (q == rank || theirs[Descriptor::kLocal] == 0) continue;
    const StatusCode code = PeerCode(theirs[Descriptor::kLocal]);
    return Status(code, Worker(static_cast<int>(q)) + " failed this call before it started (" +
                            std::string(StatusCodeName(code)) + "; its error says why)");
  }
  for (size_t q = 0; q < world; ++q) {
    if (q == rank) continue;
    const uint64_t* theirs = host_descriptors_ + q * kWords;
    for (size_t w = 0; w < Descriptor::kLocal; ++w) {
      if (theirs[w] == own.word[w]) continue;
      return InvalidArgumentError(Worker(static_cast<int>(q)) + " disagrees on the " +
                                  WordName(w) + ": its call has " + DescribeWord(w, theirs[w]) +
                                  ", this rank's " + DescribeWord(w, own.word[w]));
    }
  }
  return OkStatus();
}

// ---- Operations ----

Status NcclCollectives::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                                  const std::string& tensor, uint64_t tag) {
  const Call call{OpKind::kAllReduce, tag, &tensor, count, static_cast<uint64_t>(dtype),
                  static_cast<uint64_t>(op)};
  Status arguments = OkStatus();
  if (!ValidDataType(dtype)) {
    arguments = InvalidArgumentError("invalid dtype");
  } else if (Status reduce = CheckReduceOp(op, dtype); !reduce.ok()) {
    arguments = std::move(reduce);
  } else if (data == nullptr && count > 0) {
    arguments = InvalidArgumentError("data is null but should hold " + std::to_string(count) +
                                     " elements");
  }
  return Run(call, std::move(arguments), 0, [&](const Deadline& deadline, std::string* what) {
    *what = "ncclAllReduce(count=" + std::to_string(count) + ", " +
            std::string(DataTypeName(dtype)) + ", " + std::string(ReduceOpName(op)) + ")";
    if (count == 0) return OkStatus();
    return Enqueued(
        Nccl().all_reduce(data, data, count, NcclType(dtype), NcclOp(op, dtype), comm_, stream_),
        *what, deadline);
  });
}

Status NcclCollectives::ReduceScatter(const void* input, void* output, size_t count,
                                      DataType dtype, ReduceOp op, const std::string& tensor,
                                      uint64_t tag) {
  const Call call{OpKind::kReduceScatter, tag, &tensor, count, static_cast<uint64_t>(dtype),
                  static_cast<uint64_t>(op)};
  const Partition own = PartitionOf(count, options_.world_size, options_.rank);
  const Blocks b(count, options_.world_size, dtype);
  Status arguments = CheckPartitioned("input", input, "output", output, count, dtype, own);
  if (arguments.ok()) arguments = CheckReduceOp(op, dtype);
  return Run(call, std::move(arguments), b.scratch_bytes(),
             [&](const Deadline& deadline, std::string* what) -> Status {
               *what = "ncclReduceScatter(recvcount=" + std::to_string(b.block) + ", " +
                       std::string(DataTypeName(dtype)) + ", " + std::string(ReduceOpName(op)) +
                       ")";
               if (count == 0) return OkStatus();
               if (!b.padded()) {  // NCCL's blocks are the partitions; its in place is ours
                 return Enqueued(Nccl().reduce_scatter(input, output, b.block, NcclType(dtype),
                                                       NcclOp(op, dtype), comm_, stream_),
                                 *what, deadline);
               }
               auto* scratch = static_cast<uint8_t*>(scratch_);
               uint8_t* own_block = scratch + b.offset_bytes(options_.rank);
               RETURN_IF_ERROR(Pad(b, static_cast<const uint8_t*>(input), scratch));
               RETURN_IF_ERROR(Enqueued(Nccl().reduce_scatter(scratch, own_block, b.block,
                                                              NcclType(dtype),
                                                              NcclOp(op, dtype), comm_, stream_),
                                        *what, deadline));
               return CopyAsync(output, own_block, own.size * b.es, "unpad this rank's partition");
             });
}

Status NcclCollectives::AllGather(const void* input, void* output, size_t count, DataType dtype,
                                  const std::string& tensor, uint64_t tag) {
  const Call call{OpKind::kAllGather, tag, &tensor, count, static_cast<uint64_t>(dtype)};
  const Partition own = PartitionOf(count, options_.world_size, options_.rank);
  const Blocks b(count, options_.world_size, dtype);
  Status arguments = CheckPartitioned("output", output, "input", input, count, dtype, own);
  return Run(call, std::move(arguments), b.scratch_bytes(),
             [&](const Deadline& deadline, std::string* what) -> Status {
               *what = "ncclAllGather(sendcount=" + std::to_string(b.block) + ", " +
                       std::string(DataTypeName(dtype)) + ")";
               if (count == 0) return OkStatus();
               if (!b.padded()) {
                 return Enqueued(Nccl().all_gather(input, output, b.block, NcclType(dtype),
                                                   comm_, stream_),
                                 *what, deadline);
               }
               auto* scratch = static_cast<uint8_t*>(scratch_);
               uint8_t* own_block = scratch + b.offset_bytes(options_.rank);
               RETURN_IF_ERROR(
                   CopyAsync(own_block, input, own.size * b.es, "pad this rank's partition"));
               if (own.size < b.block) {
                 RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(own_block + own.size * b.es, 0,
                                                            (b.block - own.size) * b.es, stream_),
                                            "cudaMemsetAsync(zero the padding)"));
               }
               RETURN_IF_ERROR(Enqueued(Nccl().all_gather(own_block, scratch, b.block,
                                                          NcclType(dtype), comm_, stream_),
                                        *what, deadline));
               return Unpad(b, scratch, static_cast<uint8_t*>(output));
             });
}

Status NcclCollectives::Broadcast(void* data, size_t count, DataType dtype, int root,
                                  const std::string& tensor, uint64_t tag) {
  const Call call{OpKind::kBroadcast, tag, &tensor, count, static_cast<uint64_t>(dtype), kNone,
                  static_cast<uint64_t>(static_cast<int64_t>(root))};
  Status arguments = OkStatus();
  if (!ValidDataType(dtype)) {
    arguments = InvalidArgumentError("invalid dtype");
  } else if (root < 0 || root >= options_.world_size) {
    arguments = InvalidArgumentError("root " + std::to_string(root) +
                                     " is not a rank of this world of " +
                                     std::to_string(options_.world_size));
  } else if (data == nullptr && count > 0) {
    arguments = InvalidArgumentError("data is null but should hold " + std::to_string(count) +
                                     " elements");
  }
  return Run(call, std::move(arguments), 0, [&](const Deadline& deadline, std::string* what) {
    *what = "ncclBroadcast(count=" + std::to_string(count) + ", " +
            std::string(DataTypeName(dtype)) + ", root=" + std::to_string(root) + ")";
    if (count == 0) return OkStatus();
    return Enqueued(Nccl().broadcast(data, data, count, NcclType(dtype), root, comm_, stream_),
                    *what, deadline);
  });
}

Status NcclCollectives::Barrier(uint64_t tag) {
  const Call call{OpKind::kBarrier, tag, nullptr};
  return Run(call, OkStatus(), 0, [&](const Deadline& deadline, std::string* what) {
    *what = "ncclAllReduce(barrier, 1 element)";
    return Enqueued(Nccl().all_reduce(barrier_value_, barrier_value_, 1, ncclFloat32, ncclSum,
                                      comm_, stream_),
                    *what, deadline);
  });
}

// ---- Creation ----

// The host Broadcast's payload, one float per value so that any host backend carries it exactly
// (every value is a small integer): [0] rank 0's state (0: ready, else the StatusCode of its
// local failure), [1] rank 0's NCCL version code, [2..] the ncclUniqueId, one byte per float.
constexpr size_t kIdPayloadHeader = 2;
constexpr size_t kIdPayloadCount = kIdPayloadHeader + sizeof(ncclUniqueId);

Status CheckOptions(const NcclCollectivesOptions& options, const Collectives* host) {
  const std::string field = "NcclCollectivesOptions.";
  if (options.world_size < 1) {
    return InvalidArgumentError(field + "world_size=" + std::to_string(options.world_size) +
                                ": must be at least 1");
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError(field + "rank=" + std::to_string(options.rank) +
                                ": must be in [0, world_size=" +
                                std::to_string(options.world_size) + ")");
  }
  if (options.device < 0) {
    return InvalidArgumentError(field + "device=" + std::to_string(options.device) +
                                ": must be a CUDA device index (>= 0)");
  }
  if (options.timeout_ms <= 0) {
    return InvalidArgumentError(field + "timeout_ms=" + std::to_string(options.timeout_ms) +
                                ": must be positive");
  }
  if (options.world_size > 1) {
    if (host == nullptr) {
      return InvalidArgumentError("CreateNcclCollectives: no host collectives to distribute the "
                                  "NCCL id over, with world_size=" +
                                  std::to_string(options.world_size));
    }
    if (host->world_size() != options.world_size || host->rank() != options.rank) {
      return InvalidArgumentError(
          "CreateNcclCollectives: the host collectives are rank " + std::to_string(host->rank()) +
          " of " + std::to_string(host->world_size()) + ", the options rank " +
          std::to_string(options.rank) + " of " + std::to_string(options.world_size));
    }
  }
  return OkStatus();
}

// What a rank can check alone: a device, the library, and on rank 0 the id.
Status PrepareLocally(const NcclCollectivesOptions& options, ncclUniqueId* id) {
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (count == 0) return UnavailableError("cudaGetDeviceCount: the CUDA runtime reports no device");
  if (options.device >= count) {
    return InvalidArgumentError("NcclCollectivesOptions.device=" +
                                std::to_string(options.device) +
                                ": out of range: this machine has " + std::to_string(count) +
                                " CUDA device(s)");
  }
  RETURN_IF_ERROR(LoadNccl().status());
  if (options.rank == 0) {
    RETURN_IF_ERROR(NcclCallStatus(Nccl().get_unique_id(id), "ncclGetUniqueId", nullptr));
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(const NcclCollectivesOptions& options,
                                                             Collectives* host) {
  RETURN_IF_ERROR(CheckOptions(options, host));
  const std::string context = "nccl init rank=" + std::to_string(options.rank) + " of " +
                              std::to_string(options.world_size) + " on cuda:" +
                              std::to_string(options.device);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  const Status local = PrepareLocally(options, &id);

  if (options.world_size > 1) {
    // Every rank takes part even after a local failure, so that rank 0's reaches the others now
    // rather than as a timeout.
    std::vector<float> payload(kIdPayloadCount, 0.0f);
    if (options.rank == 0) {
      payload[0] = static_cast<float>(static_cast<int>(local.code()));
      payload[1] = local.ok() ? static_cast<float>(Nccl().version) : 0.0f;
      const auto* bytes = reinterpret_cast<const unsigned char*>(&id);
      for (size_t i = 0; i < sizeof(id); ++i) {
        payload[kIdPayloadHeader + i] = static_cast<float>(bytes[i]);
      }
    }
    const Status sent =
        host->Broadcast(payload.data(), payload.size(), DataType::kFloat32, /*root=*/0,
                        "nccl_unique_id", options.bootstrap_tag);
    RETURN_IF_ERROR(local.WithContext(context));
    RETURN_IF_ERROR(
        sent.WithContext(context + ": distributing the NCCL id over the host collectives"));
    if (options.rank != 0) {
      const float state = payload[0];
      if (state != 0.0f) {
        const StatusCode code = PeerCode(static_cast<uint64_t>(state));
        return Status(code, context + ": " + Worker(0) + " could not set up NCCL (" +
                                std::string(StatusCodeName(code)) + "; its error says why)");
      }
      const int root_version = static_cast<int>(payload[1]);
      if (root_version != Nccl().version) {
        return FailedPreconditionError(context + ": " + Worker(0) + " loaded NCCL " +
                                       NcclVersionName(root_version) + ", this rank NCCL " +
                                       NcclVersionName(Nccl().version) +
                                       ": every rank must load the same version");
      }
      auto* bytes = reinterpret_cast<unsigned char*>(&id);
      for (size_t i = 0; i < sizeof(id); ++i) {
        bytes[i] = static_cast<unsigned char>(payload[kIdPayloadHeader + i]);
      }
    }
  } else {
    RETURN_IF_ERROR(local.WithContext(context));
  }

  auto collectives = std::make_unique<NcclCollectives>(options);
  RETURN_IF_ERROR(collectives->Init(id).WithContext(context));
  return std::unique_ptr<Collectives>(std::move(collectives));
}

bool IsDeviceMemory(const void* pointer) {
  if (pointer == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    // No driver or device, or memory CUDA does not know: host memory to us. The error is not
    // sticky; keep it from resurfacing at a later check.
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace tessera::worker
