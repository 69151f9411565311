#include "server/ps/shard_checkpoint.h"

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/logging.h"

namespace tessera::server {
namespace {

// How often a ps-sync save looks again at the versions it waits for.
constexpr int64_t kBehindPollMs = 2;

std::string ChunkEntry(uint64_t index) { return "chunk" + std::to_string(index); }

// The first chunk or table whose version is below `step` ("chunk 3", "table 'emb.0'").
std::string FirstBehind(const ShardParts& parts, int64_t step) {
  std::string behind = parts.dense->FirstBehind(step);
  return behind.empty() ? parts.tables->FirstBehind(step) : behind;
}

// The first chunk or table whose version is above `step` ("chunk 3 (at step 8)").
std::string FirstAhead(const ShardParts& parts, int64_t step) {
  std::string ahead = parts.dense->FirstAhead(step);
  return ahead.empty() ? parts.tables->FirstAhead(step) : ahead;
}

// The shard of `step` (see SaveShard); with `forward_to`, CopyShard's copy for a joined server.
StatusOr<CheckpointShard> TakeShard(const ShardParts& parts, int64_t step, int64_t wait_ms,
                                    const std::string& forward_to = std::string()) {
  if (parts.config->consistency == PsConsistency::kSync) {
    const Deadline deadline = Deadline::AfterMillis(wait_ms);
    std::string behind = FirstBehind(parts, step);
    while (!behind.empty() && !deadline.Expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kBehindPollMs));
      behind = FirstBehind(parts, step);
    }
    if (!behind.empty()) {
      return DeadlineExceededError("checkpoint of step " + std::to_string(step) + ": " + behind +
                                   " has not applied that step after " +
                                   std::to_string(wait_ms) + " ms");
    }
  }
  CheckpointShard shard;
  for (auto& [index, saved] :
       forward_to.empty() ? parts.dense->Snapshot() : parts.dense->CopyTo(forward_to)) {
    shard.floats[ChunkEntry(index) + ".values"] = std::move(saved.values);
    shard.floats[ChunkEntry(index) + ".state"] = std::move(saved.state);
    if (!forward_to.empty()) {
      std::vector<int64_t>& clocks = shard.ints[ChunkEntry(index) + ".clocks"];
      clocks.push_back(saved.version);
      clocks.insert(clocks.end(), saved.clocks.begin(), saved.clocks.end());
    }
  }
  for (auto& [name, rows] :
       forward_to.empty() ? parts.tables->Snapshot() : parts.tables->CopyTo(forward_to)) {
    shard.ints[name + ".ids"] = std::move(rows.ids);
    shard.floats[name + ".values"] = std::move(rows.values);
    shard.floats[name + ".state"] = std::move(rows.state);
    if (!forward_to.empty()) {
      std::vector<int64_t>& clocks = shard.ints[name + ".clocks"];
      clocks.push_back(rows.version);
      clocks.insert(clocks.end(), rows.clocks.begin(), rows.clocks.end());
    }
  }
  if (parts.config->consistency == PsConsistency::kSync) {
    // Versions only grow: at `step` or more before the snapshot and at most `step` after it,
    // every part was exactly at `step` while it was copied, so the shards of all servers are
    // one step (nothing applies step + 1 without the push of the worker that asked for this
    // checkpoint, unless the workers disagree on where they are).
    const std::string ahead = FirstAhead(parts, step);
    if (!ahead.empty()) {
      return FailedPreconditionError("checkpoint of step " + std::to_string(step) + ": " +
                                     ahead + " has applied a later step; a ps-sync checkpoint "
                                     "holds one step on every server");
    }
  }
  return shard;
}

// Checks `shard` (read from `from`) against the job, then every chunk and table takes its
// values and restarts at `step`.
Status LoadShard(const ShardParts& parts, CheckpointShard shard, int64_t step,
                 const std::string& from) {
  const PsJobConfig& config = *parts.config;
  // An entry of `size` floats (0: any size).
  auto take = [&](const std::string& name, size_t size) -> StatusOr<std::vector<float>> {
    auto it = shard.floats.find(name);
    if (it == shard.floats.end() || (size > 0 && it->second.size() != size)) {
      return DataLossError(from + ": entry '" + name + "' is missing or has the wrong size");
    }
    return std::move(it->second);
  };
  // A copy for a joined server (ps-async, ps-ssp): entry "<part>.clocks" holds the part's
  // version, then each worker's clock. None: the part restarts at `step`.
  auto take_clocks = [&](const std::string& part, int64_t* version,
                         std::vector<int64_t>* clocks) -> Status {
    auto it = shard.ints.find(part + ".clocks");
    if (it == shard.ints.end()) return OkStatus();
    if (it->second.size() != static_cast<size_t>(config.num_workers) + 1) {
      return DataLossError(from + ": entry '" + it->first + "' holds " +
                           std::to_string(it->second.size()) + " numbers; a version and " +
                           std::to_string(config.num_workers) + " clocks expected");
    }
    *version = it->second[0];
    clocks->assign(it->second.begin() + 1, it->second.end());
    return OkStatus();
  };
  // Everything is checked before anything changes.
  std::map<uint64_t, ChunkState> chunks;
  for (const DenseChunk& chunk : parts.dense->chunks()) {
    ChunkState& saved = chunks[chunk.index];
    ASSIGN_OR_RETURN(saved.values, take(ChunkEntry(chunk.index) + ".values", chunk.size));
    ASSIGN_OR_RETURN(saved.state, take(ChunkEntry(chunk.index) + ".state",
                                       parts.dense->state_per_element() * chunk.size));
    RETURN_IF_ERROR(take_clocks(ChunkEntry(chunk.index), &saved.version, &saved.clocks));
  }
  std::map<std::string, TableRows> rows;
  for (const EmbeddingTableSpec& table : config.tables) {
    TableRows& saved = rows[table.name];
    saved.ids = std::move(shard.ints[table.name + ".ids"]);
    ASSIGN_OR_RETURN(saved.values, take(table.name + ".values", 0));
    ASSIGN_OR_RETURN(saved.state, take(table.name + ".state", 0));
    RETURN_IF_ERROR(take_clocks(table.name, &saved.version, &saved.clocks));
  }
  StatusOr<SparseTables::Restored> tables = parts.tables->PrepareRestore(rows);
  if (!tables.ok()) return tables.status().WithContext(from);
  parts.dense->Restore(std::move(chunks), step);
  parts.tables->CommitRestore(std::move(tables).value(), step, rows);
  return OkStatus();
}

}  // namespace

std::string ShardFileName(int server_rank) {
  return "server-" + std::to_string(server_rank) + ".ckpt";
}

StatusOr<ShardFileInfo> SaveShard(const ShardParts& parts, const std::string& root, int64_t step,
                                  int64_t wait_ms) {
  ASSIGN_OR_RETURN(CheckpointShard shard, TakeShard(parts, step, wait_ms));
  RETURN_IF_ERROR(PrepareCheckpointStep(root, step));
  ASSIGN_OR_RETURN(ShardFileInfo info,
                   WriteCheckpointShard(CheckpointStepDirectory(root, step) + "/" +
                                            ShardFileName(parts.server_rank),
                                        shard));
  TLOG(INFO) << "checkpoint of step " << step << ": " << info.file << " (" << info.bytes
             << " bytes)";
  return info;
}

StatusOr<ShardFileInfo> RestoreShard(const ShardParts& parts, const std::string& root,
                                     int64_t step) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(root, step));
  const std::string directory = CheckpointStepDirectory(root, step);
  const PsJobConfig& config = *parts.config;
  if (manifest.num_servers != parts.num_servers ||
      manifest.chunk_elements != config.chunk_elements ||
      manifest.dense_elements != config.dense_elements ||
      manifest.layout_fingerprint != config.layout_fingerprint) {
    return FailedPreconditionError(
        "checkpoint " + directory + " was written by " + std::to_string(manifest.num_servers) +
        " servers with chunks of " + std::to_string(manifest.chunk_elements) + " floats for a "
        "model of " + std::to_string(manifest.dense_elements) + " parameters; this job has " +
        std::to_string(parts.num_servers) + " servers, chunks of " +
        std::to_string(config.chunk_elements) + ", " + std::to_string(config.dense_elements) +
        " parameters");
  }
  const std::string file_name = ShardFileName(parts.server_rank);
  const ShardFileInfo* mine = nullptr;
  for (const ShardFileInfo& file : manifest.files) {
    if (file.file == file_name) mine = &file;
  }
  if (mine == nullptr) return DataLossError(directory + "/MANIFEST.json lists no " + file_name);
  const std::string path = directory + "/" + mine->file;
  ASSIGN_OR_RETURN(CheckpointShard shard, ReadCheckpointShard(path, *mine));
  RETURN_IF_ERROR(LoadShard(parts, std::move(shard), step, path));
  TLOG(INFO) << "restored the checkpoint of step " << step << " from " << path;
  return *mine;
}

StatusOr<std::vector<TensorData>> CopyShard(const ShardParts& parts, int64_t step,
                                            const std::string& forward_to, int forward_rank,
                                            int64_t wait_ms) {
  if (!forward_to.empty() && parts.config->consistency == PsConsistency::kSync) {
    return FailedPreconditionError(
        "a copy that forwards its later updates to server " + std::to_string(forward_rank) +
        " is for ps-async and ps-ssp (ps-sync copies at a step every worker agreed on)");
  }
  ASSIGN_OR_RETURN(CheckpointShard shard, TakeShard(parts, step, wait_ms, forward_to));
  std::vector<TensorData> tensors;
  for (auto& [name, floats] : shard.floats) {
    tensors.push_back(TensorData::Floats(name, 0, std::move(floats)));
  }
  for (auto& [name, ints] : shard.ints) tensors.push_back(TensorData::Int64s(name, std::move(ints)));
  return tensors;
}

Status LoadShardCopy(const ShardParts& parts, const std::vector<TensorData>& tensors,
                     int64_t step, const std::string& from) {
  CheckpointShard shard;
  for (const TensorData& tensor : tensors) {
    const size_t element = tensor.dtype == DataType::kInt64 ? sizeof(int64_t) : sizeof(float);
    if ((tensor.dtype != DataType::kFloat32 && tensor.dtype != DataType::kInt64) ||
        tensor.bytes.size() % element != 0) {
      return DataLossError(from + ": entry '" + tensor.name + "' holds " +
                           std::to_string(tensor.bytes.size()) + " bytes of " +
                           std::string(DataTypeName(tensor.dtype)) +
                           " (expected float32 or int64)");
    }
    const bool added = tensor.dtype == DataType::kInt64
                           ? shard.ints.emplace(tensor.name, tensor.Read<int64_t>()).second
                           : shard.floats.emplace(tensor.name, tensor.Read<float>()).second;
    if (!added) return DataLossError(from + ": entry '" + tensor.name + "' appears twice");
  }
  return LoadShard(parts, std::move(shard), step, from);
}

}  // namespace tessera::server
