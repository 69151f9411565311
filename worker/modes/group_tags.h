// GroupTags: an engine's collectives on a group of the world (a Communicator made by Split or
// a DeviceMesh), with the engine's world-sized tags folded into the group's range.
//
// The engines' tags are the world's, up to 2^61; a group takes tags below 2^32
// (communicator.h). GroupTags folds each of the engine's ranges into a quarter of that: the
// setup's (below 2^44) as they are, the collectives' (from 2^44), the stop agreements' (from
// 2^59) and the checkpoints' (from 2^60) modulo 2^30 above their quarter's start. Tags of one
// range wrap only after 2^30 calls, long after the calls that shared them have finished.
// Used by --mode hsdp (its shard and replicate groups) and by the data-parallel groups of
// pipeline and tensor parallelism (ring_strategy.h).
//
// Thread-safety: as the communicator's.
#ifndef TESSERA_WORKER_MODES_GROUP_TAGS_H_
#define TESSERA_WORKER_MODES_GROUP_TAGS_H_

#include <memory>
#include <string>

#include "worker/collectives/collectives.h"
#include "worker/collectives/communicator.h"

namespace tessera::worker {

class GroupTags final : public Collectives {
 public:
  // Owns `group`.
  explicit GroupTags(std::unique_ptr<Communicator> group)
      : owned_(std::move(group)), group_(owned_.get()) {}
  // Borrows `group`, which must outlive this.
  explicit GroupTags(Communicator* group) : group_(group) {}

  int rank() const override { return group_->rank(); }
  int world_size() const override { return group_->world_size(); }
  Status AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                   const std::string& tensor, uint64_t tag) override;
  Status ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                       ReduceOp op, const std::string& tensor, uint64_t tag) override;
  Status AllGather(const void* input, void* output, size_t count, DataType dtype,
                   const std::string& tensor, uint64_t tag) override;
  Status Broadcast(void* data, size_t count, DataType dtype, int root, const std::string& tensor,
                   uint64_t tag) override;
  Status Barrier(uint64_t tag) override;

  // The group's tag for the engine's `tag`.
  static uint64_t Folded(uint64_t tag);

 private:
  const std::unique_ptr<Communicator> owned_;
  Communicator* const group_;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_GROUP_TAGS_H_
