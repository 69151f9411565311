#include "worker/engines/sharded_state.h"

#include <algorithm>
#include <cstring>

namespace tessera::worker {
namespace {

// A rank's report after writing its shard, as floats for a float32 all-gather: ok, has a shard,
// the file's size and checksum as 4 floats of 16 bits each (exact in float32).
constexpr size_t kReport = 10;

std::string Range(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

std::string Shape(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::vector<ManifestTensor> Tensors(const ParameterLayout& layout) {
  std::vector<ManifestTensor> tensors;
  for (const ParameterView& view : layout.views()) tensors.push_back({view.name, view.shape});
  return tensors;
}

// What differs between the checkpoint's model and this one, for an error message.
std::string LayoutDifference(const CheckpointManifest& manifest, const ParameterLayout& layout) {
  const std::vector<ManifestTensor> mine = Tensors(layout);
  const std::vector<ManifestTensor>& theirs = manifest.tensors;
  if (!theirs.empty()) {
    for (size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
      auto describe = [](const std::vector<ManifestTensor>& tensors, size_t i) {
        return i < tensors.size() ? "'" + tensors[i].name + "' " + Shape(tensors[i].shape)
                                  : std::string("nothing");
      };
      if (i >= mine.size() || i >= theirs.size() || !(mine[i] == theirs[i])) {
        return "tensor #" + std::to_string(i) + " is " + describe(theirs, i) +
               " in the checkpoint and " + describe(mine, i) + " in this model";
      }
    }
  }
  return std::to_string(manifest.dense_elements) + " dense parameters with layout fingerprint " +
         std::to_string(manifest.layout_fingerprint) + " in the checkpoint, " +
         std::to_string(layout.total_size()) + " with " + std::to_string(layout.Fingerprint()) +
         " in this model";
}

// "a", "a or b", "a, b or c".
std::string OrList(const std::vector<std::string>& items) {
  std::string listed;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) listed += i + 1 == items.size() ? " or " : ", ";
    listed += items[i];
  }
  return listed;
}

}  // namespace

std::string RankShardFileName(int rank) { return "rank-" + std::to_string(rank) + ".ckpt"; }

CheckpointShard MakeSliceShard(const std::vector<Partition>& slices, const float* slice_params,
                               const float* slice_state, size_t state_floats_per_element) {
  CheckpointShard shard;
  std::vector<int64_t>& ranges = shard.ints["slices"];
  size_t elements = 0;
  for (const Partition& slice : slices) {
    if (slice.size > 0) {
      ranges.push_back(static_cast<int64_t>(slice.offset));
      ranges.push_back(static_cast<int64_t>(slice.size));
    }
    elements += slice.size;
  }
  std::vector<float>& params = shard.floats["params"];
  std::vector<float>& state = shard.floats["state"];
  if (elements > 0) params.assign(slice_params, slice_params + elements);
  if (elements * state_floats_per_element > 0) {
    state.assign(slice_state, slice_state + elements * state_floats_per_element);
  }
  return shard;
}

Status SaveShardedCheckpoint(const std::string& root, int64_t step,
                             const ShardedCheckpointSpec& spec,
                             const std::vector<Partition>& slices, const float* slice_params,
                             const float* slice_state, Collectives* collectives, uint64_t tag) {
  const int rank = collectives->rank();
  const int world = collectives->world_size();
  const std::string directory = CheckpointStepDirectory(root, step);
  bool has_shard = false;
  for (const Partition& slice : slices) has_shard = has_shard || slice.size > 0;

  // 1. This rank's shard.
  Status mine = PrepareCheckpointStep(root, step);
  ShardFileInfo info;
  if (mine.ok() && has_shard) {
    StatusOr<ShardFileInfo> written = WriteCheckpointShard(
        directory + "/" + RankShardFileName(rank),
        MakeSliceShard(slices, slice_params, slice_state, StateFloatsPerElement(spec.optimizer)));
    if (written.ok()) {
      info = *written;
    } else {
      mine = written.status();
    }
  }
  // 2. Every rank learns whether every shard was written, and rank 0 what to list.
  std::vector<float> reports(kReport * static_cast<size_t>(world), 0.0f);
  float* report = reports.data() + kReport * static_cast<size_t>(rank);
  report[0] = mine.ok() ? 1.0f : 0.0f;
  report[1] = has_shard ? 1.0f : 0.0f;
  Put64(info.bytes, report + 2);
  Put64(info.checksum, report + 6);
  RETURN_IF_ERROR(collectives->AllGather(report, reports.data(), reports.size(),
                                         DataType::kFloat32, "checkpoint shard reports", tag)
                      .WithContext("checkpoint of step " + std::to_string(step)));
  if (!mine.ok()) return mine.WithContext("checkpoint of step " + std::to_string(step));
  for (int q = 0; q < world; ++q) {
    if (reports[kReport * static_cast<size_t>(q)] != 1.0f) {
      return AbortedError("checkpoint of step " + std::to_string(step) + " in " + directory +
                          " not committed: rank " + std::to_string(q) +
                          " could not write its shard (its log says why)");
    }
  }
  // 3. Rank 0 commits, then tells the others whether it did.
  Status committed;
  if (rank == 0) {
    CheckpointManifest manifest;
    manifest.step = step;
    manifest.mode = spec.mode;
    manifest.layout_fingerprint = spec.layout->Fingerprint();
    manifest.dense_elements = spec.layout->total_size();
    manifest.world_size = world;
    manifest.optimizer = std::string(OptimizerKindName(spec.optimizer));
    manifest.tensors = Tensors(*spec.layout);
    for (int q = 0; q < world; ++q) {
      const float* theirs = reports.data() + kReport * static_cast<size_t>(q);
      if (theirs[1] == 1.0f) {
        manifest.files.push_back({RankShardFileName(q), Get64(theirs + 2), Get64(theirs + 6)});
      }
    }
    committed = CommitCheckpoint(root, manifest);
  }
  float flag = committed.ok() ? 1.0f : 0.0f;
  RETURN_IF_ERROR(collectives->Broadcast(&flag, 1, DataType::kFloat32, /*root=*/0,
                                         "checkpoint commit", tag + 1)
                      .WithContext("checkpoint of step " + std::to_string(step)));
  if (!committed.ok()) return committed.WithContext("committing the checkpoint");
  if (flag != 1.0f) {
    return AbortedError("checkpoint of step " + std::to_string(step) + " in " + directory +
                        " not committed: rank 0 could not write the manifest (its log says why)");
  }
  return OkStatus();
}

SliceAssembler::SliceAssembler(uint64_t total_elements, size_t state_floats_per_element)
    : total_(total_elements),
      k_(state_floats_per_element),
      params_(total_elements, 0.0f),
      state_(total_elements * state_floats_per_element, 0.0f),
      owner_(total_elements, -1) {}

Status SliceAssembler::Add(const std::string& file, const CheckpointShard& shard) {
  auto ranges = shard.ints.find("slices");
  auto params = shard.floats.find("params");
  auto state = shard.floats.find("state");
  if (ranges == shard.ints.end()) return DataLossError(file + ": no 'slices' entry");
  if (params == shard.floats.end()) return DataLossError(file + ": no 'params' entry");
  if (state == shard.floats.end()) return DataLossError(file + ": no 'state' entry");
  const std::vector<int64_t>& list = ranges->second;
  if (list.size() % 2 != 0) {
    return DataLossError(file + ": 'slices' has " + std::to_string(list.size()) +
                         " values, not [offset, size] pairs");
  }
  uint64_t elements = 0;
  for (size_t i = 0; i < list.size(); i += 2) {
    const int64_t offset = list[i], size = list[i + 1];
    if (offset < 0 || size <= 0 || static_cast<uint64_t>(offset) > total_ ||
        static_cast<uint64_t>(size) > total_ - static_cast<uint64_t>(offset)) {
      return DataLossError(file + ": slice " + std::to_string(i / 2) + " (offset " +
                           std::to_string(offset) + ", size " + std::to_string(size) +
                           ") is not a non-empty range of the " + std::to_string(total_) +
                           " parameters");
    }
    elements += static_cast<uint64_t>(size);
  }
  if (params->second.size() != elements || state->second.size() != elements * k_) {
    return DataLossError(file + ": its slices hold " + std::to_string(elements) +
                         " elements, but 'params' has " + std::to_string(params->second.size()) +
                         " floats and 'state' " + std::to_string(state->second.size()) +
                         " (expected " + std::to_string(elements) + " and " +
                         std::to_string(elements * k_) + ")");
  }
  const int index = static_cast<int>(files_.size());
  files_.push_back(file);
  uint64_t read = 0;
  for (size_t i = 0; i < list.size(); i += 2) {
    const uint64_t offset = static_cast<uint64_t>(list[i]), size = static_cast<uint64_t>(list[i + 1]);
    for (uint64_t e = offset; e < offset + size; ++e) {
      if (owner_[e] != -1) {
        return DataLossError(file + ": slice " + Range(offset, offset + size) +
                             " overlaps element " + std::to_string(e) + ", which " +
                             files_[static_cast<size_t>(owner_[e])] + " holds too");
      }
      owner_[e] = index;
    }
    std::memcpy(params_.data() + offset, params->second.data() + read, size * sizeof(float));
    if (k_ > 0) {
      std::memcpy(state_.data() + k_ * offset, state->second.data() + k_ * read,
                  k_ * size * sizeof(float));
    }
    read += size;
  }
  return OkStatus();
}

Status SliceAssembler::CheckComplete(const std::string& where) const {
  for (uint64_t e = 0; e < total_; ++e) {
    if (owner_[e] != -1) continue;
    uint64_t end = e;
    while (end < total_ && owner_[end] == -1) ++end;
    return DataLossError(where + ": elements " + Range(e, end) + " of the " +
                         std::to_string(total_) + " parameters are in no shard it lists");
  }
  return OkStatus();
}

StatusOr<AssembledState> ReadShardedCheckpoint(const std::string& root, int64_t step,
                                               const ShardedCheckpointSpec& spec) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(root, step));
  const std::string directory = CheckpointStepDirectory(root, step);
  if (std::find(spec.restores_from.begin(), spec.restores_from.end(), manifest.mode) ==
      spec.restores_from.end()) {
    return FailedPreconditionError(
        "checkpoint " + directory + " was written by --mode " + manifest.mode + "; --mode " +
        spec.mode + " restores checkpoints of " + OrList(spec.restores_from));
  }
  const ParameterLayout& layout = *spec.layout;
  const std::vector<ManifestTensor> mine = Tensors(layout);
  if (manifest.layout_fingerprint != layout.Fingerprint() ||
      manifest.dense_elements != layout.total_size() ||
      (!manifest.tensors.empty() && manifest.tensors != mine)) {
    return FailedPreconditionError("checkpoint " + directory + " is of another model: " +
                                   LayoutDifference(manifest, layout));
  }
  const std::string optimizer(OptimizerKindName(spec.optimizer));
  if (manifest.optimizer != optimizer) {
    return FailedPreconditionError("checkpoint " + directory + " holds the optimizer state of " +
                                   (manifest.optimizer.empty() ? "an unnamed optimizer"
                                                               : manifest.optimizer) +
                                   "; this run uses " + optimizer + " (--optimizer must match)");
  }
  SliceAssembler assembler(layout.total_size(), StateFloatsPerElement(spec.optimizer));
  for (const ShardFileInfo& file : manifest.files) {
    const std::string path = directory + "/" + file.file;
    ASSIGN_OR_RETURN(CheckpointShard shard, ReadCheckpointShard(path, file));
    RETURN_IF_ERROR(assembler.Add(path, shard));
  }
  RETURN_IF_ERROR(assembler.CheckComplete(directory + "/MANIFEST.json"));
  AssembledState assembled;
  assembled.manifest = std::move(manifest);
  assembled.params = std::move(assembler.params());
  assembled.state = std::move(assembler.state());
  return assembled;
}

Status RestoreShardedCheckpoint(const std::string& root, int64_t step,
                                const ShardedCheckpointSpec& spec,
                                const std::vector<Partition>& slices, float* slice_params,
                                float* slice_state, float* full_params, Collectives* collectives,
                                uint64_t tag) {
  Status mine;
  {
    StatusOr<AssembledState> assembled = ReadShardedCheckpoint(root, step, spec);
    if (assembled.ok()) {
      const size_t k = StateFloatsPerElement(spec.optimizer);
      size_t at = 0;
      for (const Partition& slice : slices) {
        if (slice.end() > assembled->params.size()) {
          mine = InvalidArgumentError("restoring " + CheckpointStepDirectory(root, step) +
                                      ": slice " + Range(slice.offset, slice.end()) +
                                      " is outside its " +
                                      std::to_string(assembled->params.size()) + " parameters");
          break;
        }
        if (slice_params != nullptr && slice.size > 0) {
          std::memcpy(slice_params + at, assembled->params.data() + slice.offset,
                      slice.size * sizeof(float));
        }
        if (slice_state != nullptr && k * slice.size > 0) {
          std::memcpy(slice_state + k * at, assembled->state.data() + k * slice.offset,
                      k * slice.size * sizeof(float));
        }
        at += slice.size;
      }
      if (full_params != nullptr && !assembled->params.empty()) {
        std::memcpy(full_params, assembled->params.data(),
                    assembled->params.size() * sizeof(float));
      }
    } else {
      mine = assembled.status();
    }
  }
  const int world = collectives->world_size();
  std::vector<float> ok(static_cast<size_t>(world), 0.0f);
  ok[static_cast<size_t>(collectives->rank())] = mine.ok() ? 1.0f : 0.0f;
  RETURN_IF_ERROR(collectives->AllGather(&ok[static_cast<size_t>(collectives->rank())], ok.data(),
                                         ok.size(), DataType::kFloat32, "checkpoint restore", tag)
                      .WithContext("restoring the checkpoint of step " + std::to_string(step)));
  if (!mine.ok()) return mine;
  for (int q = 0; q < world; ++q) {
    if (ok[static_cast<size_t>(q)] != 1.0f) {
      return AbortedError("restoring the checkpoint of step " + std::to_string(step) + " in " +
                          CheckpointStepDirectory(root, step) + ": rank " + std::to_string(q) +
                          " could not (its log says why)");
    }
  }
  return OkStatus();
}

}  // namespace tessera::worker
