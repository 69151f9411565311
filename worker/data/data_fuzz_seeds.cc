// Writes the seed corpus of data_file_fuzzer: a TSRDATA1 file as WriteBinaryDataset writes
// it, and a pair of MNIST idx files (3 images of 2 x 3 pixels and their labels).
//
//   bazel run //worker/data:data_fuzz_seeds -- $PWD/worker/data/data_file_fuzz_corpus
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "worker/data/binary_dataset.h"
#include "worker/data/in_memory_dataset.h"
#include "worker/data/mnist_reader.h"

namespace {

void BigEndian(std::string* out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(value >> shift));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera::worker::data;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::string scratch = "/tmp/tessera-fuzz-seeds-XXXXXX";
  if (mkdtemp(scratch.data()) == nullptr) return 1;
  auto dataset = InMemoryDataset::Create(3, 4, {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, 0.25f}, {1, 3});
  if (!dataset.ok() || !WriteBinaryDataset(**dataset, scratch + "/data.bin").ok() ||
      !ReadBinaryDataset(scratch + "/data.bin").ok()) {
    return 1;
  }
  std::ifstream in(scratch + "/data.bin", std::ios::binary);
  std::ofstream(dir + "/binary", std::ios::binary)
      << '\0' << std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  std::string images, labels;
  BigEndian(&images, 2051);
  BigEndian(&images, 3);
  BigEndian(&images, 2);
  BigEndian(&images, 3);
  for (int i = 0; i < 18; ++i) images.push_back(static_cast<char>(i * 14));
  BigEndian(&labels, 2049);
  BigEndian(&labels, 3);
  labels += std::string("\x07\x00\x09", 3);
  std::ofstream(scratch + "/images", std::ios::binary) << images;
  std::ofstream(scratch + "/labels", std::ios::binary) << labels;
  auto read = ReadMnist(scratch + "/images", scratch + "/labels");
  std::filesystem::remove_all(scratch);
  if (!read.ok()) {
    std::fprintf(stderr, "the MNIST seed does not read: %s\n", read.status().ToString().c_str());
    return 1;
  }
  const uint32_t image_bytes = static_cast<uint32_t>(images.size());
  std::ofstream(dir + "/mnist", std::ios::binary)
      << '\1' << std::string(reinterpret_cast<const char*>(&image_bytes), 4) << images << labels;
  std::printf("wrote 2 seeds to %s\n", dir.c_str());
  return 0;
}
