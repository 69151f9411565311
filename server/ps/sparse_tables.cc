#include "server/ps/sparse_tables.h"

#include <optional>
#include <utility>

#include "common/base/logging.h"
#include "common/training/lr_schedule.h"
#include "common/training/nonfinite.h"
#include "server/ps/forward_chain.h"
#include "server/ps/replication_log.h"

namespace tessera::server {

struct SparseTables::Table {
  Table(size_t index, const EmbeddingTableSpec& spec, const PsJobConfig& config)
      : index(index),
        spec(spec),
        rows(std::make_unique<EmbeddingTable>(spec, config.optimizer)),
        policy(config.consistency, config.num_workers, config.staleness) {}

  const size_t index;  // in the job's tables, for SparseRowOwner
  const EmbeddingTableSpec spec;
  mutable std::mutex mu;
  std::unique_ptr<EmbeddingTable> rows;  // guarded by mu (a restore replaces it)
  ConsistencyPolicy policy;              // guarded by mu
  struct RankRows {
    std::vector<int64_t> ids;
    std::vector<float> grads;
    bool pushed = false;  // ps-sync: this worker pushed the step (perhaps no rows)
  };
  // ps-sync: the rows of a step not applied yet, by rank.
  std::map<int64_t, std::vector<RankRows>> held;  // guarded by mu
  std::vector<Waiter> waiters;                    // guarded by mu
  // The backup's side, ps-async and ps-ssp: what a forwarded push parked in `log` carries.
  struct ParkedRows {
    RankRows rows;
    TensorData row_ids;  // as forwarded (their frames), to be passed on in a chain
    TensorData values;
  };
  // The updates applied here that the copies after this one have not acknowledged yet;
  // forwarded pushes parked until their turn (ApplyParked); a joined server that took a copy
  // of this table (CopyTo: every later push goes there when it names no backup); and the
  // acknowledgements waiting for an update here to be at every copy after this one (a forward
  // taken by a chain's middle copy, or at a chain's new primary a copy of a push).
  ReplicationLog<ParkedRows> log;  // guarded by mu
  // The joined server acknowledged a push: pull replies name it (SparsePullReply::copied_to).
  bool backup_took = false;  // guarded by mu
};

// What a table's lock released, to be sent once it is released.
struct SparseTables::Ready {
  std::vector<Release> pulls;
  std::vector<std::function<void()>> acks;
};

SparseTables::SparseTables(const PsJobConfig& config, int server_rank, int num_servers,
                           PsMetrics* metrics, Forwarder forwarder)
    : config_(config),
      server_rank_(server_rank),
      num_servers_(num_servers),
      metrics_(metrics),
      forwarder_(std::move(forwarder)) {
  for (size_t t = 0; t < config.tables.size(); ++t) {
    tables_[config.tables[t].name] = std::make_unique<Table>(t, config.tables[t], config);
  }
}

SparseTables::~SparseTables() = default;

StatusOr<SparseTables::Table*> SparseTables::Find(const std::string& name) const {
  auto it = tables_.find(name);
  if (it == tables_.end()) return NotFoundError("no embedding table '" + name + "' in this job");
  return it->second.get();
}

// Rows outside the table would fail the whole ps-sync step at its last push, so they are
// refused on arrival, as are rows hashed to another server.
Status SparseTables::CheckRows(const Table& table, const std::vector<int64_t>& ids) const {
  for (int64_t id : ids) {
    if (id < 0 || id >= table.spec.rows) {
      return InvalidArgumentError("row " + std::to_string(id) + " of table '" + table.spec.name +
                                  "' is outside [0, " + std::to_string(table.spec.rows) + ")");
    }
  }
  for (int64_t id : ids) {
    const int owner = SparseRowOwner(table.index, id, num_servers_);
    if (owner != server_rank_) {
      return InvalidArgumentError("row " + std::to_string(id) + " of table '" + table.spec.name +
                                  "' belongs to server " + std::to_string(owner) +
                                  ", not server " + std::to_string(server_rank_));
    }
  }
  return OkStatus();
}

Status SparseTables::ReadRows(const Table& table, int rank, int64_t step, const TensorData& row_ids,
                              const TensorData& values, std::vector<int64_t>* ids_out,
                              std::vector<float>* grads_out) const {
  const std::string& name = table.spec.name;
  if (row_ids.dtype != DataType::kInt64 || values.dtype != DataType::kFloat32) {
    return InvalidArgumentError("sparse push to table '" + name + "': row ids of " +
                                std::string(DataTypeName(row_ids.dtype)) + " and values of " +
                                std::string(DataTypeName(values.dtype)) +
                                ", expected int64 and float32");
  }
  std::vector<int64_t> ids = row_ids.Read<int64_t>();
  std::vector<float> grads = values.Read<float>();
  const size_t dim = static_cast<size_t>(table.spec.dim);
  if (grads.size() != ids.size() * dim) {
    return InvalidArgumentError("sparse push to table '" + name + "': " +
                                std::to_string(ids.size()) + " rows but " +
                                std::to_string(grads.size()) + " floats (dim " +
                                std::to_string(dim) + ")");
  }
  RETURN_IF_ERROR(CheckRows(table, ids));
  if (std::optional<size_t> at = FirstNonFinite(grads.data(), grads.size())) {
    metrics_->SparseNonFinitePush();
    return InvalidArgumentError("worker " + std::to_string(rank) + "'s sparse push of step " +
                                std::to_string(step) + " to table '" + name + "': the gradient "
                                "of row " + std::to_string(ids[*at / dim]) + " holds " +
                                DescribeNonFinite(grads.data(), *at) +
                                "; refused, nothing of this push was applied");
  }
  *ids_out = std::move(ids);
  *grads_out = std::move(grads);
  return OkStatus();
}

Status SparseTables::Push(const std::string& name, int rank, int64_t step,
                          const TensorData& row_ids, const TensorData& values,
                          const std::string& forward_to, std::function<void()> done) {
  ASSIGN_OR_RETURN(Table * found, Find(name));
  Table& table = *found;
  std::vector<int64_t> ids;
  std::vector<float> grads;
  RETURN_IF_ERROR(ReadRows(table, rank, step, row_ids, values, &ids, &grads));
  metrics_->SparseGradientBytes(static_cast<double>(grads.size() * sizeof(float)));
  Status applied = OkStatus();
  Ready ready;
  std::optional<ForwardedRows> forward;
  std::string chain;       // where it goes
  bool to_joined = false;  // and it ends at a joined server (Table::backup)
  std::vector<std::pair<std::string, ForwardedRows>> onward;
  {
    std::lock_guard<std::mutex> lock(table.mu);
    // A worker's push at a copy holding parked forwards: its primary is gone. In a chain they
    // go on to the copies after this one, numbered as applied here.
    if (table.log.has_parked()) {
      ApplyParked(&table, /*all=*/true, table.log.ChainOfParked(forward_to), &onward);
    }
    StatusOr<PushDecision> decision = table.policy.Push(rank, step);
    if (!decision.ok()) return decision.status().WithContext("table '" + name + "'");
    if (decision->action == PushAction::kApplyNow) {
      const float lr = LearningRate(config_.schedule, config_.optimizer.lr, decision->update - 1);
      applied = table.rows->ApplyGradients(lr, decision->update, ids.data(), grads.data(),
                                           ids.size());
      metrics_->SparseUpdate();
      // A joined server's copy comes last in the chain, as DenseShard::Serve's.
      const std::string to = ChainWith(forward_to, table.log.joined());
      if (applied.ok() && forwarder_ != nullptr && !to.empty()) {
        forward = ForwardedRows{name, rank, step, decision->update, row_ids, values};
        chain = to;
        to_joined = !table.log.joined().empty();
        table.log.Sent(decision->update);
      }
    } else if (decision->action == PushAction::kApplied) {
      // ps-async, ps-ssp: a copy of a push this worker made; nothing to apply. Taken once
      // every update here is at the copies after this one (a chain's new primary may still be
      // passing on the forward that brought it).
      if (done != nullptr && table.log.unacknowledged() > 0) {
        table.log.AwaitCopies(table.policy.version(), /*chain=*/"", std::move(done));
        done = nullptr;
      }
    } else {
      auto& slots = table.held[step];
      slots.resize(static_cast<size_t>(config_.num_workers));
      slots[rank] = {std::move(ids), std::move(grads), /*pushed=*/true};
      if (decision->action == PushAction::kApplyHeld) applied = ApplyHeld(step, &table);
    }
    ReleaseReady(&table, &ready);
  }
  Send(&ready);
  SendOnward(&table, std::move(onward));
  if (!applied.ok()) return applied;
  if (forward.has_value()) {
    const int64_t update = forward->update;
    forwarder_(chain, std::move(*forward),
               [this, table = &table, update, to_joined, done = std::move(done)] {
                 Forwarded(table, update, to_joined);
                 if (done != nullptr) done();
               });
  } else if (done != nullptr) {
    done();
  }
  return OkStatus();
}

void SparseTables::Forwarded(Table* table, int64_t update, bool to_joined) {
  Ready ready;
  {
    std::lock_guard<std::mutex> lock(table->mu);
    table->log.Acknowledged(update);
    if (to_joined) table->backup_took = true;
    ReleaseReady(table, &ready);
  }
  Send(&ready);
}

void SparseTables::SendOnward(Table* table,
                              std::vector<std::pair<std::string, ForwardedRows>> onward) {
  for (auto& [chain, rows] : onward) {
    const int64_t update = rows.update;
    forwarder_(chain, std::move(rows), [this, table, update] { Forwarded(table, update); });
  }
}

Status SparseTables::ApplyForwarded(const ForwardedRows& rows, std::function<void()> taken) {
  const std::string what = "worker " + std::to_string(rows.pushed_by) + "'s push of step " +
                           std::to_string(rows.step) + " to table '" + rows.table + "', forwarded";
  ASSIGN_OR_RETURN(Table * found, Find(rows.table));
  Table& table = *found;
  RETURN_IF_ERROR(ReplicationLogBase::CheckPushedBy(what, rows.pushed_by, config_.num_workers));
  if (rows.update < 1 || rows.step < 1) {
    return InvalidArgumentError(what + ": update " + std::to_string(rows.update) +
                                "; updates and steps start at 1");
  }
  Table::RankRows parked;
  RETURN_IF_ERROR(ReadRows(table, rows.pushed_by, rows.step, rows.row_ids, rows.values, &parked.ids,
                           &parked.grads));
  // The last copy: held in memory here (parked until the updates before it came), so
  // acknowledged first. A middle copy of a chain acknowledges once the copies after it have
  // the update too, and forwards each update as it applies it.
  const std::string& chain = rows.forward_to;
  if (chain.empty()) taken();
  Ready ready;
  std::vector<std::pair<std::string, ForwardedRows>> onward;
  {
    std::lock_guard<std::mutex> lock(table.mu);
    // A copy of a forward taken already is left alone (applied, or parked: the first is
    // kept); in a chain it is acknowledged as the first is.
    if (table.log.Park(
            rows.update, table.policy,
            {rows.pushed_by, rows.step, {std::move(parked), rows.row_ids, rows.values}})) {
      ApplyParked(&table, /*all=*/false, chain, &onward);
    }
    if (!chain.empty()) table.log.AwaitCopies(rows.update, chain, std::move(taken));
    ReleaseReady(&table, &ready);
  }
  Send(&ready);
  SendOnward(&table, std::move(onward));
  return OkStatus();
}

// The parked forwards the table's log gives, in update order.
void SparseTables::ApplyParked(Table* table, bool all, const std::string& chain,
                               std::vector<std::pair<std::string, ForwardedRows>>* onward) {
  for (auto& [update, parked] : table->log.TakeNext(&table->policy, all)) {
    Table::ParkedRows& carried = parked.payload;
    const float lr = LearningRate(config_.schedule, config_.optimizer.lr, update - 1);
    // Every id was checked on arrival, so this does not fail.
    Status applied =
        table->rows->ApplyGradients(lr, update, carried.rows.ids.data(),
                                    carried.rows.grads.data(), carried.rows.ids.size());
    if (!applied.ok()) {
      TLOG(ERROR) << "forwarded rows of table '" << table->spec.name << "': " << applied;
    }
    metrics_->SparseUpdate();
    if (onward != nullptr && !chain.empty() && forwarder_ != nullptr) {
      // Acknowledgements of forwards (and copies' replies) wait for the next copies.
      table->log.Sent(update);
      onward->emplace_back(chain, ForwardedRows{table->spec.name, parked.rank, parked.step, update,
                                                std::move(carried.row_ids),
                                                std::move(carried.values)});
    }
  }
}

// ps-sync: every worker's rows of `step` are here: concatenate in rank order, average, apply.
Status SparseTables::ApplyHeld(int64_t step, Table* table) {
  auto held = table->held.find(step);
  std::vector<int64_t> all_ids;
  std::vector<float> all_grads;
  // The average is over the workers that pushed: all of them, unless one left the job
  // (elastic) before pushing the step.
  int pushers = 0;
  for (const Table::RankRows& part : held->second) {  // rank order
    pushers += part.pushed ? 1 : 0;
    all_ids.insert(all_ids.end(), part.ids.begin(), part.ids.end());
    all_grads.insert(all_grads.end(), part.grads.begin(), part.grads.end());
  }
  table->held.erase(held);
  const float scale = 1.0f / static_cast<float>(pushers > 0 ? pushers : 1);
  for (float& g : all_grads) g *= scale;
  const float lr = LearningRate(config_.schedule, config_.optimizer.lr, step - 1);
  metrics_->SparseUpdate();
  // Every id was checked on arrival, so this does not fail.
  return table->rows->ApplyGradients(lr, step, all_ids.data(), all_grads.data(), all_ids.size());
}

Status SparseTables::Pull(const std::string& name, int64_t step, const TensorData& row_ids,
                          ReplyCallback reply) {
  ASSIGN_OR_RETURN(Table * found, Find(name));
  Table& table = *found;
  if (row_ids.dtype != DataType::kInt64) {
    return InvalidArgumentError("sparse pull from table '" + name + "': row ids of " +
                                std::string(DataTypeName(row_ids.dtype)) + ", expected int64");
  }
  Waiter waiter;
  waiter.ids = row_ids.Read<int64_t>();
  waiter.reply = std::move(reply);
  RETURN_IF_ERROR(CheckRows(table, waiter.ids));
  Ready ready;
  std::vector<std::pair<std::string, ForwardedRows>> onward;
  {
    std::lock_guard<std::mutex> lock(table.mu);
    if (table.log.has_parked()) {  // the primary is gone
      ApplyParked(&table, /*all=*/true, table.log.ChainOfParked(/*forward_to=*/""), &onward);
    }
    waiter.rule = table.policy.RowPull(step);
    table.waiters.push_back(std::move(waiter));
    ReleaseReady(&table, &ready);
  }
  Send(&ready);
  SendOnward(&table, std::move(onward));
  return OkStatus();
}

void SparseTables::ReleaseReady(Table* table, Ready* ready) {
  // Acknowledgements whose update here is applied and at every copy after this one.
  table->log.TakeDue(table->policy.version(), &ready->acks);
  std::vector<Waiter> keep;
  const size_t dim = static_cast<size_t>(table->spec.dim);
  for (Waiter& waiter : table->waiters) {
    if (!table->policy.MayRelease(waiter.rule)) {
      keep.push_back(std::move(waiter));
      continue;
    }
    std::vector<float> values(waiter.ids.size() * dim);
    Status looked_up = table->rows->Lookup(waiter.ids.data(), waiter.ids.size(), values.data());
    if (!looked_up.ok()) {  // checked on arrival; kept for safety
      TLOG(ERROR) << "sparse pull: " << looked_up;
      continue;
    }
    ready->pulls.push_back(
        {std::move(waiter.reply),
         SparsePullReply{table->spec.name, TensorData::Int64s("row_ids", std::move(waiter.ids)),
                         TensorData::Floats("values", 0, std::move(values)),
                         table->backup_took ? table->log.joined() : std::string()}});
  }
  table->waiters.swap(keep);
}

void SparseTables::Send(Ready* ready) {
  for (const std::function<void()>& ack : ready->acks) ack();
  for (Release& release : ready->pulls) release.reply(std::move(release.body));
}

std::string SparseTables::FirstBehind(int64_t step) const {
  for (const auto& [name, table] : tables_) {
    std::lock_guard<std::mutex> lock(table->mu);
    if (table->policy.version() < step) return "table '" + name + "'";
  }
  return "";
}

std::string SparseTables::FirstAhead(int64_t step) const {
  for (const auto& [name, table] : tables_) {
    std::lock_guard<std::mutex> lock(table->mu);
    if (table->policy.version() > step) {
      return "table '" + name + "' (at step " + std::to_string(table->policy.version()) + ")";
    }
  }
  return "";
}

std::map<std::string, TableRows> SparseTables::Snapshot() const {
  std::map<std::string, TableRows> saved;
  for (const auto& [name, table] : tables_) {
    std::lock_guard<std::mutex> lock(table->mu);
    TableRows& rows = saved[name];
    table->rows->Export(&rows.ids, &rows.values, &rows.state);
  }
  return saved;
}

std::map<std::string, TableRows> SparseTables::CopyTo(const std::string& backup) {
  std::map<std::string, TableRows> saved;
  for (const auto& [name, table] : tables_) {
    std::lock_guard<std::mutex> lock(table->mu);
    TableRows& rows = saved[name];
    table->rows->Export(&rows.ids, &rows.values, &rows.state);
    rows.version = table->policy.version();
    rows.clocks = table->policy.clocks();
    table->log.CopiedTo(backup);
    table->backup_took = false;
  }
  return saved;
}

StatusOr<SparseTables::Restored> SparseTables::PrepareRestore(
    const std::map<std::string, TableRows>& saved) const {
  Restored restored;
  for (const auto& [name, table] : tables_) {
    auto it = saved.find(name);
    if (it == saved.end()) return InvalidArgumentError("no rows of table '" + name + "'");
    auto rows = std::make_unique<EmbeddingTable>(table->spec, config_.optimizer);
    RETURN_IF_ERROR(rows->Import(it->second.ids, it->second.values, it->second.state));
    restored[name] = std::move(rows);
  }
  return restored;
}

void SparseTables::CommitRestore(Restored restored, int64_t step,
                                 const std::map<std::string, TableRows>& saved) {
  for (auto& [name, table] : tables_) {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(table->mu);
      table->rows = std::move(restored.at(name));
      auto copy = saved.find(name);
      if (copy != saved.end() && !copy->second.clocks.empty()) {
        table->policy.Restore(copy->second.version, copy->second.clocks);
      } else {
        table->policy.Restore(step);
      }
      table->held.clear();
      // A chain's forwards taken before: the restored rows replace them.
      table->log.Clear(&ready.acks);
      ReleaseReady(table.get(), &ready);
    }
    Send(&ready);
  }
}

void SparseTables::RemoveWorker(int rank) {
  for (auto& [name, table] : tables_) {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(table->mu);
      for (const PushDecision& decision : table->policy.Leave(rank)) {
        if (decision.action == PushAction::kApplyHeld) {
          // Every id was checked on arrival, so this does not fail.
          Status applied = ApplyHeld(decision.update, table.get());
          if (!applied.ok()) TLOG(ERROR) << "table '" << name << "': " << applied;
        } else {
          table->held.erase(decision.update);
        }
      }
      ReleaseReady(table.get(), &ready);
    }
    Send(&ready);
  }
}

}  // namespace tessera::server
