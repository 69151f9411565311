// The TSRDATA1 binary format for dense classification data: WriteBinaryDataset saves any
// Dataset, ReadBinaryDataset loads and fully validates one. The format is specified in
// docs/data-format.md; in short (all integers and floats little-endian):
//
//   offset 0   8 bytes  magic "TSRDATA1"
//   offset 8   u32      version (1)
//   offset 12  u64      num_samples
//   offset 20  u32      feature_dim (>= 1)
//   offset 24  u32      num_classes (>= 1)
//   offset 28  num_samples records of { feature_dim x float32 features, int32 label }
//
// The file must be exactly 28 + num_samples * (4 * feature_dim + 4) bytes. Every error names
// the file and the byte offset of the field that is wrong or incomplete, e.g.
// "train.bin: offset 64: sample 1 label 12 is outside [0, 10)".
//
// Thread-safety: the functions are thread-safe for distinct paths.
#ifndef TESSERA_WORKER_DATA_BINARY_DATASET_H_
#define TESSERA_WORKER_DATA_BINARY_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "worker/data/dataset.h"
#include "worker/data/in_memory_dataset.h"

namespace tessera::worker::data {

inline constexpr char kBinaryDatasetMagic[] = "TSRDATA1";  // 8 bytes on disk, no NUL
inline constexpr uint32_t kBinaryDatasetVersion = 1;
inline constexpr size_t kBinaryDatasetHeaderBytes = 28;

// Writes every sample of `dataset` to `path`. The bytes go to "<path>.tmp" first, which is
// renamed over `path` only when complete, so a reader never sees a half-written file.
// Rejects (InvalidArgument) a feature_dim or num_classes that does not fit in u32 and a label
// that is outside [0, num_classes); I/O errors name the path.
Status WriteBinaryDataset(const Dataset& dataset, const std::string& path);

// Reads and validates the whole file: magic, version, feature_dim and num_classes >= 1,
// sizes that multiply without overflow, a file size that matches the header exactly, finite
// features and labels in [0, num_classes). Errors are DataLoss naming the file and offset
// (NotFound / Unavailable when the file cannot be opened). Holds the file's bytes and the
// decoded samples in memory at the same time while it decodes.
StatusOr<std::unique_ptr<InMemoryDataset>> ReadBinaryDataset(const std::string& path);

}  // namespace tessera::worker::data

#endif  // TESSERA_WORKER_DATA_BINARY_DATASET_H_
