// Checkpoints of this server's part of a ps-* job: its DenseShard and SparseTables as one shard
// file, "server-<rank>.ckpt" in the step's directory (common/training/checkpoint.h), with the
// entries "chunk<index>.values", "chunk<index>.state" (float32), "<table>.ids" (int64),
// "<table>.values" and "<table>.state" (float32). Worker rank 0 commits the manifest once every
// server wrote its shard, and names the step to restore.
//
// Thread-safety: both functions may run while requests are served; each chunk and table is
// read or replaced under its own lock (so outside ps-sync a shard mixes the updates of
// different moments, as a running ps-async job has no single moment to save).
#ifndef TESSERA_SERVER_PS_SHARD_CHECKPOINT_H_
#define TESSERA_SERVER_PS_SHARD_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/messages/tensor_data.h"
#include "common/training/checkpoint.h"
#include "common/training/ps_job.h"
#include "server/ps/dense_shard.h"
#include "server/ps/sparse_tables.h"

namespace tessera::server {

// What a checkpoint reads and replaces: one job's parts on this server. Not owned.
struct ShardParts {
  const PsJobConfig* config = nullptr;
  int server_rank = 0;
  int num_servers = 1;
  DenseShard* dense = nullptr;
  SparseTables* tables = nullptr;
};

// How long SaveShard waits for the step it names to be applied everywhere.
inline constexpr int64_t kCheckpointWaitMs = 60000;

// "server-1.ckpt".
std::string ShardFileName(int server_rank);

// Writes this server's shard of `step` under `root` (creating the step's directory). In
// ps-sync it first waits until every chunk and table applied `step`: DeadlineExceeded naming
// one that has not after `wait_ms`; FailedPrecondition naming one that applied a later step
// (the shard would not be of `step`).
StatusOr<ShardFileInfo> SaveShard(const ShardParts& parts, const std::string& root, int64_t step,
                                  int64_t wait_ms = kCheckpointWaitMs);

// Loads this server's shard of `step`. Every check comes before anything changes: the
// manifest's placement against the job's (FailedPrecondition naming both), this server's file
// in it (DataLoss), the file's size and checksum and its entries' presence and sizes (DataLoss
// naming the file and entry), the tables' rows (InvalidArgument naming the table and file).
// Then every chunk and table takes the saved values and restarts at `step`.
StatusOr<ShardFileInfo> RestoreShard(const ShardParts& parts, const std::string& root,
                                     int64_t step);

// A range copied to a server that joined in a failed one's place (ps_service.h): SaveShard's
// shard of `step` (the same waits and checks) as tensors, one per entry (float32 or int64),
// instead of a file; and LoadShard's restore from such tensors (`from` names their source in
// errors). Nothing changes unless every entry checks.
// With `forward_to` (ps-async and ps-ssp, else FailedPrecondition): the copy is
// DenseShard::CopyTo's and SparseTables::CopyTo's, for server `forward_rank` at that address,
// and the entries "chunk<index>.clocks" and "<table>.clocks" (int64: the part's version, then
// each worker's clock) restore each part's place in the updates.
StatusOr<std::vector<TensorData>> CopyShard(const ShardParts& parts, int64_t step,
                                            const std::string& forward_to = std::string(),
                                            int forward_rank = -1,
                                            int64_t wait_ms = kCheckpointWaitMs);
Status LoadShardCopy(const ShardParts& parts, const std::vector<TensorData>& tensors,
                     int64_t step, const std::string& from);

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_SHARD_CHECKPOINT_H_
