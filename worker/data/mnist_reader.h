// ReadMnist: loads MNIST-style idx files (MNIST, Fashion-MNIST, ...) that a user points us at.
//
//   ASSIGN_OR_RETURN(auto train, ReadMnist("/data/train-images-idx3-ubyte",
//                                          "/data/train-labels-idx1-ubyte"));
//
// The idx layout (header integers are big-endian u32):
//   images: magic 2051 (0x00000803), count, rows, cols, then count * rows * cols u8 pixels,
//           image by image, row-major;
//   labels: magic 2049 (0x00000801), count, then count u8 labels.
// The result has feature_dim = rows * cols features per sample, each pixel / 255 in [0, 1],
// and num_classes = 10.
//
// Validation: both magics, rows and cols >= 1, sizes that multiply without overflow, each file
// exactly as long as its header says, equal counts in the two files, labels in [0, 10).
// Every error is DataLoss naming the file and the byte offset (NotFound / Unavailable when a
// file cannot be opened); gzip-compressed files (as downloaded) get a hint to gunzip them.
//
// Thread-safety: thread-safe.
#ifndef TESSERA_WORKER_DATA_MNIST_READER_H_
#define TESSERA_WORKER_DATA_MNIST_READER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "common/base/status.h"
#include "worker/data/in_memory_dataset.h"

namespace tessera::worker::data {

inline constexpr uint32_t kMnistImagesMagic = 2051;
inline constexpr uint32_t kMnistLabelsMagic = 2049;
inline constexpr size_t kMnistNumClasses = 10;

StatusOr<std::unique_ptr<InMemoryDataset>> ReadMnist(const std::string& images_path,
                                                     const std::string& labels_path);

}  // namespace tessera::worker::data

#endif  // TESSERA_WORKER_DATA_MNIST_READER_H_
