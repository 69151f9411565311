#include "worker/modes/mesh_links.h"

namespace tessera::worker {
namespace {

constexpr uint64_t kTagRange = 1ull << 30;

}  // namespace

Status MeshLinks::Send(const float* data, size_t count, int peer, uint32_t tag,
                       const std::string& what) {
  return pipeline_->Send(data, count * sizeof(float), peer, tag, what);
}

Status MeshLinks::Recv(float* data, size_t count, int peer, uint32_t tag,
                       const std::string& what) {
  return pipeline_->Recv(data, count * sizeof(float), peer, tag, what);
}

Status MeshLinks::SumOverPipeline(float* data, size_t count, const std::string& what) {
  if (pipeline_->world_size() == 1) return OkStatus();
  return pipeline_->AllReduce(data, count, DataType::kFloat32, ReduceOp::kSum, what,
                              pipeline_calls_++ % kTagRange);
}

Status MeshLinks::SumOverTensor(float* data, size_t count, const std::string& what) {
  if (tensor_->world_size() == 1) return OkStatus();
  return tensor_->AllReduce(data, count, DataType::kFloat32, ReduceOp::kSum, what,
                            tensor_calls_++ % kTagRange);
}

}  // namespace tessera::worker
