#include "worker/modes/group_tags.h"

namespace tessera::worker {

uint64_t GroupTags::Folded(uint64_t tag) {
  constexpr uint64_t kQuarter = 1ull << 30;
  const uint64_t within = tag % kQuarter;
  if (tag >= (1ull << 60)) return 3 * kQuarter + within;
  if (tag >= (1ull << 59)) return 2 * kQuarter + within;
  if (tag >= (1ull << 44)) return kQuarter + within;
  return within;
}

Status GroupTags::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op,
                            const std::string& tensor, uint64_t tag) {
  return group_->AllReduce(data, count, dtype, op, tensor, Folded(tag));
}

Status GroupTags::ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                                ReduceOp op, const std::string& tensor, uint64_t tag) {
  return group_->ReduceScatter(input, output, count, dtype, op, tensor, Folded(tag));
}

Status GroupTags::AllGather(const void* input, void* output, size_t count, DataType dtype,
                            const std::string& tensor, uint64_t tag) {
  return group_->AllGather(input, output, count, dtype, tensor, Folded(tag));
}

Status GroupTags::Broadcast(void* data, size_t count, DataType dtype, int root,
                            const std::string& tensor, uint64_t tag) {
  return group_->Broadcast(data, count, dtype, root, tensor, Folded(tag));
}

Status GroupTags::Barrier(uint64_t tag) { return group_->Barrier(Folded(tag)); }

}  // namespace tessera::worker
