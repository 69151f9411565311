// WorkerRegions: the shared regions (common/transport/shm/shared_region.h) that the job's
// workers on this server's host offered, so their chunks need not cross a socket.
//
// A worker on this host offers a region for this server's chunks of one key range (a
// PsPushPullRequest with region_fd >= 0 and no tensors); Map maps it, or says why not (another
// host, another user, a region of the wrong size), and the worker then sends frames as before.
// A mapped region holds 1 + N parts of F floats each, F the elements of the range's chunks:
// the gradients, then N values halves, one per copy of the range that maps the region
// (--replicas N; the offer's region_writers, and region_writer the one this server writes),
// each chunk at the sum of the sizes of the chunks before it (by chunk index). An in-region
// request (in_region) names its chunks without bytes: Tensors turns them into views of the
// gradients, which the shard applies like frames (and the range's primary forwards to a backup
// that mapped the region by naming them, server/ps/dense_shard.h), and ReplyInto writes the
// reply's values into this server's values half and sends the reply without bytes.
//
// Who writes when: the worker writes a chunk's gradients before its request and reads its
// values after the reply, from the half of the copy that answered; the copies read the
// gradients and the one asked writes the values in between (a backup reads a forwarded push's
// gradients before it acknowledges the forward, which holds the primary's reply). Each request
// of a worker names each chunk at most once, and a worker sends a chunk's next request only
// after the reply to its last (PsEngine waits for every reply of a step).
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
  // cannot (InvalidArgument for values halves outside 1 to kMaxWriters, or a writer that is not
  // one of them).
  Status Map(int rank, const PsPushPullRequest& offer);

  // The most copies a region serves (--replicas is at most the servers; this bounds what an
  // offer makes a server map).
  static constexpr int kMaxWriters = 64;
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
  // A worker's mapped region and the values half this server writes (1 to N).
  struct Mapped {
    std::shared_ptr<SharedRegion> region;
    int values_half = 1;
  };
  std::shared_ptr<SharedRegion> RegionOf(int rank) const { return MappedOf(rank).region; }
  Mapped MappedOf(int rank) const;

  uint64_t floats_ = 0;  // F: the elements of this server's chunks
  // Chunk key -> its place in each half; shared with the reply callbacks.
  std::shared_ptr<const std::unordered_map<uint64_t, Place>> places_;
  mutable std::mutex mu_;
  std::map<int, Mapped> regions_;  // by worker rank; guarded by mu_
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_WORKER_REGIONS_H_
