// MeshLinks: StageLinks (worker/pipeline/stage_links.h) on the "pp" and "tp" groups of a
// DeviceMesh ("dp", "pp", "tp"): messages between pipeline ranks through the pp group's
// Send / Recv, sums through each group's AllReduce. Collective tags count the calls on each
// group (every rank of a group makes them in the same order), modulo 2^30.
//
// Thread-safety: the training thread only.
#ifndef TESSERA_WORKER_MODES_MESH_LINKS_H_
#define TESSERA_WORKER_MODES_MESH_LINKS_H_

#include <cstdint>
#include <string>

#include "worker/collectives/communicator.h"
#include "worker/pipeline/stage_links.h"

namespace tessera::worker {

class MeshLinks final : public StageLinks {
 public:
  // The groups must outlive this.
  MeshLinks(Communicator* pipeline, Communicator* tensor)
      : pipeline_(pipeline), tensor_(tensor) {}

  int pipeline_rank() const override { return pipeline_->rank(); }
  int pipeline_ranks() const override { return pipeline_->world_size(); }
  int tensor_rank() const override { return tensor_->rank(); }
  int tensor_ranks() const override { return tensor_->world_size(); }
  Status Send(const float* data, size_t count, int peer, uint32_t tag,
              const std::string& what) override;
  Status Recv(float* data, size_t count, int peer, uint32_t tag,
              const std::string& what) override;
  Status SumOverPipeline(float* data, size_t count, const std::string& what) override;
  Status SumOverTensor(float* data, size_t count, const std::string& what) override;

 private:
  Communicator* const pipeline_;
  Communicator* const tensor_;
  uint64_t pipeline_calls_ = 0, tensor_calls_ = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_MESH_LINKS_H_
