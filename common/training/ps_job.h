// What the parameter-server modes agree on, computed identically on every process:
//
//   - PsJobConfig: the job's consistency model, optimizer, schedule, dense layout size and
//     embedding tables; worker rank 0 sends it to every server (as JSON in PsInitRequest), so
//     long-running servers need no per-job flags and apply exactly the workers' optimizer;
//   - placement: the dense parameter buffer is cut into chunks of chunk_elements floats, dealt
//     round-robin to the S servers (chunk c on server c % S, so a large tensor spans servers),
//     chunk c's key is the (c / S)-th key of its server's key range; embedding row `id` of
//     table t lives on server SparseRowOwner(t, id, S), a hash, so hot rows spread too.
//
// Thread-safety: plain values and pure functions.
#ifndef TESSERA_COMMON_TRAINING_PS_JOB_H_
#define TESSERA_COMMON_TRAINING_PS_JOB_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/messages/fleet_view.h"
#include "common/training/embedding_table.h"
#include "common/training/lr_schedule.h"
#include "common/training/optimizer.h"
#include "common/training/parameter_layout.h"

namespace tessera {

enum class PsConsistency { kSync, kAsync, kSsp };
// "ps-sync" / "ps-async" / "ps-ssp".
std::string_view PsModeName(PsConsistency consistency);
// Inverse of PsModeName; InvalidArgument naming the value otherwise.
StatusOr<PsConsistency> ParsePsMode(std::string_view mode);

struct PsJobConfig {
  PsConsistency consistency = PsConsistency::kSync;
  int64_t staleness = 0;  // kSsp: a worker may be at most this many steps ahead of the slowest
  int num_workers = 1;
  OptimizerOptions optimizer;
  LrScheduleOptions schedule;
  uint64_t dense_elements = 0;     // the flat dense parameter buffer
  uint64_t layout_fingerprint = 0; // ParameterLayout::Fingerprint of the model
  uint64_t chunk_elements = 1 << 16;
  std::vector<EmbeddingTableSpec> tables;
  // DescribePsModel of rank 0's model; empty from a writer that predates it (not checked).
  std::string model;
};

std::string EncodePsJobConfig(const PsJobConfig& config);
// InvalidArgument naming what is missing or malformed; the result is validated.
StatusOr<PsJobConfig> DecodePsJobConfig(std::string_view json);
// Optimizer, schedule, sizes and bounds; InvalidArgument naming the field.
Status ValidatePsJobConfig(const PsJobConfig& config);

struct DenseChunk {
  uint64_t index = 0;   // position in the buffer, 0-based
  uint64_t offset = 0;  // first element
  uint64_t size = 0;    // elements
  int server = 0;
  uint64_t key = 0;
};

// The chunks of a dense buffer of `elements` floats over `num_servers` servers whose key ranges
// come from ServerKeyRange(key_space, ...). InvalidArgument when a server's key range is too
// small for its chunks (naming the server and the counts).
StatusOr<std::vector<DenseChunk>> PlanDenseChunks(uint64_t elements, uint64_t chunk_elements,
                                                  int num_servers, uint64_t key_space);

// Where one key range's dense chunks sit in each part of a worker's shared region (the
// gradients, then a values half per copy of the range: docs/parameter-server.md): a chunk at
// the sum of the sizes of that range's chunks of lower index. The offsets (floats) in the
// order of `chunks`, which are one range's; *floats: the size of a part. The worker and the
// servers all lay the region out with this.
std::vector<uint64_t> PsRegionOffsets(const std::vector<DenseChunk>& chunks, uint64_t* floats);

// The job token of PsInitRequest and PsPushPullRequest: the same on every worker of a job (it
// hashes the ranks, pids and addresses of the workers in the fleet view), different for the
// next job's workers, even from the same processes, so long-running servers tell one job's
// requests from the next's.
uint64_t PsJobToken(const FleetView& view);

// A model as the servers check it: its dense parameters' names and shapes in order and its
// embedding tables' names, rows and dims, as JSON.
std::string DescribePsModel(const ParameterLayout& layout,
                            const std::vector<EmbeddingTableSpec>& tables);
// OK when `worker_model` (a DescribePsModel) equals `job_model` (rank 0's), else
// FailedPrecondition naming the first difference on both sides, e.g. "worker 1's model
// differs from rank 0's: parameter 0 is '0.weight' [3, 8] on worker 1, '0.weight' [16, 8] on
// rank 0"; InvalidArgument when `worker_model` is not a model description.
Status CheckPsModel(std::string_view job_model, std::string_view worker_model, int worker_rank);

// The server holding row `id` of embedding table `table` (its index in the job's tables).
int SparseRowOwner(size_t table, int64_t id, int num_servers);

}  // namespace tessera

#endif  // TESSERA_COMMON_TRAINING_PS_JOB_H_
