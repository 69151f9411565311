// ProcessGroupTessera: the "tessera" torch.distributed backend, a c10d::ProcessGroup (torch
// 1.13) over a GroupMember (group_member.h): Tessera's ring and point-to-point messages.
//
//   import tessera.torch            # registers the backend (tessera/torch/__init__.py)
//   dist.init_process_group("tessera", init_method="env://")
//
// Every operation is asynchronous: it returns a Work completed by the member's comm thread
// (receives by its receive thread), whose future carries the output tensors, so DDP's
// bucketed overlap and communication hooks work. Tensors are CPU tensors of float32,
// float64, float16, bfloat16, int8, uint8, int32, int64 or bool, contiguous or not (a
// non-contiguous one is copied to a contiguous one and back); one tensor per rank and call.
// Anything else is refused at the call, with a RuntimeError saying what and why.
//
// A failure (a peer that died or disagrees, a timeout) completes the Work with a RuntimeError
// naming the operation, the rank and the peer; every rank of the group gets one.
//
// Thread-safety: as c10d requires of a process group: calls from any thread; collectives
// must be issued in the same order on every rank.
#ifndef TESSERA_WORKER_TORCH_PROCESS_GROUP_TESSERA_H_
#define TESSERA_WORKER_TORCH_PROCESS_GROUP_TESSERA_H_

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/torch/backend_metrics.h"
#include "worker/torch/group_member.h"

namespace tessera::worker {

class ProcessGroupTessera final : public c10d::ProcessGroup {
 public:
  // Joins the group through `store` (torch's PrefixStore of this group): throws a c10::Error
  // naming what failed (a peer that never published its address within `timeout`, ...).
  // Each finished op is recorded in `metrics` unless it is null; it must outlive the group.
  ProcessGroupTessera(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout, const GroupMemberOptions& defaults,
                      BackendMetrics* metrics);
  ~ProcessGroupTessera() override;

  const std::string getBackendName() const override { return "tessera"; }
  // The ring's channel, as set up: "shm (shared-memory rings ...)", "links (...)", ...
  const std::string& channel_description() const { return member_->channel_description(); }
  // What the process's groups share (group_member.h): the default group's is every later
  // new_group's.
  const std::shared_ptr<GroupHost>& host() const { return member_->host(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  // One allgather of every input tensor (of one dtype); outputs[r] receives rank r's inputs.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  // Receives the next message with `tag` from whichever rank sends first; the Work's
  // sourceRank() names it (torch's recv(src=None)).
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

 private:
  // Where an op runs: on the comm thread (collectives, in order), the receive thread, or at
  // once on the caller's (a send, whose bytes are copied as it is queued).
  enum class Queue { kCollective, kReceive, kNone };
  // Every op goes through here: a Work of `type` whose result is `outputs`, completed with
  // what `body` returns (body sets *source_rank for a receive) and recorded in the metrics.
  c10::intrusive_ptr<c10d::Work> Enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         std::function<Status(int* source_rank)> body,
                                         Queue queue = Queue::kCollective);

  // What a finished op held: its Work and its body, whose captures are the op's tensors. The
  // comm thread does not drop them: when the caller has let go of its own references, the
  // last one frees a tensor whose Python object takes the GIL, which contends with the
  // caller, and while the interpreter exits ends the thread (std::terminate, seen at the exit
  // of FSDP ranks). Released on a caller's thread: at the next op, or with the group.
  struct FinishedOp {
    c10::intrusive_ptr<c10d::Work> work;
    std::function<Status(int*)> body;
  };
  void ReleaseFinished();

  const std::chrono::milliseconds timeout_;
  const int64_t comm_spin_us_;     // GroupMemberOptions::comm_spin_us: a Work's wait() polls
  BackendMetrics* const metrics_;  // may be null
  std::unique_ptr<GroupMember> member_;
  std::atomic<uint64_t> sequence_{0};  // collectives issued (getSequenceNumberForGroup)
  std::mutex finished_mu_;
  std::vector<FinishedOp> finished_;  // guarded by finished_mu_
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_PROCESS_GROUP_TESSERA_H_
