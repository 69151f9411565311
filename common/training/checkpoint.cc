#include "common/training/checkpoint.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "common/base/atomic_file.h"
#include "common/base/byte_cursor.h"
#include "common/base/json_number.h"

namespace tessera {
namespace {

constexpr char kMagic[] = "TSRCKPT1";
constexpr uint8_t kFloatKind = 1;
constexpr uint8_t kIntKind = 2;

uint64_t Fnv1a(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

template <typename T>
void Append(std::string* out, const T& value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void AppendEntry(std::string* out, uint8_t kind, const std::string& name, const void* data,
                 uint64_t count, size_t element_size) {
  Append(out, kind);
  Append(out, static_cast<uint32_t>(name.size()));
  out->append(name);
  Append(out, count);
  out->append(static_cast<const char*>(data), count * element_size);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

StatusOr<ShardFileInfo> WriteCheckpointShard(const std::string& path,
                                             const CheckpointShard& shard) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the format is little-endian");
  std::string bytes(kMagic, 8);
  Append(&bytes, static_cast<uint32_t>(shard.floats.size() + shard.ints.size()));
  for (const auto& [name, values] : shard.floats) {
    AppendEntry(&bytes, kFloatKind, name, values.data(), values.size(), sizeof(float));
  }
  for (const auto& [name, values] : shard.ints) {
    AppendEntry(&bytes, kIntKind, name, values.data(), values.size(), sizeof(int64_t));
  }
  RETURN_IF_ERROR(WriteFileAtomically(path, bytes.data(), bytes.size()));
  return ShardFileInfo{BaseName(path), bytes.size(), Fnv1a(bytes)};
}

namespace {

// The file at `path` holds `bytes`: do they match what the manifest says of it?
Status CheckShardBytes(const std::string& path, const std::string& bytes,
                       const ShardFileInfo& expected) {
  if (bytes.size() != expected.bytes) {
    return DataLossError("checkpoint file " + path + " has " + std::to_string(bytes.size()) +
                         " bytes; its manifest says " + std::to_string(expected.bytes) +
                         " (truncated or replaced)");
  }
  if (Fnv1a(bytes) != expected.checksum) {
    return DataLossError("checkpoint file " + path + " does not match its manifest's checksum "
                         "(corrupted)");
  }
  return OkStatus();
}

}  // namespace

StatusOr<CheckpointShard> ReadCheckpointShard(const std::string& path,
                                              const ShardFileInfo& expected) {
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  RETURN_IF_ERROR(CheckShardBytes(path, bytes, expected));
  ByteCursor cursor(path, bytes);
  std::string_view magic;
  RETURN_IF_ERROR(cursor.ReadBytes("magic", 8, &magic));
  if (magic != std::string_view(kMagic, 8)) {
    return DataLossError("checkpoint file " + path + ": offset 0: not a TSRCKPT1 file");
  }
  uint32_t entries = 0;
  RETURN_IF_ERROR(cursor.ReadU32LittleEndian("entry count", &entries));
  CheckpointShard shard;
  for (uint32_t e = 0; e < entries; ++e) {
    const std::string where = "entry " + std::to_string(e);
    std::string_view kind_byte, name;
    uint32_t name_length = 0;
    uint64_t count = 0;
    RETURN_IF_ERROR(cursor.ReadBytes(where + " kind", 1, &kind_byte));
    RETURN_IF_ERROR(cursor.ReadU32LittleEndian(where + " name length", &name_length));
    RETURN_IF_ERROR(cursor.ReadBytes(where + " name", name_length, &name));
    RETURN_IF_ERROR(cursor.ReadU64LittleEndian(where + " element count", &count));
    const uint8_t kind = static_cast<uint8_t>(kind_byte[0]);
    const size_t element = kind == kFloatKind ? sizeof(float) : sizeof(int64_t);
    if (kind != kFloatKind && kind != kIntKind) {
      return DataLossError("checkpoint file " + path + ": offset " +
                           std::to_string(cursor.offset()) + ": " + where + " has kind " +
                           std::to_string(kind));
    }
    if (count > cursor.remaining() / element) {
      return DataLossError("checkpoint file " + path + ": offset " +
                           std::to_string(cursor.offset()) + ": " + where + " ('" +
                           std::string(name) + "') claims " + std::to_string(count) +
                           " elements; the file ends first");
    }
    std::string_view data;
    RETURN_IF_ERROR(cursor.ReadBytes(where + " data", count * element, &data));
    if (kind == kFloatKind) {
      std::vector<float>& values = shard.floats[std::string(name)];
      values.resize(count);
      if (count > 0) std::memcpy(values.data(), data.data(), data.size());
    } else {
      std::vector<int64_t>& values = shard.ints[std::string(name)];
      values.resize(count);
      if (count > 0) std::memcpy(values.data(), data.data(), data.size());
    }
  }
  return shard;
}

std::string CheckpointStepDirectory(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%012lld", static_cast<long long>(step));
  return root + "/" + name;
}

Status PrepareCheckpointStep(const std::string& root, int64_t step) {
  return MakeDirectories(CheckpointStepDirectory(root, step));
}

Status CommitCheckpoint(const std::string& root, const CheckpointManifest& manifest) {
  nlohmann::json files = nlohmann::json::array();
  for (const ShardFileInfo& f : manifest.files) {
    files.push_back({{"file", f.file}, {"bytes", f.bytes}, {"checksum", f.checksum}});
  }
  nlohmann::json j = {{"format", "tessera-checkpoint-v1"},
                      {"step", manifest.step},
                      {"mode", manifest.mode},
                      {"layout_fingerprint", manifest.layout_fingerprint},
                      {"dense_elements", manifest.dense_elements},
                      {"num_servers", manifest.num_servers},
                      {"chunk_elements", manifest.chunk_elements},
                      {"files", files}};
  if (manifest.world_size > 0) j["world_size"] = manifest.world_size;
  if (!manifest.optimizer.empty()) j["optimizer"] = manifest.optimizer;
  if (!manifest.tensors.empty()) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const ManifestTensor& t : manifest.tensors) {
      tensors.push_back({{"name", t.name}, {"shape", t.shape}});
    }
    j["tensors"] = tensors;
  }
  const std::string text = j.dump(2) + "\n";
  const std::string directory = CheckpointStepDirectory(root, manifest.step);
  RETURN_IF_ERROR(WriteFileAtomically(directory + "/MANIFEST.json", text.data(), text.size()));
  const std::string latest = std::to_string(manifest.step) + "\n";
  return WriteFileAtomically(root + "/LATEST", latest.data(), latest.size());
}

StatusOr<int64_t> LatestCheckpointStep(const std::string& root) {
  StatusOr<std::string> text = ReadWholeFile(root + "/LATEST");
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) {
      return NotFoundError("no checkpoint in " + root + " (no LATEST file)");
    }
    return text.status();
  }
  try {
    size_t used = 0;
    long long step = std::stoll(*text, &used);
    if (step < 0) throw std::invalid_argument("negative");
    return static_cast<int64_t>(step);
  } catch (const std::exception&) {
    return DataLossError(root + "/LATEST does not hold a step number");
  }
}

StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& root, int64_t step) {
  const std::string path = CheckpointStepDirectory(root, step) + "/MANIFEST.json";
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  CheckpointManifest m;
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("format", "") != "tessera-checkpoint-v1") {
      return DataLossError(path + ": not a tessera-checkpoint-v1 manifest");
    }
    // Every number through json_number.h: a value out of its field's range is a corrupt file.
    auto integer = [&](auto* field, const nlohmann::json& object, const char* name) {
      using T = std::remove_pointer_t<decltype(field)>;
      StatusOr<T> value = JsonInteger<T>(object.at(name), name);
      if (value.ok()) *field = *value;
      return value.status();
    };
    Status read = integer(&m.step, j, "step");
    m.mode = j.at("mode").get<std::string>();
    if (read.ok()) read = integer(&m.layout_fingerprint, j, "layout_fingerprint");
    if (read.ok()) read = integer(&m.dense_elements, j, "dense_elements");
    if (read.ok()) read = integer(&m.num_servers, j, "num_servers");
    if (read.ok()) read = integer(&m.chunk_elements, j, "chunk_elements");
    if (read.ok() && j.contains("world_size")) read = integer(&m.world_size, j, "world_size");
    m.optimizer = j.value("optimizer", "");
    if (read.ok() && j.contains("tensors")) {
      for (const auto& t : j.at("tensors")) {
        ManifestTensor tensor{t.at("name").get<std::string>(), {}};
        for (const auto& dim : t.at("shape")) {
          StatusOr<int64_t> d = JsonInteger<int64_t>(dim, "a dimension of " + tensor.name);
          if (!d.ok()) {
            read = d.status();
            break;
          }
          tensor.shape.push_back(*d);
        }
        m.tensors.push_back(std::move(tensor));
      }
    }
    if (read.ok()) {
      for (const auto& f : j.at("files")) {
        ShardFileInfo file{f.at("file").get<std::string>(), 0, 0};
        read = integer(&file.bytes, f, "bytes");
        if (read.ok()) read = integer(&file.checksum, f, "checksum");
        if (!read.ok()) break;
        m.files.push_back(std::move(file));
      }
    }
    if (!read.ok()) return DataLossError(path + ": " + read.message());
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(path + ": " + e.what());
  }
  if (m.step != step) {
    return DataLossError(path + " describes step " + std::to_string(m.step) + ", not " +
                         std::to_string(step));
  }
  return m;
}

Status VerifyCheckpoint(const std::string& root, int64_t step) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(root, step));
  const std::string directory = CheckpointStepDirectory(root, step);
  for (const ShardFileInfo& file : manifest.files) {
    const std::string path = directory + "/" + file.file;
    ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
    RETURN_IF_ERROR(CheckShardBytes(path, bytes, file));
  }
  return OkStatus();
}

std::vector<int64_t> CheckpointSteps(const std::string& root) {
  std::vector<int64_t> steps;
  DIR* dir = opendir(root.c_str());
  if (dir == nullptr) return steps;
  while (const struct dirent* entry = readdir(dir)) {
    long long step = -1;
    char rest = 0;
    if (std::sscanf(entry->d_name, "step-%lld%c", &step, &rest) == 1 && step >= 0 &&
        CheckpointStepDirectory(root, step) == root + "/" + entry->d_name) {
      steps.push_back(static_cast<int64_t>(step));
    }
  }
  closedir(dir);
  std::sort(steps.begin(), steps.end(), std::greater<int64_t>());
  return steps;
}

std::string ResumeAdvice(const std::string& root, std::optional<int64_t> failed) {
  const std::string which =
      failed.has_value() ? " before step " + std::to_string(*failed) : std::string();
  for (int64_t step : CheckpointSteps(root)) {
    if ((failed.has_value() && step >= *failed) || !VerifyCheckpoint(root, step).ok()) continue;
    return "; the newest checkpoint" + which + " that verifies is step " + std::to_string(step) +
           ": resume from it with --resume-step " + std::to_string(step);
  }
  return "; no checkpoint" + which + " in " + root + " verifies";
}

}  // namespace tessera
