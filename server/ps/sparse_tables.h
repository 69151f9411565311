// SparseTables: the embedding tables of one ps-* job on this server: the rows hashed here
// (SparseRowOwner; each created on first touch from the table's seed, common/training/
// embedding_table.h), each table with its ConsistencyPolicy under its own lock, ps-sync's held
// rows, and the pulls waiting for a step.
//
//   ps-sync   a push of step t is held until all W workers pushed their rows of step t (possibly
//             none), then all are applied at once: concatenated in rank order (duplicates add
//             up), averaged, as optimizer step t. A pull of step t waits for step t - 1.
//   otherwise each push is applied on arrival as the table's next update; pulls go at once.
// A push is acknowledged once taken (held or applied), never later.
//
// Thread-safety: thread-safe. A pull's callback runs on the thread of the request that released
// it (the pull's own, or a later push's), after the table's lock is released.
#ifndef TESSERA_SERVER_PS_SPARSE_TABLES_H_
#define TESSERA_SERVER_PS_SPARSE_TABLES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/messages/ps_messages.h"
#include "common/training/embedding_table.h"
#include "common/training/ps_job.h"
#include "server/ps/consistency_policy.h"
#include "server/ps/ps_metrics.h"

namespace tessera::server {

// A table's rows as a checkpoint holds them (EmbeddingTable::Export).
struct TableRows {
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<float> state;
};

class SparseTables {
 public:
  using ReplyCallback = std::function<void(SparsePullReply reply)>;
  // Tables built from checkpointed rows, not in use yet (PrepareRestore, CommitRestore).
  using Restored = std::map<std::string, std::unique_ptr<EmbeddingTable>>;

  // The job's tables, empty. `metrics` must outlive this.
  SparseTables(const PsJobConfig& config, int server_rank, int num_servers, PsMetrics* metrics);
  // Pulls still waiting are dropped (their workers time out, or were told the job ended).
  ~SparseTables();

  // Worker `rank`'s row gradients of step `step` for `table` (row_ids int64, values float32,
  // rows x dim). Errors, before anything changed: NotFound for a table the job does not have;
  // InvalidArgument for other dtypes or sizes, a row outside the table, or a row of another
  // server ("row 7 of table 'emb.0' belongs to server 0, not server 1"); AlreadyExists from
  // the policy (ps-sync: a second push of the step). REQUIRES: 0 <= rank < the job's workers.
  Status Push(const std::string& table, int rank, int64_t step, const TensorData& row_ids,
              const TensorData& values);

  // The rows `row_ids` (int64) of `table`, for step `step`: `reply` is called once, when the
  // policy allows (possibly before this returns). Errors as Push, before anything changed.
  Status Pull(const std::string& table, int64_t step, const TensorData& row_ids,
              ReplyCallback reply);

  // "table 'emb.0'" for the first table whose version is below `step`; empty when none is.
  std::string FirstBehind(int64_t step) const;
  // "table 'emb.0' (at step 8)" for the first table whose version is above `step`; empty when
  // none is.
  std::string FirstAhead(int64_t step) const;

  // Every table's rows by name, each exported under its table's lock.
  std::map<std::string, TableRows> Snapshot() const;
  // Builds every table from `saved` (by name) without touching the tables in use.
  // InvalidArgument naming the table for a table that is missing or rows that do not fit it.
  StatusOr<Restored> PrepareRestore(const std::map<std::string, TableRows>& saved) const;
  // Puts the prepared tables in use and restarts every table's policy at `step`; held rows are
  // dropped and waiting pulls the restored version allows go.
  // REQUIRES: `restored` came from PrepareRestore of this object.
  void CommitRestore(Restored restored, int64_t step);

 private:
  struct Waiter {
    ReleaseRule rule;
    std::vector<int64_t> ids;
    ReplyCallback reply;
  };
  struct Table;
  struct Release {  // a pull's reply, ready to go once the lock is released
    ReplyCallback reply;
    SparsePullReply body;
  };

  StatusOr<Table*> Find(const std::string& name) const;
  Status CheckRows(const Table& table, const std::vector<int64_t>& ids) const;
  // REQUIRES: table->mu held.
  Status ApplyHeld(int64_t step, Table* table);
  void ReleaseReady(Table* table, std::vector<Release>* ready);
  static void Send(std::vector<Release>* ready);

  const PsJobConfig config_;
  const int server_rank_;
  const int num_servers_;
  PsMetrics* const metrics_;
  std::map<std::string, std::unique_ptr<Table>> tables_;  // fixed after construction
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_SPARSE_TABLES_H_
