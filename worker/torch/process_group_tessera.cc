#include "worker/torch/process_group_tessera.h"

#include <ATen/ATen.h>
#include <Python.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <utility>

#include "worker/collectives/spin_wait.h"

namespace tessera::worker {
namespace {

// A torch Work completed by the comm thread: its future holds the output tensors or the
// error. Work's own state (completed_, exception_) follows, so wait() and isSuccess() agree.
// wait() polls for completion for up to spin_us before it blocks (CommPool's spin_us, the other
// half of the hand-off). DDP's reducer waits on getFuture() instead, which this cannot reach.
class TesseraWork final : public c10d::Work {
 public:
  TesseraWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, int64_t spin_us)
      : c10d::Work(rank, type),
        spin_us_(spin_us),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override {
    SpinUntil([this] { return isCompleted(); }, spin_us_);
    return c10d::Work::wait(timeout);
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  // The rank a receive's message came from (torch's recv(src=None) returns it); -1 before.
  int sourceRank() const override { return source_rank_.load(); }
  void set_source_rank(int rank) { source_rank_ = rank; }

  void Complete(const Status& status) {
    if (status.ok()) {
      future_->markCompleted(c10::IValue(outputs_));
      finish();
      return;
    }
    // A deadline reads as torch's own timeouts do ("Timed out ..."), which scripts match.
    const std::string text = status.code() == StatusCode::kDeadlineExceeded
                                 ? "Timed out in " + status.message()
                                 : status.ToString();
    auto error = std::make_exception_ptr(std::runtime_error("tessera: " + text));
    future_->setError(error);
    finish(error);
  }

 private:
  const int64_t spin_us_;
  const std::vector<at::Tensor> outputs_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> source_rank_{-1};
};

StatusOr<DataType> DataTypeOf(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kChar: return DataType::kInt8;
    case at::kByte: return DataType::kUInt8;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kBool: return DataType::kBool;
    default: break;
  }
  return InvalidArgumentError(std::string("tensors of ") +
                              c10::toString(tensor.scalar_type()) +
                              " (float32, float64, float16, bfloat16, int8, uint8, int32, "
                              "int64 and bool are supported)");
}

StatusOr<ReduceOp> ReduceOpOf(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::kProduct;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    case c10d::ReduceOp::AVG: return ReduceOp::kAverage;
    default: break;
  }
  return InvalidArgumentError("reduce op " + std::to_string(static_cast<int>(op.op_)) +
                              " (SUM, PRODUCT, MIN, MAX and AVG are supported; not BAND, BOR, "
                              "BXOR or PREMUL_SUM)");
}

// Throws what torch's callers expect (a c10::Error, RuntimeError in Python) unless ok.
void Check(const Status& status, const std::string& what) {
  TORCH_CHECK(status.ok(), "tessera: ", what, ": ", status.message());
}

// "allreduce of 1024 x float32".
std::string Describe(const std::string& op, const at::Tensor& tensor) {
  return op + " of " + std::to_string(tensor.numel()) + " x " + c10::toString(tensor.scalar_type());
}

// The one CPU tensor of `tensors`, and its DataType; throws naming `op` otherwise.
DataType CheckTensor(const at::Tensor& tensor, const std::string& op) {
  TORCH_CHECK(tensor.device().is_cpu(), "tessera: ", op, ": the tensor is on ",
              tensor.device().str(),
              "; the tessera backend takes CPU tensors (copy it to the CPU first)");
  TORCH_CHECK(!tensor.is_sparse(), "tessera: ", op, ": sparse tensors are not supported");
  StatusOr<DataType> dtype = DataTypeOf(tensor);
  Check(dtype.status(), op);
  return *dtype;
}

at::Tensor& Single(std::vector<at::Tensor>& tensors, const std::string& op) {
  TORCH_CHECK(tensors.size() == 1, "tessera: ", op, ": one tensor per rank and call, not ",
              tensors.size());
  CheckTensor(tensors[0], op);
  return tensors[0];
}

// Checks that every tensor of `list` has `like`'s dtype and number of elements.
void CheckLike(const std::vector<at::Tensor>& list, const at::Tensor& like, size_t count,
               const std::string& op, const std::string& which) {
  TORCH_CHECK(list.size() == count, "tessera: ", op, ": ", which, " holds ", list.size(),
              " tensors for a group of ", count);
  for (size_t i = 0; i < list.size(); ++i) {
    CheckTensor(list[i], op);
    TORCH_CHECK(list[i].scalar_type() == like.scalar_type() && list[i].numel() == like.numel(),
                "tessera: ", op, ": ", which, "[", i, "] holds ", list[i].numel(), " x ",
                c10::toString(list[i].scalar_type()), "; the input has ", like.numel(), " x ",
                c10::toString(like.scalar_type()));
  }
}

// Checks that `whole` (the `which` of a _base op) holds `group` x `part`'s elements and dtype.
void CheckGroupSized(const at::Tensor& whole, const char* which, const at::Tensor& part,
                     int group, const std::string& op) {
  TORCH_CHECK(whole.scalar_type() == part.scalar_type() && whole.numel() == part.numel() * group,
              "tessera: ", op, ": the ", which, " holds ", whole.numel(), " x ",
              c10::toString(whole.scalar_type()), "; it must hold ", group, " x ", part.numel(),
              " x ", c10::toString(part.scalar_type()));
}

// The tensor itself if it is contiguous, else a contiguous copy (written back by CopyBack).
at::Tensor Contiguous(const at::Tensor& tensor) {
  return tensor.is_contiguous() ? tensor : tensor.contiguous();
}
void CopyBack(at::Tensor& tensor, const at::Tensor& buffer) {
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

// Every tensor of `list` in order, flattened into one contiguous tensor.
at::Tensor Flatten(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> flat;
  flat.reserve(list.size());
  for (const at::Tensor& tensor : list) flat.push_back(tensor.reshape({-1}));
  return at::cat(flat);
}
// Copies consecutive pieces of `flat` into each tensor of `list`.
void Unflatten(const at::Tensor& flat, std::vector<at::Tensor>& list) {
  int64_t offset = 0;
  for (at::Tensor& tensor : list) {
    tensor.copy_(flat.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
    offset += tensor.numel();
  }
}

// The metrics' name of a c10d op: the base and coalesced forms count as the op itself.
TorchOp TorchOpOf(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return TorchOp::kBroadcast;
    case c10d::OpType::ALLREDUCE:
    case c10d::OpType::ALLREDUCE_COALESCED: return TorchOp::kAllReduce;
    case c10d::OpType::REDUCE: return TorchOp::kReduce;
    case c10d::OpType::ALLGATHER:
    case c10d::OpType::_ALLGATHER_BASE:
    case c10d::OpType::ALLGATHER_COALESCED: return TorchOp::kAllGather;
    case c10d::OpType::GATHER: return TorchOp::kGather;
    case c10d::OpType::SCATTER: return TorchOp::kScatter;
    case c10d::OpType::REDUCE_SCATTER:
    case c10d::OpType::_REDUCE_SCATTER_BASE: return TorchOp::kReduceScatter;
    case c10d::OpType::ALLTOALL:
    case c10d::OpType::ALLTOALL_BASE: return TorchOp::kAllToAll;
    case c10d::OpType::SEND: return TorchOp::kSend;
    case c10d::OpType::RECV:
    case c10d::OpType::RECVANYSOURCE: return TorchOp::kRecv;
    default: return TorchOp::kBarrier;
  }
}

// Runs `body` (which returns its Status, or throws), completes `work` with the outcome and
// records it in `metrics` (if any): the op's time on its thread and its outputs' bytes.
Status Finish(BackendMetrics* metrics, TesseraWork& work, const std::function<Status()>& body) {
  const auto start = std::chrono::steady_clock::now();
  Status status;
  try {
    status = body();
  } catch (const std::exception& e) {
    status = InternalError(e.what());
  }
  if (metrics != nullptr) {
    size_t bytes = 0;
    for (const at::Tensor& tensor : work.result()) bytes += tensor.numel() * tensor.element_size();
    metrics->Record(TorchOpOf(work.retrieveOpType()), bytes,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                    status.ok());
  }
  work.Complete(status);
  return status;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Rendezvous through torch's store

namespace {

class TorchStore final : public RendezvousStore {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  Status Set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      return OkStatus();
    } catch (const std::exception& e) {
      return UnavailableError("the store refused key " + key + ": " + e.what());
    }
  }

  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override {
    try {
      store_->wait({key}, std::chrono::milliseconds(std::max<int64_t>(1, deadline.RemainingMillis())));
      const std::vector<uint8_t> value = store_->get(key);
      return std::string(value.begin(), value.end());
    } catch (const std::exception& e) {
      return DeadlineExceededError("key " + key + " was not set in the store in time: " +
                                   e.what());
    }
  }

 private:
  const c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

ProcessGroupTessera::ProcessGroupTessera(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, std::chrono::milliseconds timeout,
                                         const GroupMemberOptions& defaults,
                                         BackendMetrics* metrics)
    : c10d::ProcessGroup(rank, size),
      timeout_(timeout),
      comm_spin_us_(defaults.comm_spin_us),
      metrics_(metrics) {
  TorchStore rendezvous(store);
  GroupMemberOptions options = defaults;
  options.rank = rank;
  options.world_size = size;
  options.store = &rendezvous;
  options.timeout_ms = timeout.count();
  StatusOr<std::unique_ptr<GroupMember>> member = GroupMember::Join(options);
  Check(member.status(), "joining the process group");
  member_ = std::move(member).value();
  init();
}

ProcessGroupTessera::~ProcessGroupTessera() {
  // The member's threads end before it goes, and what they run last may free a tensor that
  // Python made or complete a future whose callbacks are Python's: both take the GIL. When
  // Python drops the group, this thread holds it, so it lets go while the threads finish.
  PyThreadState* saved =
      Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  // Not member_.reset(): that nulls member_ before the member's destructor joins its threads,
  // and an op already running on one of them reads member_ (a null dereference, seen under
  // ASan in tests/torch/collectives_test's teardown). The member goes while member_ still
  // points at it; its threads are joined before the parts an op uses.
  delete member_.get();
  (void)member_.release();
  if (saved != nullptr) PyEval_RestoreThread(saved);
  ReleaseFinished();  // the threads are gone: what their ops held goes with the group
}

void ProcessGroupTessera::ReleaseFinished() {
  std::vector<FinishedOp> finished;
  {
    std::lock_guard<std::mutex> lock(finished_mu_);
    finished.swap(finished_);
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::Enqueue(c10d::OpType type,
                                                           std::vector<at::Tensor> outputs,
                                                           std::function<Status(int*)> body,
                                                           Queue queue) {
  ReleaseFinished();  // what earlier ops held, on this (the caller's) thread
  auto work = c10::make_intrusive<TesseraWork>(rank_, type, std::move(outputs), comm_spin_us_);
  auto op = std::make_shared<FinishedOp>(FinishedOp{work, std::move(body)});
  std::function<Status()> run = [this, op]() {
    auto& done = static_cast<TesseraWork&>(*op->work);
    const Status status = Finish(metrics_, done, [&] {
      int source = -1;
      RETURN_IF_ERROR(op->body(&source));
      if (source >= 0) done.set_source_rank(source);
      return OkStatus();
    });
    std::lock_guard<std::mutex> lock(finished_mu_);
    finished_.push_back(std::move(*op));  // moved, not released: op keeps nothing
    return status;
  };
  switch (queue) {
    case Queue::kCollective:
      ++sequence_;
      member_->Submit(std::move(run));
      break;
    case Queue::kReceive:
      member_->SubmitRecv(std::move(run));
      break;
    case Queue::kNone:
      (void)run();
      break;
  }
  return work;
}

// ---------------------------------------------------------------------------------------------
// Collectives

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor tensor = Single(tensors, "broadcast");
  const DataType dtype = CheckTensor(tensor, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  const std::string what = Describe("broadcast", tensor);
  return Enqueue(
      c10d::OpType::BROADCAST, {tensor}, [this, tensor, dtype, root, what](int*) mutable {
        at::Tensor buffer = Contiguous(tensor);
        RETURN_IF_ERROR(member_->Broadcast(buffer.data_ptr(), buffer.numel(), dtype, root, what));
        CopyBack(tensor, buffer);
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  at::Tensor tensor = Single(tensors, "allreduce");
  const DataType dtype = CheckTensor(tensor, "allreduce");
  StatusOr<ReduceOp> op = ReduceOpOf(opts.reduceOp);
  Check(op.status(), "allreduce");
  const std::string what = Describe("allreduce", tensor);
  return Enqueue(
      c10d::OpType::ALLREDUCE, {tensor}, [this, tensor, dtype, op = *op, what](int*) mutable {
        at::Tensor buffer = Contiguous(tensor);
        RETURN_IF_ERROR(member_->AllReduce(buffer.data_ptr(), buffer.numel(), dtype, op, what));
        CopyBack(tensor, buffer);
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "tessera: allreduce_coalesced: no tensors");
  const DataType dtype = CheckTensor(tensors[0], "allreduce_coalesced");
  for (const at::Tensor& tensor : tensors) {
    CheckTensor(tensor, "allreduce_coalesced");
    TORCH_CHECK(tensor.scalar_type() == tensors[0].scalar_type(),
                "tessera: allreduce_coalesced: tensors of ", c10::toString(tensor.scalar_type()),
                " and ", c10::toString(tensors[0].scalar_type()), " together");
  }
  StatusOr<ReduceOp> op = ReduceOpOf(opts.reduceOp);
  Check(op.status(), "allreduce_coalesced");
  return Enqueue(
      c10d::OpType::ALLREDUCE_COALESCED, tensors, [this, tensors, dtype, op = *op](int*) mutable {
        at::Tensor flat = Flatten(tensors);
        RETURN_IF_ERROR(member_->AllReduce(flat.data_ptr(), flat.numel(), dtype, op,
                                           Describe("allreduce_coalesced", flat)));
        Unflatten(flat, tensors);
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::reduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::ReduceOptions& opts) {
  at::Tensor tensor = Single(tensors, "reduce");
  const DataType dtype = CheckTensor(tensor, "reduce");
  StatusOr<ReduceOp> op = ReduceOpOf(opts.reduceOp);
  Check(op.status(), "reduce");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "tessera: reduce: root ", root, " is not a rank");
  const std::string what = Describe("reduce", tensor);
  return Enqueue(
      c10d::OpType::REDUCE, {tensor}, [this, tensor, dtype, op = *op, root, what](int*) mutable {
        // An all-reduce; only the root keeps the result (the others' tensors stay as given).
        at::Tensor buffer = rank_ == root ? Contiguous(tensor) : tensor.contiguous().clone();
        RETURN_IF_ERROR(member_->AllReduce(buffer.data_ptr(), buffer.numel(), dtype, op, what));
        if (rank_ == root) CopyBack(tensor, buffer);
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  at::Tensor input = Single(inputs, "allgather");
  const DataType dtype = CheckTensor(input, "allgather");
  TORCH_CHECK(outputs.size() == 1, "tessera: allgather: one output list per rank, not ",
              outputs.size());
  CheckLike(outputs[0], input, static_cast<size_t>(size_), "allgather", "the output list");
  std::vector<at::Tensor> gathered = outputs[0];
  const std::string what = Describe("allgather", input);
  return Enqueue(
      c10d::OpType::ALLGATHER, gathered, [this, input, gathered, dtype, what](int*) mutable {
        at::Tensor in = Contiguous(input);
        at::Tensor flat = at::empty({in.numel() * size_}, in.options());
        RETURN_IF_ERROR(
            member_->AllGather(in.data_ptr(), flat.data_ptr(), in.numel(), dtype, what));
        Unflatten(flat, gathered);
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(!inputs.empty(), "tessera: allgather_coalesced: no input tensors");
  const DataType dtype = CheckTensor(inputs[0], "allgather_coalesced");
  TORCH_CHECK(outputs.size() == static_cast<size_t>(size_),
              "tessera: allgather_coalesced: ", outputs.size(),
              " output lists for a group of ", size_);
  std::vector<at::Tensor> gathered;
  for (size_t r = 0; r < outputs.size(); ++r) {
    TORCH_CHECK(outputs[r].size() == inputs.size(), "tessera: allgather_coalesced: output list ",
                r, " holds ", outputs[r].size(), " tensors for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      CheckTensor(inputs[i], "allgather_coalesced");
      CheckTensor(outputs[r][i], "allgather_coalesced");
      TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type(),
                  "tessera: allgather_coalesced: input ", i, " is ",
                  c10::toString(inputs[i].scalar_type()), ", input 0 ",
                  c10::toString(inputs[0].scalar_type()), " (one dtype per call)");
      TORCH_CHECK(outputs[r][i].scalar_type() == inputs[i].scalar_type() &&
                      outputs[r][i].numel() == inputs[i].numel(),
                  "tessera: allgather_coalesced: output list ", r, " tensor ", i, " holds ",
                  outputs[r][i].numel(), " x ", c10::toString(outputs[r][i].scalar_type()),
                  "; input ", i, " has ", inputs[i].numel(), " x ",
                  c10::toString(inputs[i].scalar_type()));
      gathered.push_back(outputs[r][i]);
    }
  }
  std::vector<at::Tensor> in_list = inputs;
  std::vector<std::vector<at::Tensor>> out_lists = outputs;
  return Enqueue(
      c10d::OpType::ALLGATHER_COALESCED, gathered, [this, in_list, out_lists, dtype](int*) mutable {
        at::Tensor in = Flatten(in_list);
        const std::string what = Describe("allgather_coalesced", in);
        at::Tensor flat = at::empty({in.numel() * size_}, in.options());
        RETURN_IF_ERROR(
            member_->AllGather(in.data_ptr(), flat.data_ptr(), in.numel(), dtype, what));
        for (int r = 0; r < size_; ++r) {
          Unflatten(flat.narrow(0, r * in.numel(), in.numel()), out_lists[r]);
        }
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const DataType dtype = CheckTensor(input, "_allgather_base");
  CheckTensor(output, "_allgather_base");
  CheckGroupSized(output, "output", input, size_, "_allgather_base");
  const std::string what = Describe("allgather", input);
  return Enqueue(
      c10d::OpType::_ALLGATHER_BASE, {output}, [this, input, output, dtype, what](int*) mutable {
        at::Tensor in = Contiguous(input);
        at::Tensor out = Contiguous(output);
        RETURN_IF_ERROR(member_->AllGather(in.data_ptr(), out.data_ptr(), in.numel(), dtype, what));
        CopyBack(output, out);
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  at::Tensor input = Single(inputs, "gather");
  const DataType dtype = CheckTensor(input, "gather");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "tessera: gather: root ", root, " is not a rank");
  std::vector<at::Tensor> gathered;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1, "tessera: gather: the root needs one output list, not ",
                outputs.size());
    CheckLike(outputs[0], input, static_cast<size_t>(size_), "gather", "the output list");
    gathered = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty(), "tessera: gather: only the root (rank ", root,
                ") passes output tensors");
  }
  const std::string what = Describe("gather", input);
  return Enqueue(
      c10d::OpType::GATHER, gathered, [this, input, gathered, dtype, what](int*) mutable {
        at::Tensor in = Contiguous(input);
        at::Tensor flat = at::empty({in.numel() * size_}, in.options());
        RETURN_IF_ERROR(
            member_->AllGather(in.data_ptr(), flat.data_ptr(), in.numel(), dtype, what));
        if (!gathered.empty()) Unflatten(flat, gathered);
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  at::Tensor output = Single(outputs, "scatter");
  const DataType dtype = CheckTensor(output, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "tessera: scatter: root ", root, " is not a rank");
  std::vector<at::Tensor> pieces;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1, "tessera: scatter: the root needs one input list, not ",
                inputs.size());
    CheckLike(inputs[0], output, static_cast<size_t>(size_), "scatter", "the input list");
    pieces = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty(), "tessera: scatter: only the root (rank ", root,
                ") passes input tensors");
  }
  const std::string what = Describe("scatter", output);
  return Enqueue(
      c10d::OpType::SCATTER, {output}, [this, output, pieces, dtype, root, what](int*) mutable {
        // The root's pieces travel to every rank (a broadcast); each keeps its own.
        at::Tensor flat = pieces.empty() ? at::empty({output.numel() * size_}, output.options())
                                         : Flatten(pieces);
        RETURN_IF_ERROR(member_->Broadcast(flat.data_ptr(), flat.numel(), dtype, root, what));
        output.copy_(flat.narrow(0, output.numel() * rank_, output.numel()).view(output.sizes()));
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor output = Single(outputs, "reduce_scatter");
  const DataType dtype = CheckTensor(output, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, "tessera: reduce_scatter: one input list per rank, not ",
              inputs.size());
  CheckLike(inputs[0], output, static_cast<size_t>(size_), "reduce_scatter", "the input list");
  StatusOr<ReduceOp> op = ReduceOpOf(opts.reduceOp);
  Check(op.status(), "reduce_scatter");
  std::vector<at::Tensor> pieces = inputs[0];
  const std::string what = Describe("reduce_scatter", output);
  return Enqueue(
      c10d::OpType::REDUCE_SCATTER, {output},
      [this, output, pieces, dtype, op = *op, what](int*) mutable {
        at::Tensor flat = Flatten(pieces);
        at::Tensor out = Contiguous(output);
        RETURN_IF_ERROR(member_->ReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(), dtype,
                                               op, what));
        CopyBack(output, out);
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const DataType dtype = CheckTensor(output, "_reduce_scatter_base");
  CheckTensor(input, "_reduce_scatter_base");
  CheckGroupSized(input, "input", output, size_, "_reduce_scatter_base");
  StatusOr<ReduceOp> op = ReduceOpOf(opts.reduceOp);
  Check(op.status(), "_reduce_scatter_base");
  const std::string what = Describe("reduce_scatter", output);
  return Enqueue(
      c10d::OpType::_REDUCE_SCATTER_BASE, {output},
      [this, input, output, dtype, op = *op, what](int*) mutable {
        at::Tensor in = Contiguous(input);
        at::Tensor out = Contiguous(output);
        RETURN_IF_ERROR(member_->ReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), dtype,
                                               op, what));
        CopyBack(output, out);
        return OkStatus();
      });
}

namespace {

// Elements per rank of an all-to-all of `tensor` along its first dimension: `splits` rows
// each, or equal parts of the rows when `splits` is empty.
std::vector<size_t> SplitCounts(const at::Tensor& tensor, const std::vector<int64_t>& splits,
                                int world, const std::string& which) {
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  const int64_t per_row = rows == 0 ? 0 : tensor.numel() / rows;
  std::vector<size_t> counts;
  if (splits.empty()) {
    TORCH_CHECK(rows % world == 0, "tessera: alltoall: the ", which, " has ", rows,
                " rows, not a multiple of the group's ", world, " ranks");
    counts.assign(static_cast<size_t>(world), static_cast<size_t>(rows / world * per_row));
    return counts;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == world, "tessera: alltoall: ", splits.size(),
              " ", which, " split sizes for ", world, " ranks");
  int64_t total = 0;
  for (int64_t split : splits) {
    TORCH_CHECK(split >= 0, "tessera: alltoall: a negative ", which, " split size");
    counts.push_back(static_cast<size_t>(split * per_row));
    total += split;
  }
  TORCH_CHECK(total == rows, "tessera: alltoall: the ", which, " split sizes add up to ", total,
              " rows; the tensor has ", rows);
  return counts;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  CheckTensor(input, "alltoall");
  CheckTensor(output, "alltoall");
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "tessera: alltoall: input of ",
              c10::toString(input.scalar_type()), ", output of ",
              c10::toString(output.scalar_type()));
  const std::vector<size_t> send = SplitCounts(input, input_split_sizes, size_, "input");
  const std::vector<size_t> recv = SplitCounts(output, output_split_sizes, size_, "output");
  const std::string what = Describe("alltoall", input);
  return Enqueue(
      c10d::OpType::ALLTOALL_BASE, {output}, [this, input, output, send, recv, what](int*) mutable {
        at::Tensor in = Contiguous(input);
        at::Tensor out = Contiguous(output);
        RETURN_IF_ERROR(member_->AllToAll(in.data_ptr(), send, out.data_ptr(), recv,
                                          in.element_size(), what));
        CopyBack(output, out);
        return OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::alltoall(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ &&
                  static_cast<int>(outputs.size()) == size_,
              "tessera: alltoall: ", inputs.size(), " inputs and ", outputs.size(),
              " outputs for a group of ", size_);
  std::vector<size_t> send, recv;
  for (int q = 0; q < size_; ++q) {
    CheckTensor(inputs[q], "alltoall");
    CheckTensor(outputs[q], "alltoall");
    TORCH_CHECK(inputs[q].scalar_type() == inputs[0].scalar_type() &&
                    outputs[q].scalar_type() == inputs[0].scalar_type(),
                "tessera: alltoall: tensors of different dtypes");
    send.push_back(static_cast<size_t>(inputs[q].numel()));
    recv.push_back(static_cast<size_t>(outputs[q].numel()));
  }
  const std::string what = Describe("alltoall", inputs[0]);
  return Enqueue(
      c10d::OpType::ALLTOALL, outputs, [this, inputs, outputs, send, recv, what](int*) mutable {
        at::Tensor in = Flatten(inputs);
        at::Tensor out = Flatten(outputs);  // the right size and dtype; overwritten
        RETURN_IF_ERROR(member_->AllToAll(in.data_ptr(), send, out.data_ptr(), recv,
                                          in.element_size(), what));
        Unflatten(out, outputs);
        return OkStatus();
      });
}

// ---------------------------------------------------------------------------------------------
// Point to point and barriers

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::send(std::vector<at::Tensor>& tensors,
                                                        int dst, int tag) {
  at::Tensor tensor = Single(tensors, "send");
  const std::string what = Describe("send", tensor) + " to rank " + std::to_string(dst);
  // The bytes are copied as the message is queued: the send is complete at once, and its
  // outcome is in the Work.
  return Enqueue(c10d::OpType::SEND, {tensor}, [this, tensor, dst, tag, what](int*) {
    at::Tensor buffer = Contiguous(tensor);
    return member_->Send(buffer.data_ptr(), buffer.numel() * buffer.element_size(), dst,
                         static_cast<uint32_t>(tag), what);
  }, Queue::kNone);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::recv(std::vector<at::Tensor>& tensors,
                                                        int src, int tag) {
  at::Tensor tensor = Single(tensors, "recv");
  const std::string what = Describe("recv", tensor) + " from rank " + std::to_string(src);
  return Enqueue(c10d::OpType::RECV, {tensor}, [this, tensor, src, tag, what](int* from) mutable {
    at::Tensor buffer = Contiguous(tensor);
    RETURN_IF_ERROR(member_->Recv(buffer.data_ptr(), buffer.numel() * buffer.element_size(), src,
                                  static_cast<uint32_t>(tag), what));
    CopyBack(tensor, buffer);
    *from = src;
    return OkStatus();
  }, Queue::kReceive);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  at::Tensor tensor = Single(tensors, "recv");
  const std::string what = Describe("recv", tensor) + " from any rank by rank " +
                           std::to_string(rank_);
  return Enqueue(
      c10d::OpType::RECVANYSOURCE, {tensor}, [this, tensor, tag, what](int* from) mutable {
        at::Tensor buffer = Contiguous(tensor);
        ASSIGN_OR_RETURN(*from,
                         member_->RecvAny(buffer.data_ptr(), buffer.numel() * buffer.element_size(),
                                          static_cast<uint32_t>(tag), what));
        CopyBack(tensor, buffer);
        return OkStatus();
      }, Queue::kReceive);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTessera::barrier(const c10d::BarrierOptions& opts) {
  return Enqueue(c10d::OpType::BARRIER, {}, [this](int*) { return member_->Barrier("barrier"); });
}

void ProcessGroupTessera::monitoredBarrier(const c10d::BarrierOptions& opts,
                                           bool wait_all_ranks) {
  const int64_t timeout_ms =
      opts.timeout == c10d::kUnsetTimeout ? timeout_.count() : opts.timeout.count();
  Status status = member_
                      ->Submit([this, timeout_ms, wait_all_ranks] {
                        return member_->MonitoredBarrier(timeout_ms, wait_all_ranks);
                      })
                      .get();
  Check(status, "monitored_barrier");
}

void ProcessGroupTessera::setSequenceNumberForGroup() { sequence_ = 0; }

uint64_t ProcessGroupTessera::getSequenceNumberForGroup() { return sequence_.load(); }

}  // namespace tessera::worker
