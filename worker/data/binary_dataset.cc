#include "worker/data/binary_dataset.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "common/base/byte_cursor.h"

namespace tessera::worker::data {
namespace {

constexpr size_t kMagicBytes = 8;
static_assert(sizeof(kBinaryDatasetMagic) == kMagicBytes + 1, "magic is 8 chars + NUL");

void AppendU32(uint32_t value, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void AppendU64(uint64_t value, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void AppendF32(float value, std::string* out) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  AppendU32(bits, out);
}

// A magic that is not ours, shown so a user can tell what the file is (printable characters
// as is, the rest as \xNN).
std::string Printable(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && u != '\\') {
      out.push_back(c);
    } else {
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    }
  }
  return out;
}

Status IoError(const std::string& path, std::string_view what, int error) {
  return DataLossError(path + ": " + std::string(what) + ": " +
                       std::generic_category().message(error));
}

struct FileCloser {
  void operator()(std::FILE* file) const {
    if (file != nullptr) std::fclose(file);
  }
};

}  // namespace

Status WriteBinaryDataset(const Dataset& dataset, const std::string& path) {
  const std::string context = "write binary dataset " + path;
  const size_t feature_dim = dataset.feature_dim();
  const size_t num_classes = dataset.num_classes();
  if (feature_dim == 0 || feature_dim > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgumentError(context + ": feature_dim=" + std::to_string(feature_dim) +
                                " must be in [1, 2^32)");
  }
  if (num_classes == 0 || num_classes > std::numeric_limits<uint32_t>::max() ||
      num_classes - 1 > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgumentError(context + ": num_classes=" + std::to_string(num_classes) +
                                " must be in [1, 2^31]");
  }
  std::string header(kBinaryDatasetMagic, kMagicBytes);
  AppendU32(kBinaryDatasetVersion, &header);
  AppendU64(dataset.size(), &header);
  AppendU32(static_cast<uint32_t>(feature_dim), &header);
  AppendU32(static_cast<uint32_t>(num_classes), &header);

  const std::string tmp_path = path + ".tmp";
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(tmp_path.c_str(), "wb"));
  if (file == nullptr) return IoError(tmp_path, "cannot create", errno).WithContext(context);
  if (std::fwrite(header.data(), 1, header.size(), file.get()) != header.size()) {
    return IoError(tmp_path, "write header", errno).WithContext(context);
  }
  std::vector<float> features(feature_dim);
  std::string record;
  record.reserve(4 * feature_dim + 4);
  for (size_t i = 0; i < dataset.size(); ++i) {
    int64_t label = -1;
    RETURN_IF_ERROR(dataset.Get(i, features.data(), &label).WithContext(context));
    if (label < 0 || static_cast<uint64_t>(label) >= num_classes) {
      return InvalidArgumentError(context + ": sample " + std::to_string(i) + " label " +
                                  std::to_string(label) + " is outside [0, " +
                                  std::to_string(num_classes) + ")");
    }
    record.clear();
    for (float f : features) AppendF32(f, &record);
    AppendU32(static_cast<uint32_t>(static_cast<int32_t>(label)), &record);
    if (std::fwrite(record.data(), 1, record.size(), file.get()) != record.size()) {
      return IoError(tmp_path, "write sample " + std::to_string(i), errno).WithContext(context);
    }
  }
  // fclose flushes: its failure (e.g. a full disk) is a write failure.
  if (std::fclose(file.release()) != 0) {
    return IoError(tmp_path, "close", errno).WithContext(context);
  }
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    return IoError(tmp_path, "rename to " + path, errno).WithContext(context);
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<InMemoryDataset>> ReadBinaryDataset(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(path));
  ByteCursor cursor(path, bytes);

  std::string_view magic;
  RETURN_IF_ERROR(cursor.ReadBytes("magic", kMagicBytes, &magic));
  if (magic != std::string_view(kBinaryDatasetMagic, kMagicBytes)) {
    return cursor.ErrorAt(0, "bad magic \"" + Printable(magic) + "\" (expected \"" +
                                 kBinaryDatasetMagic + "\"): not a Tessera binary dataset");
  }
  uint32_t version = 0;
  RETURN_IF_ERROR(cursor.ReadU32LittleEndian("version", &version));
  if (version != kBinaryDatasetVersion) {
    return cursor.ErrorAt(8, "unsupported version " + std::to_string(version) +
                                 " (this reader knows version " +
                                 std::to_string(kBinaryDatasetVersion) + ")");
  }
  uint64_t num_samples = 0;
  uint32_t feature_dim = 0;
  uint32_t num_classes = 0;
  RETURN_IF_ERROR(cursor.ReadU64LittleEndian("num_samples", &num_samples));
  RETURN_IF_ERROR(cursor.ReadU32LittleEndian("feature_dim", &feature_dim));
  RETURN_IF_ERROR(cursor.ReadU32LittleEndian("num_classes", &num_classes));
  if (feature_dim == 0) return cursor.ErrorAt(20, "feature_dim is 0 (must be >= 1)");
  if (num_classes == 0) return cursor.ErrorAt(24, "num_classes is 0 (must be >= 1)");

  // feature_dim < 2^32, so the record size fits easily; the product with num_samples and the
  // header may not.
  const uint64_t record_bytes = 4 * uint64_t{feature_dim} + 4;
  uint64_t data_bytes = 0;
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(num_samples, record_bytes, &data_bytes) ||
      __builtin_add_overflow(data_bytes, uint64_t{kBinaryDatasetHeaderBytes}, &expected_bytes)) {
    return cursor.ErrorAt(12, "num_samples " + std::to_string(num_samples) + " x " +
                                  std::to_string(record_bytes) +
                                  "-byte records overflows a 64-bit file size");
  }
  const std::string declared = "header declares " + std::to_string(num_samples) +
                               " samples x " + std::to_string(record_bytes) + " bytes + " +
                               std::to_string(kBinaryDatasetHeaderBytes) + "-byte header = " +
                               std::to_string(expected_bytes) + " bytes";
  const uint64_t file_bytes = bytes.size();
  if (file_bytes < expected_bytes) {
    // Point at the first field the file cuts short.
    const uint64_t sample = (file_bytes - kBinaryDatasetHeaderBytes) / record_bytes;
    const uint64_t within = (file_bytes - kBinaryDatasetHeaderBytes) % record_bytes;
    const uint64_t sample_start = kBinaryDatasetHeaderBytes + sample * record_bytes;
    const bool in_label = within >= 4 * uint64_t{feature_dim};
    const uint64_t field_start = in_label ? sample_start + 4 * uint64_t{feature_dim}
                                          : sample_start + within / 4 * 4;
    const std::string field = in_label ? "label" : "feature " + std::to_string(within / 4);
    return cursor.ErrorAt(field_start, "truncated in sample " + std::to_string(sample) + " " +
                                           field + ": file ends at offset " +
                                           std::to_string(file_bytes) + "; " + declared);
  }
  if (file_bytes > expected_bytes) {
    return cursor.ErrorAt(expected_bytes, std::to_string(file_bytes - expected_bytes) +
                                              " unexpected bytes after the last sample; " +
                                              declared);
  }

  // The file size matched, so these sizes are bounded by the bytes we actually hold.
  const auto n = static_cast<size_t>(num_samples);
  std::vector<float> features(n * feature_dim);
  std::vector<int64_t> labels(n);
  for (size_t i = 0; i < n; ++i) {
    float* row = features.data() + i * feature_dim;
    for (size_t j = 0; j < feature_dim; ++j) {
      const size_t offset = cursor.offset();
      RETURN_IF_ERROR(cursor.ReadF32LittleEndian("feature", &row[j]));
      if (!std::isfinite(row[j])) {
        return cursor.ErrorAt(offset, "sample " + std::to_string(i) + " feature " +
                                          std::to_string(j) + " is not finite (" +
                                          std::to_string(row[j]) + ")");
      }
    }
    const size_t offset = cursor.offset();
    int32_t label = 0;
    RETURN_IF_ERROR(cursor.ReadI32LittleEndian("label", &label));
    if (label < 0 || static_cast<uint32_t>(label) >= num_classes) {
      return cursor.ErrorAt(offset, "sample " + std::to_string(i) + " label " +
                                        std::to_string(label) + " is outside [0, " +
                                        std::to_string(num_classes) + ")");
    }
    labels[i] = label;
  }
  auto dataset =
      InMemoryDataset::Create(feature_dim, num_classes, std::move(features), std::move(labels));
  if (!dataset.ok()) return dataset.status().WithContext(path);  // a bug: validated above
  return dataset;
}

}  // namespace tessera::worker::data
