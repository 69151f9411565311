// WorkerRegions: the shared regions (common/transport/shm/shared_region.h) that the job's
// workers on this server's host offered, so their chunks need not cross a socket.
//
// A worker on this host offers a region for this server's chunks (a PsPushPullRequest with
// region_fd >= 0 and no tensors); Map maps it, or says why not (another host, another user, a
// region of the wrong size), and the worker then sends frames as before. A mapped region holds
// two halves of F floats each, F the elements of this server's chunks: the gradients, then
// the values, each chunk at the sum of the sizes of the chunks before it (by chunk index).
// An in-region request (in_region) names its chunks without bytes: Tensors turns them into
// views of the gradients half, which the shard applies like frames, and ReplyInto writes the
// reply's values into the values half and sends the reply without bytes.
//
// Who writes when: the worker writes a chunk's gradients before its request and reads its
// values after the reply; the server reads the gradients and writes the values in between.
// Each request of a worker names each chunk at most once, and a worker sends a chunk's next
// request only after the reply to its last (PsEngine waits for every reply of a step).
//
// Thread-safety: thread-safe.
#ifndef TESSERA_SERVER_PS_WORKER_REGIONS_H_
#define TESSERA_SERVER_PS_WORKER_REGIONS_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/base/status.h"
#include "common/messages/ps_messages.h"
#include "common/training/ps_job.h"
#include "common/transport/shm/shared_region.h"

namespace tessera::server {

class WorkerRegions {
 public:
  using ReplyCallback = std::function<void(PsPushPullReply reply)>;

  // `chunks`: this server's dense chunks.
  explicit WorkerRegions(const std::vector<DenseChunk>& chunks);

  // Maps worker `rank`'s offer (replacing an earlier region of the rank); the reason when it
  // cannot.
  Status Map(int rank, const PsPushPullRequest& offer);
  // The chunks `tensors` names, with their gradients (`push`) as views of worker `rank`'s
  // region; FailedPrecondition when the worker has no region here, InvalidArgument naming a
  // key that is not one of this server's chunks or a chunk named twice.
  StatusOr<std::vector<TensorData>> Tensors(int rank, const std::vector<TensorData>& tensors,
                                            bool push) const;
  // `send`, after it wrote each chunk's values into worker `rank`'s region and dropped them
  // from the reply. REQUIRES: Tensors(rank, ...) succeeded for the request.
  ReplyCallback ReplyInto(int rank, ReplyCallback send) const;

 private:
  struct Place {
    uint64_t offset = 0;  // floats from the start of a half
    uint64_t size = 0;
  };
  std::shared_ptr<SharedRegion> RegionOf(int rank) const;

  uint64_t floats_ = 0;  // F: the elements of this server's chunks
  // Chunk key -> its place in each half; shared with the reply callbacks.
  std::shared_ptr<const std::unordered_map<uint64_t, Place>> places_;
  mutable std::mutex mu_;
  std::map<int, std::shared_ptr<SharedRegion>> regions_;  // by worker rank; guarded by mu_
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_WORKER_REGIONS_H_
