// StepForwarder: sends the updates a range's copy applied (ps-sync: the primary's steps; ps-async
// and ps-ssp: the pushes, dense and embedding rows, of the primary or of a backup in a chain) to
// the next copy of the range (DenseShard::Forwarder, SparseTables::Forwarder) and says when
// each one is done: held there, or every copy after this one is gone, so the replies (or the
// acknowledgement) waiting for it may go.
//
//   StepForwarder forwarder(endpoint, StepForwarderOptions{});
//   forwarder.Forward(chain, /*range=*/0, job_token, std::move(step),
//                     [](const Status& refused) { ...the step's replies may go... });
//   forwarder.PeerLost(address, "server 1 failed: ...");   // from the coordinator's notice
//
// `chain` names the copies after this one in order, comma-separated (--replicas 2: the backup
// alone; ps-async and ps-ssp with 3 or more: "b1,b2", and b1 forwards on to b2). The update goes
// to the first one not declared failed, carrying the rest (its forward_to); when that one is
// declared failed before it answered, the update goes on to the next, so the copies after a
// failed middle one still get every update (they skip the ones they have).
//
// The calls are waited for on a thread of its own, each finished as it is answered; a backup the
// coordinator declared failed is not sent to again, and the calls to it end at once. A backup that
// refuses a step (its copy is not where the primary's was) or does not answer it in time is logged
// as an error, sent no further step, and the step is done with that error: the two copies may
// differ from then on.
//
// Thread-safety: thread-safe. `done` runs on the forwarder's thread.
#ifndef TESSERA_SERVER_PS_STEP_FORWARDER_H_
#define TESSERA_SERVER_PS_STEP_FORWARDER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/base/status.h"
#include "common/transport/rpc_endpoint.h"
#include "server/ps/dense_shard.h"
#include "server/ps/sparse_tables.h"

namespace tessera::server {

struct StepForwarderOptions {
  int server_rank = 0;             // this server's, for the messages
  int64_t timeout_ms = 30000;      // an unanswered step is given up after this (its replies go)
  // Sent again after this long unanswered, then after twice as long, up to 8x (the backup
  // takes a step once). Sooner than a worker's requests (--ps-resend-ms, 2000): a forwarded
  // step is a few chunks between two servers, answered in milliseconds, and every worker's
  // step waits for it.
  int64_t resend_ms = 250;
};

class StepForwarder {
 public:
  StepForwarder(RpcEndpoint* endpoint, const StepForwarderOptions& options);
  // Stops the thread; steps still waiting are dropped with their replies (as the service's).
  ~StepForwarder();

  // Called once a step is done: OK when the backup has it or is gone, else why the backup
  // refused it or did not answer.
  using Done = std::function<void(const Status& refused)>;
  // Sends `forwarded` of key range `range` (job `job_token`) along `chain` (see above); `done`
  // runs once, on the forwarder's thread. Never blocks.
  void Forward(const std::string& chain, int range, uint64_t job_token,
               DenseShard::ForwardedStep forwarded, Done done);
  // The same for a row push applied here (ps-async, ps-ssp: SparseTables::Forwarder).
  void ForwardRows(const std::string& chain, int range, SparseTables::ForwardedRows rows,
                   Done done);
  // The member at `address` was declared failed (`why`): its calls end, and no step goes
  // there any more.
  void PeerLost(const std::string& address, const std::string& why);

 private:
  struct Pending {
    std::string to;
    std::string what;  // the update, and where it went
    std::shared_future<StatusOr<Envelope>> reply;
    Done done;
    // The copies after `to`, with the update and its description, for when `to` fails first.
    std::string rest;
    MessageBody request;  // set only when `rest` is not empty
    int64_t step = 0;
    std::string update;
  };
  // Calls the first copy of `chain` not declared failed with `request` (the update `update`
  // describes, naming the rest of the chain) and queues the wait for it.
  void Send(const std::string& chain, MessageBody request, int64_t step, std::string update,
            Done done);
  void Loop();
  // Runs `pending`'s done, or sends it on to the next copy of its chain. On the thread.
  void Finish(Pending pending);
  // Wakes the thread: a call was made, or answered, or the forwarder stops. Shared with the
  // calls' `settled` callbacks, which may run after this forwarder is gone (a forward still
  // out when its server stops).
  struct Wakeup {
    void Signal();
    // A leaf lock: the endpoint signals under its own lock, which Send holds mu_ around.
    std::mutex mu;
    std::condition_variable cv;
    uint64_t signals = 0;  // guarded by mu
  };

  RpcEndpoint* const endpoint_;
  const StepForwarderOptions options_;
  std::mutex mu_;
  std::deque<Pending> pending_;  // guarded by mu_: sent, not yet taken by the thread
  std::set<std::string> lost_;   // guarded by mu_: declared failed, or refused a step
  bool stopping_ = false;        // guarded by mu_
  const std::shared_ptr<Wakeup> wakeup_ = std::make_shared<Wakeup>();
  std::thread thread_;           // last: starts once the rest is ready
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_STEP_FORWARDER_H_
