// For PsService's tests: an in-process fleet of one server (a PsService on an RpcEndpoint) and
// its workers' endpoints, each optionally behind a FaultyTransport; request builders that
// speak the message structs as a worker does; and Reference, the server's state computed by
// one process applying the same optimizer updates.
//
// Unless a test says otherwise: server 1 of 2 over a key space of 100 (it owns keys [50, 100)),
// two workers, a model of 10 dense floats in chunks of 4 (chunks 0, 1, 2: this server owns
// chunk 1, key 50) and one table "emb.0" of 100 rows of 2 (seed 42); SGD with lr 0.5.
//
// Thread-safety: the request builders may be called from several threads once Start returned.
#ifndef TESSERA_SERVER_PS_PS_TEST_FLEET_H_
#define TESSERA_SERVER_PS_PS_TEST_FLEET_H_

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/metrics/metric_names.h"
#include "common/training/embedding_table.h"
#include "common/training/ps_job.h"
#include "common/transport/faulty/faulty_transport.h"
#include "common/transport/rpc_endpoint.h"
#include "server/ps/ps_service.h"

namespace tessera::server {

inline constexpr int64_t kTestTimeoutMs = 10000;
inline constexpr uint64_t kTestKeySpace = 100;
inline constexpr uint64_t kTestToken = 7;
// How long a test watches a reply that must not come yet.
inline constexpr std::chrono::milliseconds kStillWaiting{300};

using Reply = std::shared_future<StatusOr<Envelope>>;
using Floats = std::vector<float>;
using ByKey = std::map<uint64_t, Floats>;  // a value per dense chunk, by key
using Ids = std::vector<int64_t>;

struct Fleet {
  int server_rank = 1;
  int num_servers = 2;
  int num_workers = 2;
  std::optional<FaultOptions> server_faults;  // on what the server sends (its replies)
  std::optional<FaultOptions> worker_faults;  // on what every worker sends (its requests)
  int64_t resend_ms = 0;  // the workers' calls resend after this long (0: never)
  // Also server 0 (primary_, with its service), whose range 0 the server can back: the
  // forwarded steps of --replicas 2.
  bool with_primary = false;
  // Also a third server (last_, with its service, rank 1 too), which can back range 0 after
  // the server: the chains of --replicas 3 (primary, server, last).
  bool with_last = false;
  int64_t park_limit_ms = 60000;  // PsServiceOptions::park_limit_ms
  int64_t long_wait_ms = 10000;   // PsServiceOptions::long_wait_ms (its default)
};

// The test job of `num_workers` workers (see the file comment).
PsJobConfig TestConfig(PsConsistency consistency, int num_workers);
Floats RandomFloats(std::mt19937& random, size_t n);
// "<TEST_TMPDIR>/<name>".
std::string TempRoot(const std::string& name);

// The server's state as one process computes it: the same updates (with the job's optimizer
// and schedule), in the order the consistency model applies them.
class Reference {
 public:
  Reference(const PsJobConfig& config, ByKey values);

  // ps-sync: step `step`'s gradients of every worker (by rank), summed in rank order, averaged.
  void ApplyStep(int64_t step, const std::vector<ByKey>& grads);
  // ps-async / ps-ssp: one worker's push, the next update of every chunk it names.
  void ApplyOne(const ByKey& grads);
  // ps-sync: step `step`'s rows of every worker, in rank order, averaged.
  void ApplyRows(int64_t step, const std::vector<Ids>& ids, const std::vector<Floats>& grads);
  // ps-async / ps-ssp: one worker's rows, the table's next update.
  void ApplyRowPush(const Ids& ids, const Floats& grads);

  const ByKey& values() const { return values_; }
  Floats Rows(const Ids& ids) const;

 private:
  void Sgd(int64_t updates_before, const Floats& g, Floats* p);

  PsJobConfig config_;
  ByKey values_;
  std::map<uint64_t, int64_t> updates_;
  int64_t row_updates_ = 0;
  EmbeddingTable table_;
};

class PsServiceTest : public ::testing::Test {
 protected:
  // Starts the server's endpoint and service and the workers' endpoints. Use with
  // ASSERT_NO_FATAL_FAILURE.
  void Start(Fleet fleet);
  void TearDown() override {
    last_service_.reset();
    primary_service_.reset();
    service_.reset();
  }

  // The initial values of this server's chunks under `config` (of range `range`'s, when it is
  // given: --replicas): chunk c's element j is c + j/8.
  ByKey InitialValues(const PsJobConfig& config, int range = -1) const;
  // Row ids of the table owned by server `owner`.
  Ids RowsOwnedBy(int owner, size_t count) const;
  static ByKey RandomGrads(std::mt19937& random, const ByKey& like);

  // Requests, as worker `worker` sends them. Init comes from worker 0.
  Reply Send(int worker, MessageBody body, int64_t step, const std::string& what,
             int64_t timeout_ms = kTestTimeoutMs);
  // The same to server 0 (Fleet::with_primary).
  Reply SendToPrimary(int worker, MessageBody body, int64_t step, const std::string& what);
  // The same to the third server (Fleet::with_last).
  Reply SendToLast(int worker, MessageBody body, int64_t step, const std::string& what);
  // Server 0's own range (0), as Init.
  Status InitPrimary(const PsJobConfig& config, const ByKey& values);
  // Range 0 on the third server, as Init.
  Status InitLast(const PsJobConfig& config, const ByKey& values);
  // A push-pull of range 0 to server 0 naming `backup` (PsPushPullRequest::forward_to).
  Reply PushToPrimary(int worker, int64_t step, const ByKey& grads, const std::string& backup);
  // `range`: PsInitRequest::range (-1: the server's own).
  Status Init(const PsJobConfig& config, const ByKey& values, int range = -1);
  // what: "push-pull of step <step> by worker <worker>".
  Reply PushPull(int worker, int64_t step, const ByKey& grads,
                 int64_t timeout_ms = kTestTimeoutMs);
  Reply Pull(int worker, int64_t step, const std::vector<uint64_t>& keys);
  Reply SparsePush(int worker, int64_t step, const Ids& ids, const Floats& grads);
  Reply SparsePull(int worker, int64_t step, const Ids& ids);
  Reply Checkpoint(const std::string& root, int64_t step, bool restore);

  // The values of a push-pull reply by key, or the rows of a sparse pull reply; a test failure
  // (and nothing) for an error.
  static ByKey ValuesOf(const Reply& reply);
  static Floats RowsOf(const Reply& reply);

  // A request to `server` (primary_ or last_), as Send; range 0's init there, as Init.
  Reply SendToServer(const RpcEndpoint& server, int worker, MessageBody body, int64_t step,
                     const std::string& what);
  Status InitRangeZero(const RpcEndpoint& server, const PsJobConfig& config, const ByKey& values,
                       const std::string& what);

  double GaugeValue(const metric_names::MetricName& name);
  double DenseUpdates();

  Fleet fleet_;
  MetricsRegistry metrics_;
  std::unique_ptr<RpcEndpoint> server_;
  FaultyTransport* server_faults_ = nullptr;  // owned by server_, when fleet.server_faults
  std::vector<FaultyTransport*> worker_faults_;  // owned by workers_, when fleet.worker_faults
  std::vector<std::unique_ptr<RpcEndpoint>> workers_;
  std::unique_ptr<PsService> service_;
  MetricsRegistry primary_metrics_;
  std::unique_ptr<RpcEndpoint> primary_;  // Fleet::with_primary
  std::unique_ptr<PsService> primary_service_;
  MetricsRegistry last_metrics_;
  std::unique_ptr<RpcEndpoint> last_;  // Fleet::with_last
  std::unique_ptr<PsService> last_service_;
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_PS_TEST_FLEET_H_
