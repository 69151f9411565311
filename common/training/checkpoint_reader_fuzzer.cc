// Fuzz target (issue 15): the checkpoint files a restore reads (common/training/checkpoint.h).
// Input: a selector byte, then the file's bytes: selector % 3 == 0 a shard file (read with the
// size and FNV-1a checksum of these very bytes, so that parsing is reached), 1 a step's
// MANIFEST.json, 2 LATEST. Seeds: checkpoint_reader_fuzz_corpus/ (written by
// training_fuzz_seeds).
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/training/checkpoint.h"
#include "fuzz/fuzz_files.h"

namespace {

uint64_t Fnv1a(const uint8_t* data, size_t size) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 0x100000001b3ull;
  return hash;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  if (size == 0) return 0;
  const int which = data[0] % 3;
  ++data;
  --size;
  const std::string& root = fuzz::ScratchDirectory();
  const int64_t step = 7;
  static const std::string step_dir = [&] {
    const std::string made = CheckpointStepDirectory(root, step);
    mkdir(made.c_str(), 0700);
    return made;
  }();
  if (which == 0) {
    const std::string path = step_dir + "/rank-0.ckpt";
    fuzz::WriteFile(path, data, size);
    (void)ReadCheckpointShard(path, ShardFileInfo{"rank-0.ckpt", size, Fnv1a(data, size)});
  } else if (which == 1) {
    fuzz::WriteFile(step_dir + "/MANIFEST.json", data, size);
    (void)ReadCheckpointManifest(root, step);
  } else {
    fuzz::WriteFile(root + "/LATEST", data, size);
    (void)LatestCheckpointStep(root);
  }
  return 0;
}
