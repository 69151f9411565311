// Embedding tables: the sparse parameters of a model, addressed by row id, and their storage.
//
// A model declares its tables with EmbeddingTableSpec. A table's rows are created on first
// touch with values that depend only on (spec.init_seed, row id) (InitializeEmbeddingRow), so
// any process can create any row without asking another: the worker in local mode holds whole
// tables, a parameter server only the rows hashed to it, and both start from the same values.
//
//   EmbeddingTable table(spec, optimizer);
//   RETURN_IF_ERROR(table.Lookup(ids, n, rows));                 // rows: n x spec.dim
//   RETURN_IF_ERROR(table.ApplyGradients(lr, step, ids, grads, n));
//
// Thread-safety: EmbeddingTable is not thread-safe (callers that share one lock or shard it).
#ifndef TESSERA_COMMON_TRAINING_EMBEDDING_TABLE_H_
#define TESSERA_COMMON_TRAINING_EMBEDDING_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/base/status.h"
#include "common/training/optimizer.h"

namespace tessera {

struct EmbeddingTableSpec {
  std::string name;        // unique within the model, e.g. "emb.0"
  int64_t rows = 0;        // valid ids are [0, rows)
  int64_t dim = 0;         // floats per row
  uint64_t init_seed = 0;  // the rows' initial values derive from it (and the row id)
};

// Writes row `id`'s initial values (dim floats, uniform in +-1/sqrt(dim)) to `out`. A pure
// function of (seed, id, dim): the same on every process and platform.
void InitializeEmbeddingRow(uint64_t seed, int64_t id, int64_t dim, float* out);

class EmbeddingTable {
 public:
  // REQUIRES: spec.rows > 0, spec.dim > 0, ValidateOptimizerOptions(optimizer).ok().
  EmbeddingTable(EmbeddingTableSpec spec, const OptimizerOptions& optimizer);

  const EmbeddingTableSpec& spec() const { return spec_; }
  // Rows created so far (touched by Lookup or ApplyGradients).
  size_t materialized_rows() const { return slots_.size(); }

  // out[i * dim ..] = row ids[i] for i < n, creating rows on first touch. InvalidArgument
  // naming the table, the position and the id for an id outside [0, rows), before anything
  // is written or created.
  Status Lookup(const int64_t* ids, size_t n, float* out);

  // One optimizer step (common/training/optimizer.h SparseRowUpdate semantics: duplicates summed in
  // order, each touched row updated once, untouched rows unchanged) with grads[i * dim ..] the
  // gradient of row ids[i]. Errors as Lookup, before anything changes.
  Status ApplyGradients(float lr, int64_t step, const int64_t* ids, const float* grads, size_t n);

  // Every row created so far, for a checkpoint: ids ascending, their values and optimizer
  // state row-major in that order (dim and StateFloatsPerElement * dim floats per row).
  void Export(std::vector<int64_t>* ids, std::vector<float>* values,
              std::vector<float>* state) const;
  // Replaces every row with the exported ones. InvalidArgument naming the table for sizes that
  // do not fit or an id outside the table; the table is unchanged then.
  Status Import(const std::vector<int64_t>& ids, const std::vector<float>& values,
                const std::vector<float>& state);

  // Row `id`'s current values, or its initial values if it was never touched (nothing is
  // created). REQUIRES: id in [0, rows).
  void Read(int64_t id, float* out) const;

 private:
  Status CheckIds(const int64_t* ids, size_t n) const;
  size_t SlotOf(int64_t id);  // creating the row if needed

  const EmbeddingTableSpec spec_;
  const OptimizerOptions optimizer_;
  const size_t state_per_row_;
  std::unordered_map<int64_t, size_t> slots_;  // id -> slot
  std::vector<float> values_;                  // slot-major, dim floats per slot
  std::vector<float> state_;                   // state_per_row_ floats per slot
  // ApplyGradients scratch: grads coalesced per distinct id, in first-appearance order.
  std::vector<int64_t> distinct_;
  std::vector<float> summed_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TRAINING_EMBEDDING_TABLE_H_
