// Writes the seed corpora of ps_job_config_fuzzer and checkpoint_reader_fuzzer from what the
// writers themselves produce: job configurations (dense only; with embedding tables) and a
// checkpoint's shard, manifest and LATEST.
//
//   bazel run //common/training:training_fuzz_seeds -- $PWD/common/training
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/training/checkpoint.h"
#include "common/training/ps_job.h"

namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PACKAGE_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  PsJobConfig dense;
  dense.num_workers = 2;
  dense.dense_elements = 1000;
  dense.layout_fingerprint = 0x1234;
  dense.model = "mlp 8-16-4";
  Write(dir + "/ps_job_config_fuzz_corpus/dense", EncodePsJobConfig(dense));
  PsJobConfig sparse = dense;
  sparse.consistency = PsConsistency::kSsp;
  sparse.staleness = 2;
  sparse.tables.push_back(EmbeddingTableSpec{"emb.0", 100, 8, 5});
  sparse.tables.push_back(EmbeddingTableSpec{"emb.1", 50, 4, 6});
  Write(dir + "/ps_job_config_fuzz_corpus/tables", EncodePsJobConfig(sparse));

  std::string root = "/tmp/tessera-fuzz-seeds-XXXXXX";
  if (mkdtemp(root.data()) == nullptr || !PrepareCheckpointStep(root, 7).ok()) return 1;
  CheckpointShard shard;
  shard.floats["layer0.w"] = {1.0f, 2.0f, 3.0f};
  shard.ints["step"] = {7};
  auto written = WriteCheckpointShard(CheckpointStepDirectory(root, 7) + "/rank-0.ckpt", shard);
  if (!written.ok()) return 1;
  CheckpointManifest manifest;
  manifest.step = 7;
  manifest.mode = "zero2";
  manifest.dense_elements = 3;
  manifest.world_size = 1;
  manifest.optimizer = "sgd";
  manifest.tensors = {{"layer0.w", {3}}};
  manifest.files = {*written};
  if (!CommitCheckpoint(root, manifest).ok()) return 1;
  Write(dir + "/checkpoint_reader_fuzz_corpus/shard",
        std::string(1, '\0') + ReadAll(CheckpointStepDirectory(root, 7) + "/rank-0.ckpt"));
  Write(dir + "/checkpoint_reader_fuzz_corpus/manifest",
        std::string(1, '\1') + ReadAll(CheckpointStepDirectory(root, 7) + "/MANIFEST.json"));
  Write(dir + "/checkpoint_reader_fuzz_corpus/latest",
        std::string(1, '\2') + ReadAll(root + "/LATEST"));
  std::filesystem::remove_all(root);
  std::printf("wrote the seeds under %s\n", dir.c_str());
  return 0;
}
