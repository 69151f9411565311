// SparseTables: the embedding tables of one ps-* job on this server: the rows hashed here
// (SparseRowOwner; each created on first touch from the table's seed, common/training/
// embedding_table.h), each table with its ConsistencyPolicy under its own lock, ps-sync's held
// rows, and the pulls waiting for a step.
//
//   ps-sync   a push of step t is held until all W workers pushed their rows of step t (possibly
//             none), then all are applied at once: concatenated in rank order (duplicates add
//             up), averaged, as optimizer step t. A pull of step t waits for step t - 1.
//   otherwise each push is applied on arrival as the table's next update; pulls go at once.
// A push is acknowledged once taken (held or applied), never later; with a backup (below) once
// the backup has it too.
//
// Forwarded row pushes (ps-async and ps-ssp, two copies of each key range): a worker's push to
// the range's primary names its backup (`forward_to`); the primary applies it as the table's
// next update and sends it there with that update number (the Forwarder), and the push is done
// once the backup acknowledged it. The backup (ApplyForwarded) applies each table's forwards in
// update order, parking one that overtook the one before it: the same rows, optimizer code and
// order as the primary, so bitwise the primary's rows and state. A worker's request at a table
// holding parked forwards means the primary is gone: every parked one is applied first.
// Chains (3 or more copies) as DenseShard's: a middle copy forwards each row push on as it
// applies it and acknowledges once the copies after it have it; a copy of a push at a chain's
// new primary is acknowledged once every update there is at the copies after it.
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

// A table's rows as a checkpoint holds them (EmbeddingTable::Export); a copy for a joined
// server (ps-async, ps-ssp: SparseTables::CopyTo) also holds the table's version and the
// workers' clocks.
struct TableRows {
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<float> state;
  int64_t version = 0;
  std::vector<int64_t> clocks;  // by rank; empty: restart at the restore's step
};

class SparseTables {
 public:
  using ReplyCallback = std::function<void(SparsePullReply reply)>;
  // A row push the primary applied, for the range's backup.
  struct ForwardedRows {
    std::string table;
    int pushed_by = 0;
    int64_t step = 0;
    int64_t update = 0;  // the table's update number on the primary
    TensorData row_ids;  // int64
    TensorData values;   // float32, rows x dim
    // As received, in a chain (3 or more copies): the copies after this one, comma-separated
    // (the sender gives the Forwarder the whole chain instead).
    std::string forward_to = {};
  };
  // Sends `rows` along `chain` (the backup, or every copy after this one: StepForwarder), and
  // calls `done` once, later and from another thread, when they have them or are gone.
  using Forwarder =
      std::function<void(const std::string& chain, ForwardedRows rows, std::function<void()> done)>;
  // Tables built from checkpointed rows, not in use yet (PrepareRestore, CommitRestore).
  using Restored = std::map<std::string, std::unique_ptr<EmbeddingTable>>;

  // The job's tables, empty. `metrics` must outlive this. `forwarder` (null: none) sends the
  // row pushes that name a backup (ps-async, ps-ssp; see above).
  SparseTables(const PsJobConfig& config, int server_rank, int num_servers, PsMetrics* metrics,
               Forwarder forwarder = nullptr);
  // Pulls still waiting are dropped (their workers time out, or were told the job ended).
  ~SparseTables();

  // Worker `rank`'s row gradients of step `step` for `table` (row_ids int64, values float32,
  // rows x dim). Errors, before anything changed: NotFound for a table the job does not have;
  // InvalidArgument for other dtypes or sizes, a row outside the table, or a row of another
  // server ("row 7 of table 'emb.0' belongs to server 0, not server 1"); AlreadyExists from
  // the policy (ps-sync: a second push of the step). REQUIRES: 0 <= rank < the job's workers.
  // `done` (null: none) is called once the push is taken: at once (before this returns), or,
  // when ps-async or ps-ssp applied it with a backup named (`forward_to`), once the backup has
  // it (from the Forwarder's thread). Never after an error.
  Status Push(const std::string& table, int rank, int64_t step, const TensorData& row_ids,
              const TensorData& values, const std::string& forward_to = std::string(),
              std::function<void()> done = nullptr);
  // The backup's side: checks `rows` (the primary's update), calls `taken` (its
  // acknowledgement), then applies them once the table's version is the update before theirs
  // (parked until then); an update the table has applied already (a copy) is left alone. A
  // chain's middle copy (`rows` names copies after it) calls `taken` later, from another
  // thread, once they have it too.
  // Errors, before anything changed and without `taken`: as Push's, and InvalidArgument for a
  // worker outside the job or an update number below 1.
  Status ApplyForwarded(const ForwardedRows& rows, std::function<void()> taken);

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
  // ps-async, ps-ssp: Snapshot for the server at `backup`, which joined in a failed one's
  // place, with each table's version and clocks; under the same lock the table starts
  // forwarding every later push there (last in the chain), whatever backups a push names, so
  // each table's copy and the pushes after it are one cut (DenseShard::CopyTo's twin). Pull
  // replies name the server once it acknowledged a push (SparsePullReply::copied_to), as
  // dense push replies do: workers learn from either that it holds the range.
  // REQUIRES: a forwarder.
  std::map<std::string, TableRows> CopyTo(const std::string& backup);
  // Builds every table from `saved` (by name) without touching the tables in use.
  // InvalidArgument naming the table for a table that is missing or rows that do not fit it.
  StatusOr<Restored> PrepareRestore(const std::map<std::string, TableRows>& saved) const;
  // Puts the prepared tables in use and restarts every table's policy at `step` (or at the
  // version and clocks of `saved`'s entry, a copy, when it has them); held rows are dropped and
  // waiting pulls the restored version allows go.
  // REQUIRES: `restored` came from PrepareRestore of this object; a table's clocks, if any,
  // are one per worker.
  // Elastic jobs: worker `rank` left (ConsistencyPolicy::Leave on every table); a ps-sync step
  // it alone held up is applied with the rows of the workers that pushed, and the waiting
  // replies go. Not forwarded (as DenseShard::RemoveWorker).
  void RemoveWorker(int rank);
  void CommitRestore(Restored restored, int64_t step,
                     const std::map<std::string, TableRows>& saved = {});

 private:
  struct Waiter {
    ReleaseRule rule;
    std::vector<int64_t> ids;
    ReplyCallback reply;
  };
  struct Table;
  struct Ready;
  struct Release {  // a pull's reply, ready to go once the lock is released
    ReplyCallback reply;
    SparsePullReply body;
  };

  StatusOr<Table*> Find(const std::string& name) const;
  Status CheckRows(const Table& table, const std::vector<int64_t>& ids) const;
  // The push's row ids and gradients once they check against `table` (see Push).
  Status ReadRows(const Table& table, int rank, int64_t step, const TensorData& row_ids,
                  const TensorData& values, std::vector<int64_t>* ids,
                  std::vector<float>* grads) const;
  // REQUIRES: table->mu held.
  Status ApplyHeld(int64_t step, Table* table);
  // Applies the table's parked forwards that are next in update order (`all`: every one, in
  // update order); with `onward` and a `chain`, each applied one is added there for the
  // copies after this one. REQUIRES: table->mu held.
  void ApplyParked(Table* table, bool all, const std::string& chain = std::string(),
                   std::vector<std::pair<std::string, ForwardedRows>>* onward = nullptr);
  // Forwards `onward` (ApplyParked: chain, rows) along their chains. REQUIRES: table->mu not
  // held.
  void SendOnward(Table* table, std::vector<std::pair<std::string, ForwardedRows>> onward);
  // The copies after this one have `update` of `table` (or are gone); `to_joined`: they
  // ended at the table's joined server.
  void Forwarded(Table* table, int64_t update, bool to_joined = false);
  void ReleaseReady(Table* table, Ready* ready);
  static void Send(Ready* ready);

  const PsJobConfig config_;
  const int server_rank_;
  const int num_servers_;
  PsMetrics* const metrics_;
  const Forwarder forwarder_;
  std::map<std::string, std::unique_ptr<Table>> tables_;  // fixed after construction
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_SPARSE_TABLES_H_
