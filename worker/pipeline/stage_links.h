// StageLinks: what a pipeline stage's model (pipeline_mlp.h) needs from the processes around
// it: messages to and from the other ranks of its pipeline group, and sums over its pipeline
// and tensor-parallel groups. An interface, so that worker/pipeline stays below the
// collectives (tools/check_layers.sh): worker/modes/mesh_links.h implements it on a
// DeviceMesh's groups, and tests may implement it in one process.
//
// Every call is made by the group's ranks in the same order (the schedule fixes it), so
// collective calls need no tag from the caller; point-to-point ones are matched by (peer, tag)
// in order. Each call is bounded by the implementation's deadline and its error names `what`.
//
// Thread-safety: the training thread only.
#ifndef TESSERA_WORKER_PIPELINE_STAGE_LINKS_H_
#define TESSERA_WORKER_PIPELINE_STAGE_LINKS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace tessera::worker {

class StageLinks {
 public:
  virtual ~StageLinks() = default;

  virtual int pipeline_rank() const = 0;  // 0 .. P-1
  virtual int pipeline_ranks() const = 0;
  virtual int tensor_rank() const = 0;  // 0 .. T-1
  virtual int tensor_ranks() const = 0;

  // `count` floats to / from pipeline rank `peer`; Send returns once the bytes are queued.
  virtual Status Send(const float* data, size_t count, int peer, uint32_t tag,
                      const std::string& what) = 0;
  virtual Status Recv(float* data, size_t count, int peer, uint32_t tag,
                      const std::string& what) = 0;
  // data[0, count) summed over the pipeline group / the tensor-parallel group, in place.
  virtual Status SumOverPipeline(float* data, size_t count, const std::string& what) = 0;
  virtual Status SumOverTensor(float* data, size_t count, const std::string& what) = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_PIPELINE_STAGE_LINKS_H_
