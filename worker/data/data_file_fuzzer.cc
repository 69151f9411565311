// Fuzz target (issue 15): the data files a user points a worker at. Input: a selector byte;
// even, a TSRDATA1 binary dataset (ReadBinaryDataset); odd, MNIST idx files (ReadMnist), whose
// images file is the next u32 (little-endian) bytes and whose labels file is the rest. Seeds:
// data_file_fuzz_corpus/ (written by data_fuzz_seeds).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz/fuzz_files.h"
#include "worker/data/binary_dataset.h"
#include "worker/data/mnist_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  using namespace tessera::worker::data;
  if (size == 0) return 0;
  const bool mnist = data[0] % 2 == 1;
  ++data;
  --size;
  const std::string& dir = fuzz::ScratchDirectory();
  if (!mnist) {
    fuzz::WriteFile(dir + "/data.bin", data, size);
    (void)ReadBinaryDataset(dir + "/data.bin");
    return 0;
  }
  uint32_t images = 0;
  if (size >= 4) std::memcpy(&images, data, 4);
  const size_t at = std::min<size_t>(size, 4);
  const size_t image_bytes = std::min<size_t>(images, size - at);
  fuzz::WriteFile(dir + "/images", data + at, image_bytes);
  fuzz::WriteFile(dir + "/labels", data + at + image_bytes, size - at - image_bytes);
  (void)ReadMnist(dir + "/images", dir + "/labels");
  return 0;
}
