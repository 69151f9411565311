// ReplicationLog: the replication bookkeeping of one part of a ps-* job that workers push to (a
// dense chunk, DenseShard; an embedding table, SparseTables), written once for every kind of
// part. The protocol is dense_shard.h's ("Forwarded updates", "Chains"); in its words, a part's
// log holds:
//
//   - the updates this copy applied and sent to the copies after it, until they acknowledge
//     them (Sent, Acknowledged): the replies with their values wait for that;
//   - ps-async and ps-ssp, at a copy given forwards: the forwarded pushes that overtook the
//     update before them, parked (Park) and then taken in the primary's update order, each
//     once (TakeNext); a copy of a forward the part has, applied or parked, is dropped;
//   - the acknowledgements of a chain's middle copy (and of a copy of a push at a chain's new
//     primary), each waiting until its update is applied here and at every copy after this one
//     (AwaitCopies, TakeDue), and those copies as the last forward named them;
//   - a joined server that took a copy of the part (CopiedTo), where every later update goes.
//
// What a forwarded push carries and how it is applied are the owner's: `Payload` (a chunk's
// gradient, a table's rows) is parked as it came, and TakeNext hands back the pushes to apply
// now, numbered as applied here.
//
//   // A forward at a copy, under the part's lock:
//   if (log.Park(update, policy, {rank, step, std::move(gradient)})) {
//     for (auto& next : log.TakeNext(&policy, /*all=*/false)) { ...apply next.parked... }
//   }
//   log.TakeDue(policy.version(), &acks);  // each called once the lock is released
//
// Thread-safety: not thread-safe. Its owner keeps it under the part's lock together with the
// part's ConsistencyPolicy (DenseShard's Chunk::mu, SparseTables' Table::mu), and calls the
// acknowledgements that TakeDue and Clear hand out only once that lock is released.
#ifndef TESSERA_SERVER_PS_REPLICATION_LOG_H_
#define TESSERA_SERVER_PS_REPLICATION_LOG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "server/ps/consistency_policy.h"

namespace tessera::server {

// The part of ReplicationLog that does not depend on the payload (compiled once, in
// replication_log.cc).
class ReplicationLogBase {
 public:
  // The acknowledgement of a forward taken (or of a copy of a push), called once.
  using Ack = std::function<void()>;

  // This copy applied `update` and sent it to the copies after it: until they acknowledge it
  // (Acknowledged, also when they are gone), replies with its values and the acknowledgements
  // of forwards up to it wait.
  void Sent(int64_t update) { unacknowledged_.insert(update); }
  void Acknowledged(int64_t update) { unacknowledged_.erase(update); }
  // Whether every update up to `version` that this copy sent was acknowledged.
  bool AcknowledgedThrough(int64_t version) const {
    return unacknowledged_.empty() || *unacknowledged_.begin() > version;
  }
  // The updates sent and not acknowledged yet; the first of them. REQUIRES: unacknowledged().
  size_t unacknowledged() const { return unacknowledged_.size(); }
  int64_t first_unacknowledged() const { return *unacknowledged_.begin(); }

  // `ack` is due (TakeDue) once `update` is applied here and every copy after this one has it.
  // `chain` (empty: unchanged): the copies after this one, as the forward being acknowledged
  // named them (ChainOfParked).
  void AwaitCopies(int64_t update, const std::string& chain, Ack ack);
  // Moves the acknowledgements due now that the part is at `version` to `due`, in the order
  // they came.
  void TakeDue(int64_t version, std::vector<Ack>* due);

  // A joined server took a copy of the part (DenseShard::CopyTo, SparseTables::CopyTo): every
  // later update goes there too, last in its chain (ChainWith). Empty: none.
  void CopiedTo(const std::string& joined) { joined_ = joined; }
  const std::string& joined() const { return joined_; }
  // Where the parked forwards go on when a worker's request applies them (its primary is gone):
  // the chain the request names (`forward_to`), or else the copies after this one as the last
  // forward named them, then the joined server.
  std::string ChainOfParked(const std::string& forward_to) const;

  // InvalidArgument "<what>: the job has workers 0 to 1" for a forward of a worker outside the
  // job's `num_workers`; OK otherwise.
  static Status CheckPushedBy(const std::string& what, int pushed_by, int num_workers);

 protected:
  // Forgets the updates sent and moves every waiting acknowledgement to `acks`.
  void ClearAcknowledgements(std::vector<Ack>* acks);

 private:
  std::set<int64_t> unacknowledged_;
  std::vector<std::pair<int64_t, Ack>> acks_;  // (update, its acknowledgement), as they came
  std::string chain_;
  std::string joined_;
};

// `Payload`: what a forwarded push carries for the part, parked as it came (moved in and out).
template <typename Payload>
class ReplicationLog : public ReplicationLogBase {
 public:
  // A forwarded push: worker `rank`'s push of step `step`.
  struct Parked {
    int rank = 0;
    int64_t step = 0;
    Payload payload;
  };
  // A parked push its part applies now, as update `update` here.
  struct Next {
    int64_t update = 0;
    Parked parked;
  };

  // A forward of the primary's update `update`: parked unless the part applied it already
  // (its version is at `update` or past it: a copy, left alone); a copy of one parked keeps
  // the first. Returns whether the part has not applied it (the owner then applies the
  // parked pushes that are next: TakeNext).
  bool Park(int64_t update, const ConsistencyPolicy& policy, Parked parked) {
    if (update <= policy.version()) return false;
    parked_.emplace(update, std::move(parked));
    return true;
  }

  // Takes the parked pushes in update order while the first is the part's next update (`all`:
  // every one, the gaps closed, as nothing fills them once the primary is gone), each as
  // `policy`'s next push of its worker, and returns those the policy applies now (kApplyNow),
  // in order, numbered as applied here, for the owner to apply. ps-async and ps-ssp refuse no
  // push; one the policy takes as a copy of a push its worker made here (kApplied) applies
  // nothing and is dropped.
  std::vector<Next> TakeNext(ConsistencyPolicy* policy, bool all) {
    std::vector<Next> next;
    while (!parked_.empty() && (all || parked_.begin()->first == policy->version() + 1)) {
      Parked parked = std::move(parked_.begin()->second);
      parked_.erase(parked_.begin());
      StatusOr<PushDecision> decided = policy->Push(parked.rank, parked.step);
      if (!decided.ok() || decided->action != PushAction::kApplyNow) continue;
      next.push_back(Next{decided->update, std::move(parked)});
    }
    return next;
  }

  bool has_parked() const { return !parked_.empty(); }

  // The part's state was replaced (a restore): drops the parked pushes and forgets the updates
  // sent; every waiting acknowledgement goes to `acks` (the restored state replaces what they
  // acknowledge). The copies after this one and the joined server stay.
  void Clear(std::vector<Ack>* acks) {
    parked_.clear();
    ClearAcknowledgements(acks);
  }

 private:
  std::map<int64_t, Parked> parked_;  // by the primary's update number
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_REPLICATION_LOG_H_
