#include "server/ps/ps_service.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "common/training/ps_job.h"
#include "server/ps/dense_shard.h"
#include "server/ps/ps_metrics.h"
#include "server/ps/request_ledger.h"
#include "server/ps/shard_checkpoint.h"
#include "server/ps/sparse_tables.h"
#include "server/ps/step_forwarder.h"
#include "server/ps/work_queue.h"
#include "server/ps/worker_regions.h"

namespace tessera::server {
namespace {

// Everything this server holds of one key range of one job, from rank 0's init of the range
// until the next job's init.
struct Job {
  int range = 0;  // the server's own rank, or another's it holds a replica of (--replicas)
  PsJobConfig config;
  uint64_t token = 0;  // PsInitRequest.job_token
  // The init that created the job: a copy of it must not replace the job.
  int init_rank = -1;
  uint64_t init_request_id = 0;
  std::unique_ptr<DenseShard> dense;
  std::unique_ptr<SparseTables> tables;
  std::unique_ptr<WorkerRegions> regions;  // of the workers on this host that offered one
  // Why the range's backup refused a forwarded step (or did not answer it): the copies may
  // differ from then on, so the range's pushes are refused, naming it. OK: none did.
  mutable std::mutex diverged_mu;
  Status diverged;  // guarded by diverged_mu
  // Pushes and checkpoints taken and answered, so a copy is served once and answered again.
  // Shared with the replies that leave later.
  std::shared_ptr<RequestLedger> ledger = std::make_shared<RequestLedger>();
};

// How often replies held too long are looked for (PsServiceOptions::long_wait_ms).
constexpr auto kWatchEvery = std::chrono::seconds(1);
// The chunks of a range whose long waits are logged as warnings at each look; the others go to
// the debug log.
constexpr size_t kLongWaitLines = 3;

constexpr MessageType kServed[] = {MessageType::kPsInitRequest, MessageType::kPsPushPullRequest,
                                   MessageType::kSparsePushRequest,
                                   MessageType::kSparsePullRequest,
                                   MessageType::kCheckpointRequest};

}  // namespace

class PsService::Impl : public std::enable_shared_from_this<PsService::Impl> {
 public:
  Impl(const PsServiceOptions& options, RpcEndpoint* endpoint, std::unique_ptr<PsMetrics> metrics)
      : options_(options),
        endpoint_(endpoint),
        metrics_(std::move(metrics)),
        forwarder_(endpoint, StepForwarderOptions{options.server_rank,
                                                  options.forward_timeout_ms}),
        queue_(options.threads) {}

  ~Impl() { StopWatch(); }

  void PeerLost(const std::string& address, const std::string& why) {
    forwarder_.PeerLost(address, why);
  }

  // On the work queue (urgent: the replies it releases are what every other worker waits
  // for), not on the caller's thread: applying a completed step takes the chunks' locks.
  void WorkerLeft(int rank, const std::string& why) {
    std::weak_ptr<Impl> weak = shared_from_this();
    queue_.PostUrgent([weak, rank, why] {
      auto self = weak.lock();
      if (self == nullptr) return;
      for (const std::shared_ptr<Job>& job : self->Jobs()) {
        if (rank < 0 || rank >= job->config.num_workers) continue;
        TLOG(INFO) << RangeName(job->range) << ": worker " << rank
                   << " no longer counts (elastic job): " << why;
        job->dense->RemoveWorker(rank);
        if (job->tables != nullptr) job->tables->RemoveWorker(rank);
      }
    });
  }

  std::vector<std::shared_ptr<Job>> Jobs() {
    std::vector<std::shared_ptr<Job>> jobs;
    std::lock_guard<std::mutex> held(job_mu_);
    for (const auto& [range, job] : jobs_) jobs.push_back(job);
    return jobs;
  }

  void StartWatch() {
    if (options_.long_wait_ms <= 0) return;
    watch_ = std::thread([this] { WatchLongWaits(); });
  }

  // Handlers only queue the request (they run on the transport's I/O thread).
  void InstallHandlers() {
    std::weak_ptr<Impl> weak = shared_from_this();
    for (MessageType type : kServed) {
      endpoint_->SetHandler(type, [weak](Envelope envelope) {
        auto self = weak.lock();
        if (self == nullptr || !envelope.origin.IsRequest()) return;
        self->Post(std::move(envelope));
      });
    }
  }

  // From now on a request is answered that this server has stopped (not that it "does not
  // serve" its type); requests still queued are dropped (their workers are told by the
  // coordinator, or time out).
  void Stop() {
    const Status stopped =
        UnavailableError("server " + std::to_string(options_.server_rank) + " has stopped");
    RpcEndpoint* endpoint = endpoint_;  // outlives the handlers it owns
    for (MessageType type : kServed) {
      endpoint_->ReplaceHandler(type, [endpoint, stopped](Envelope envelope) {
        if (envelope.origin.IsRequest()) endpoint->ReplyError(envelope, stopped);
      });
    }
    StopWatch();
    queue_.Stop();
  }

 private:
  // Replies held longer than options_.long_wait_ms are logged once each, saying what holds
  // them (DenseShard::DescribeLongWaits): their workers see only their deadlines.
  void WatchLongWaits() {
    const auto limit = std::chrono::milliseconds(options_.long_wait_ms);
    std::unique_lock<std::mutex> lock(watch_mu_);
    while (!watch_cv_.wait_for(lock, kWatchEvery, [this] { return watch_stopping_; })) {
      lock.unlock();
      std::vector<std::shared_ptr<Job>> jobs;
      {
        std::lock_guard<std::mutex> held(job_mu_);
        for (const auto& [range, job] : jobs_) jobs.push_back(job);
      }
      for (const std::shared_ptr<Job>& job : jobs) {
        // A slow worker holds every chunk's replies alike: a few lines, the rest at debug.
        const std::vector<std::string> lines = job->dense->DescribeLongWaits(limit);
        for (size_t i = 0; i < lines.size(); ++i) {
          if (i < kLongWaitLines) {
            TLOG(WARNING) << RangeName(job->range) << ", " << lines[i];
          } else {
            TLOG(DEBUG) << RangeName(job->range) << ", " << lines[i];
          }
        }
        if (lines.size() > kLongWaitLines) {
          TLOG(WARNING) << RangeName(job->range) << ": " << lines.size() - kLongWaitLines
                        << " more chunks hold replies that long (--log-level debug names them)";
        }
      }
      lock.lock();
    }
  }

  void StopWatch() {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watch_stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watch_.joinable()) watch_.join();
  }

  void Post(Envelope request) {
    // A forwarded update holds the primary's replies until this server acknowledges it: it
    // goes before the workers' requests queued here.
    const auto* push_pull = request.As<PsPushPullRequest>();
    const auto* sparse_push = request.As<SparsePushRequest>();
    const bool urgent = (push_pull != nullptr && push_pull->forwarded) ||
                        (sparse_push != nullptr && sparse_push->forwarded);
    auto serve = [self = shared_from_this(), request = std::move(request)] {
      self->Serve(request);
    };
    if (urgent) {
      queue_.PostUrgent(std::move(serve));
    } else {
      queue_.Post(std::move(serve));
    }
  }

  Status WithServer(const Status& status) const {
    return status.WithContext("server " + std::to_string(options_.server_rank));
  }

  // The key range `request` is for (its `range`; -1: this server's own), or InvalidArgument.
  StatusOr<int> RangeOf(const Envelope& request) const {
    int range = -1;
    if (const auto* init = request.As<PsInitRequest>()) range = init->range;
    if (const auto* push_pull = request.As<PsPushPullRequest>()) range = push_pull->range;
    if (const auto* push = request.As<SparsePushRequest>()) range = push->range;
    if (const auto* pull = request.As<SparsePullRequest>()) range = pull->range;
    if (const auto* checkpoint = request.As<CheckpointRequest>()) range = checkpoint->range;
    if (range < 0) return options_.server_rank;
    if (range >= options_.num_servers) {
      return InvalidArgumentError("range " + std::to_string(range) + " of " +
                                  std::string(MessageTypeName(request.type())) + " from " +
                                  request.header.DescribeSender() + " is outside the " +
                                  std::to_string(options_.num_servers) + " servers' ranges");
    }
    return range;
  }

  void AnswerError(const Envelope& request, const Status& status) {
    endpoint_->ReplyError(request, WithServer(status));
  }

  // Answers a request the job's ledger took, and records that it was answered: a copy is then
  // answered with `kept` if given, else anew.
  void Answer(const Envelope& request, const Job& job, MessageBody reply, bool keep) {
    std::optional<MessageBody> kept;
    if (keep) kept = reply;
    job.ledger->Answered(request.header.sender_rank, request.header.request_id, std::move(kept));
    endpoint_->Reply(request, std::move(reply));
  }

  // Replies that leave later, from whichever request releases them: the transport answers on
  // the request's connection without keeping the request (and its tensors) alive. With a
  // ledger, the request is recorded as answered (a copy is answered anew).
  // `keep`: a copy is answered with this reply (as Answer's).
  template <typename Body>
  std::function<void(Body)> ReplyLater(const Envelope& request,
                                       std::shared_ptr<RequestLedger> ledger = nullptr,
                                       bool keep = false) {
    return [endpoint = endpoint_, origin = request.origin, id = request.header.request_id,
            rank = request.header.sender_rank, ledger = std::move(ledger), keep](Body body) {
      if (ledger != nullptr) {
        ledger->Answered(rank, id, keep ? std::optional<MessageBody>(body) : std::nullopt);
      }
      Status sent = endpoint->transport().Reply(origin, OutgoingMessage{id, -1, std::move(body)});
      if (!sent.ok()) TLOG(WARNING) << MessageTypeName(TypeOfBody<Body>()) << ": " << sent;
    };
  }

  // On a work-queue thread: finds the request's job (or parks it), drops a copy of a request
  // the job took already, and hands it to the job's part.
  void Serve(const Envelope& request) {
    const MessageType type = request.type();
    if (type == MessageType::kPsInitRequest) return ServeInit(request);
    StatusOr<int> range = RangeOf(request);
    if (!range.ok()) return AnswerError(request, range.status());
    std::shared_ptr<Job> job;
    if (type == MessageType::kCheckpointRequest) {
      job = JobOf(*range);
      if (job == nullptr) {
        return AnswerError(request, FailedPreconditionError(
                                        "checkpoint: no job was initialised" +
                                        RangeSuffix(*range)));
      }
    } else {
      job = JobOrPark(request, *range);
      if (job == nullptr) return;
    }
    const PsPushPullRequest* push_pull = request.As<PsPushPullRequest>();
    const CheckpointRequest* checkpoint = request.As<CheckpointRequest>();
    // A step forwarded by the range's primary is applied once by its step, not by the ledger
    // (whose request ids are the workers').
    if (push_pull != nullptr && push_pull->forwarded) return ServeForwarded(request, *job);
    const SparsePushRequest* sparse_push = request.As<SparsePushRequest>();
    if (sparse_push != nullptr && sparse_push->forwarded) {
      return ServeForwardedRows(request, *job);
    }
    // A copy of a range (CheckpointRequest::copy) writes nothing; it is answered at each asking.
    const bool changes_state = type != MessageType::kSparsePullRequest &&
                               (push_pull == nullptr || push_pull->has_gradients) &&
                               (checkpoint == nullptr || !checkpoint->copy);
    if (changes_state) {
      switch (job->ledger->Take(request.header.sender_rank, request.header.request_id)) {
        case RequestLedger::kNew:
          break;
        case RequestLedger::kTaken:
          // The original's reply, when it goes, answers the copy too (one request id).
          TLOG(DEBUG) << MessageTypeName(type) << " " << request.header.request_id << " of "
                      << request.header.DescribeSender()
                      << " arrived again while it is served; served once";
          metrics_->RequestRepeated();
          return;
        case RequestLedger::kAnswered:
          metrics_->RequestRepeated();
          return AnswerAgain(request, *job);
      }
    }
    Status status = OkStatus();
    switch (type) {
      case MessageType::kPsPushPullRequest:
        status = CheckRank(*job, request);
        if (status.ok() && push_pull->region_fd >= 0) {
          ServeRegionOffer(request, *job);
          return;
        }
        if (status.ok() && !push_pull->model.empty() && !job->config.model.empty()) {
          status = CheckPsModel(job->config.model, push_pull->model, request.header.sender_rank);
        }
        if (status.ok()) status = ServePushPull(request, *job);
        break;
      case MessageType::kSparsePushRequest: {
        const SparsePushRequest* body = request.As<SparsePushRequest>();
        status = CheckRank(*job, request);
        if (status.ok()) status = Diverged(*job);
        if (status.ok()) {
          // Acknowledged once taken (with a backup named, once the backup has it too).
          status = job->tables->Push(
              body->table, request.header.sender_rank, request.header.step, body->row_ids,
              body->values, body->forward_to,
              [ack = ReplyLater<Ack>(request, job->ledger, /*keep=*/true)] { ack(Ack{}); });
        }
        break;
      }
      case MessageType::kSparsePullRequest: {
        const SparsePullRequest* body = request.As<SparsePullRequest>();
        status = job->tables->Pull(body->table, request.header.step, body->row_ids,
                                   ReplyLater<SparsePullReply>(request));
        break;
      }
      case MessageType::kCheckpointRequest:
        status = ServeCheckpoint(request, *job);
        break;
      default:
        return;
    }
    if (!status.ok()) {
      if (changes_state) {
        // A copy gets the same error.
        Answer(request, *job, ErrorReplyOf(WithServer(status)), /*keep=*/true);
      } else {
        AnswerError(request, status);
      }
    }
  }

  // A copy of an answered request (its reply may have been lost): the reply kept, or for a
  // dense push-pull of step t the values after step t, which its reply carried (ps-sync
  // applies no later step before this worker pushes one; in the other models they may be
  // newer, as any pull's). Applies nothing.
  void AnswerAgain(const Envelope& request, const Job& job) {
    const int rank = request.header.sender_rank;
    if (std::optional<MessageBody> kept = job.ledger->ReplyOf(rank, request.header.request_id)) {
      endpoint_->Reply(request, std::move(*kept));
      return;
    }
    if (request.type() != MessageType::kPsPushPullRequest) return;  // every other reply is kept
    Status status = ServePushPull(request, job, /*again=*/true);
    if (!status.ok()) AnswerError(request, status);
  }

  // What runs once the backup has a forwarded update (or is gone): `done` (the replies waiting
  // for it go; its values are here), after marking the job diverged if the backup refused it.
  static StepForwarder::Done AfterForward(std::shared_ptr<Job> held, std::function<void()> done) {
    return [held = std::move(held), done = std::move(done)](const Status& refused) {
      if (!refused.ok()) {
        std::lock_guard<std::mutex> lock(held->diverged_mu);
        if (held->diverged.ok()) held->diverged = refused;
      }
      done();
    };
  }

  // FailedPrecondition once the range's backup refused an update or left it unanswered.
  static Status Diverged(const Job& job) {
    std::lock_guard<std::mutex> lock(job.diverged_mu);
    if (job.diverged.ok()) return OkStatus();
    return FailedPreconditionError(RangeName(job.range) +
                                   "'s backup lost an update, so its two copies may differ and the "
                                   "range cannot survive this server's death; stopping the job (" +
                                   job.diverged.message() + ")");
  }

  // `again`: a copy of an answered push, served as the pull of its step's values (see
  // AnswerAgain).
  Status ServePushPull(const Envelope& request, const Job& job, bool again = false) {
    const PsPushPullRequest* body = request.As<PsPushPullRequest>();
    RETURN_IF_ERROR(Diverged(job));
    const int rank = request.header.sender_rank;
    const int64_t step = again ? request.header.step + 1 : request.header.step;
    const bool push = body->has_gradients && !again;
    const bool skip = body->skip && !again;
    const bool stop = body->stop && push;  // ps-sync: the workers stop after this step
    const int join = push ? body->join : -1;  // ps-sync: a server joins after this step
    if (skip && !push) {
      return InvalidArgumentError("worker " + std::to_string(rank) + " skipped step " +
                                  std::to_string(step) + " in a pull (a skip is a push)");
    }
    // A push is answered once (its copies again, from the ledger); a pull at every asking.
    std::shared_ptr<RequestLedger> ledger = push ? job.ledger : nullptr;
    DenseShard::ReplyCallback send = ReplyLater<PsPushPullReply>(request, ledger);
    if (body->ack_only) {
      // A backup's reply: the worker takes the values from the range's primary.
      send = [send = std::move(send)](PsPushPullReply reply) {
        for (TensorData& tensor : reply.tensors) tensor.bytes = Payload();
        send(std::move(reply));
      };
    }
    const std::string& forward_to = push ? body->forward_to : std::string();
    if (!body->in_region) {
      if (skip) {
        return job.dense->Skip(rank, step, body->tensors, std::move(send), stop, join,
                               forward_to);
      }
      return job.dense->PushPull(rank, step, body->tensors, push, std::move(send), stop, join,
                                 forward_to);
    }
    // A skip's gradients are not read: the region's views are not taken.
    const bool read = push && !skip;
    ASSIGN_OR_RETURN(std::vector<TensorData> tensors,
                     job.regions->Tensors(rank, body->tensors, read));
    // A backup asked alongside the primary writes no values (the worker reads the primary's).
    DenseShard::ReplyCallback reply =
        body->ack_only ? std::move(send) : job.regions->ReplyInto(rank, std::move(send));
    if (skip) {
      return job.dense->Skip(rank, step, tensors, std::move(reply), stop, join, forward_to);
    }
    return job.dense->PushPull(rank, step, tensors, push, std::move(reply), stop, join,
                               forward_to, /*in_region=*/read);
  }

  // A row push the range's primary applied (ps-async, ps-ssp): acknowledged, then applied
  // here in the primary's order.
  void ServeForwardedRows(const Envelope& request, const Job& job) {
    const SparsePushRequest* body = request.As<SparsePushRequest>();
    if (request.header.sender_role != Role::kServer) {
      return AnswerError(
          request,
          InvalidArgumentError("a forwarded row push from " + request.header.DescribeSender() +
                               ": only a range's primary server forwards updates"));
    }
    SparseTables::ForwardedRows rows{body->table,  body->pushed_by, request.header.step,
                                     body->update, body->row_ids,   body->values};
    rows.forward_to = body->forward_to;
    Status applied =
        job.tables->ApplyForwarded(rows, [ack = ReplyLater<Ack>(request)] { ack(Ack{}); });
    if (!applied.ok()) {
      return AnswerError(request,
                         applied.WithContext("forwarded by " + request.header.DescribeSender() +
                                             RangeSuffix(job.range)));
    }
  }

  // A step the range's primary applied (forwarded steps, see ps_service.h): applied here, then
  // acknowledged.
  void ServeForwarded(const Envelope& request, const Job& job) {
    const PsPushPullRequest* body = request.As<PsPushPullRequest>();
    if (request.header.sender_role != Role::kServer) {
      return AnswerError(request, InvalidArgumentError(
                                      "a forwarded step from " + request.header.DescribeSender() +
                                      ": only a range's primary server forwards steps"));
    }
    DenseShard::ForwardedStep forwarded;
    forwarded.step = request.header.step;
    forwarded.gradients = body->tensors;
    if (body->in_region && body->has_gradients) {
      // The gradients are in the workers' regions, mapped here too.
      if (Status taken = RegionGradients(job, request, &forwarded); !taken.ok()) {
        return AnswerError(request, taken.WithContext("step " + std::to_string(forwarded.step) +
                                                      " forwarded by " +
                                                      request.header.DescribeSender() +
                                                      RangeSuffix(job.range)));
      }
    }
    forwarded.dropped_by = body->dropped_by;
    forwarded.stopped_by = body->stopped_by;
    forwarded.joining = body->joining;
    forwarded.pushed_by = body->pushed_by;
    forwarded.updates = body->updates;
    forwarded.forward_to = body->forward_to;
    Status applied =
        job.dense->ApplyForwarded(forwarded, [ack = ReplyLater<Ack>(request)] { ack(Ack{}); });
    if (!applied.ok()) {
      return AnswerError(request, applied.WithContext("step " + std::to_string(forwarded.step) +
                                                      " forwarded by " +
                                                      request.header.DescribeSender() +
                                                      RangeSuffix(job.range)));
    }
  }

  // A forward's gradients (`forwarded->gradients` name the chunks) from the workers' regions:
  // ps-async and ps-ssp, views of worker pushed_by's; ps-sync, every worker's of each chunk
  // named without bytes (ForwardedStep::by_worker).
  static Status RegionGradients(const Job& job, const Envelope& request,
                                DenseShard::ForwardedStep* forwarded) {
    const PsPushPullRequest* body = request.As<PsPushPullRequest>();
    forwarded->in_region = true;
    if (job.config.consistency != PsConsistency::kSync) {
      ASSIGN_OR_RETURN(forwarded->gradients,
                       job.regions->Tensors(body->pushed_by, body->tensors, /*push=*/true));
      return OkStatus();
    }
    for (const TensorData& tensor : body->tensors) {
      std::vector<TensorData> by_rank;  // none for a chunk that carries its average
      for (int rank = 0; tensor.bytes.empty() && rank < job.config.num_workers; ++rank) {
        ASSIGN_OR_RETURN(std::vector<TensorData> view,
                         job.regions->Tensors(rank, {tensor}, /*push=*/true));
        by_rank.push_back(std::move(view[0]));
      }
      forwarded->by_worker.push_back(std::move(by_rank));
    }
    return OkStatus();
  }

  // A worker on this host offers its shared region; a refusal is an answer, not an error (its
  // chunks then travel in frames).
  void ServeRegionOffer(const Envelope& request, const Job& job) {
    const int rank = request.header.sender_rank;
    Status mapped = job.regions->Map(rank, *request.As<PsPushPullRequest>());
    PsPushPullReply reply;
    reply.region_mapped = mapped.ok();
    if (mapped.ok()) {
      // The worker says so, once for all its servers (quiet output: issue 22).
      TLOG(DEBUG) << "worker " << rank << " shares a region with this server: its chunks "
                  << "travel through shared memory";
    } else {
      reply.region_refusal = mapped.message();
      TLOG(INFO) << "worker " << rank << "'s shared region is not mapped, its chunks travel "
                 << "over the transport: " << mapped.message();
    }
    endpoint_->Reply(request, std::move(reply));
  }

  void ServeInit(const Envelope& request) {
    const PsInitRequest* init = request.As<PsInitRequest>();
    StatusOr<int> range = RangeOf(request);
    if (!range.ok()) return AnswerError(request, range.status());
    StatusOr<PsJobConfig> config = DecodePsJobConfig(init->config);
    if (!config.ok()) return AnswerError(request, config.status());
    auto job = std::make_shared<Job>();
    job->range = *range;
    job->config = *config;
    job->token = init->job_token;
    job->init_rank = request.header.sender_rank;
    job->init_request_id = request.header.request_id;
    const ServerPlacement placement{*range, options_.num_servers, options_.key_space};
    // The job's updates go to the backup the workers name; the job lives until each is done.
    DenseShard::Forwarder forward = [self = weak_from_this(), weak_job = std::weak_ptr<Job>(job)](
                                        const std::string& to, DenseShard::ForwardedStep step,
                                        std::function<void()> done) {
      std::shared_ptr<Impl> service = self.lock();
      std::shared_ptr<Job> held = weak_job.lock();
      if (service == nullptr || held == nullptr) return;  // stopping: the replies are dropped
      service->forwarder_.Forward(to, held->range, held->token, std::move(step),
                                  AfterForward(held, std::move(done)));
    };
    SparseTables::Forwarder forward_rows =
        [self = weak_from_this(), weak_job = std::weak_ptr<Job>(job)](
            const std::string& to, SparseTables::ForwardedRows rows, std::function<void()> done) {
          std::shared_ptr<Impl> service = self.lock();
          std::shared_ptr<Job> held = weak_job.lock();
          if (service == nullptr || held == nullptr) return;  // stopping: the acks are dropped
          service->forwarder_.ForwardRows(to, held->range, std::move(rows),
                                          AfterForward(held, std::move(done)));
        };
    StatusOr<std::unique_ptr<DenseShard>> dense =
        DenseShard::Create(*config, placement, init->tensors, metrics_.get(), std::move(forward));
    if (!dense.ok()) return AnswerError(request, dense.status().WithContext(RangeName(*range)));
    job->dense = std::move(dense).value();
    job->regions = std::make_unique<WorkerRegions>(job->dense->chunks());
    job->tables = std::make_unique<SparseTables>(*config, *range, options_.num_servers,
                                                 metrics_.get(), std::move(forward_rows));
    if (init->copy_step > 0) {
      // A copy of the range from one of its replicas (this server joined in a failed one's
      // place): the job starts at that step with its values, optimizer state and rows.
      const ShardParts parts{&job->config, job->range, options_.num_servers, job->dense.get(),
                             job->tables.get()};
      const std::string from = "the copy of " + RangeName(*range) + " of step " +
                               std::to_string(init->copy_step) + " from " +
                               request.header.DescribeSender();
      if (Status loaded = LoadShardCopy(parts, init->copy, init->copy_step, from); !loaded.ok()) {
        return AnswerError(request, loaded);
      }
      TLOG(INFO) << "took " << from << " (" << init->copy.size() << " entries"
                 << (config->consistency == PsConsistency::kSync
                         ? std::string()
                         : "; its chunks had applied " +
                               std::to_string(job->dense->AppliedUpdates()) + " updates")
                 << ")";
    }
    const double bytes = DenseBytes(*job);
    double all_bytes = 0;  // of every range this server holds
    std::vector<Envelope> early;
    std::vector<Parked> expired;
    {
      std::lock_guard<std::mutex> lock(job_mu_);
      auto held = jobs_.find(*range);
      if (held != jobs_.end() && held->second->token == job->token &&
          held->second->init_rank == job->init_rank &&
          held->second->init_request_id == job->init_request_id) {
        // A copy of the init that created the range's current job (its reply may have been
        // lost): answered again, nothing replaced.
        TLOG(DEBUG) << "the init of the current job arrived again; served once";
        metrics_->RequestRepeated();
        endpoint_->Reply(request, Ack{});
        return;
      }
      if (!jobs_.empty() && jobs_.begin()->second->token != job->token) {
        TLOG(INFO) << "a new job replaces the previous one";
        jobs_.clear();
      }
      jobs_[*range] = job;
      for (const auto& [held_range, held_job] : jobs_) all_bytes += DenseBytes(*held_job);
      metrics_->SetKeyRanges(static_cast<int>(jobs_.size()));
      // The parked requests this init serves go now; the others wait on, as long as the limit.
      expired = TakeExpired();
      std::vector<Parked> waiting;
      for (Parked& parked : before_init_) {
        StatusOr<int> parked_range = RangeOf(parked.request);
        if (parked_range.ok() && JobFor(parked.request, *parked_range) != nullptr) {
          early.push_back(std::move(parked.request));
        } else {
          waiting.push_back(std::move(parked));
        }
      }
      before_init_.swap(waiting);
    }
    AnswerExpired(expired);
    metrics_->NewJob(all_bytes, all_bytes * static_cast<double>(job->dense->state_per_element()));
    TLOG(INFO) << PsModeName(config->consistency) << " job for " << config->num_workers
               << " workers" << RangeSuffix(*range) << ": " << job->dense->chunks().size()
               << " dense chunks (" << static_cast<uint64_t>(bytes) << " bytes), "
               << config->tables.size() << " embedding tables, "
               << config->optimizer.ToString();
    endpoint_->Reply(request, Ack{});
    for (Envelope& envelope : early) Post(std::move(envelope));
  }

  Status ServeCheckpoint(const Envelope& request, const Job& job) {
    const CheckpointRequest* body = request.As<CheckpointRequest>();
    const ShardParts parts{&job.config, job.range, options_.num_servers, job.dense.get(),
                           job.tables.get()};
    if (body->copy) {
      ASSIGN_OR_RETURN(std::vector<TensorData> tensors,
                       CopyShard(parts, body->step, body->forward_to, body->forward_rank));
      if (!body->forward_to.empty()) {
        TLOG(WARNING) << RangeName(job.range) << " copied for server " << body->forward_rank
                      << " (joined at " << body->forward_to << "), which gets every update "
                      << "of it from now on";
      }
      CheckpointReply reply{"", body->step, {}, {}, {}};
      reply.tensors = std::move(tensors);
      endpoint_->Reply(request, std::move(reply));
      return OkStatus();
    }
    StatusOr<ShardFileInfo> info = body->restore
                                       ? RestoreShard(parts, body->directory, body->step)
                                       : SaveShard(parts, body->directory, body->step);
    if (!info.ok()) return info.status();
    Answer(request, job,
           CheckpointReply{body->directory, body->step, {info->file}, {info->bytes},
                           {info->checksum}},
           /*keep=*/true);
    return OkStatus();
  }

  static double DenseBytes(const Job& job) {
    double bytes = 0;
    for (const DenseChunk& chunk : job.dense->chunks()) {
      bytes += static_cast<double>(chunk.size) * sizeof(float);
    }
    return bytes;
  }

  static std::string RangeName(int range) { return "range " + std::to_string(range); }

  // ", range 2" for a range this server holds a replica of; empty for its own.
  std::string RangeSuffix(int range) const {
    return range == options_.server_rank ? std::string() : ", " + RangeName(range);
  }

  std::shared_ptr<Job> JobOf(int range) {
    std::lock_guard<std::mutex> lock(job_mu_);
    auto it = jobs_.find(range);
    return it == jobs_.end() ? nullptr : it->second;
  }

  // A request waiting for its job's init, since when.
  struct Parked {
    SteadyClock::time_point since;
    Envelope request;
  };

  // A request before its job exists waits for the job's init of its range (other workers
  // start as fast as rank 0; a push-pull names its job, so one of the next job waits while
  // the servers still hold the previous one). Returns null after parking it.
  std::shared_ptr<Job> JobOrPark(const Envelope& request, int range) {
    std::vector<Parked> expired;
    {
      std::lock_guard<std::mutex> lock(job_mu_);
      std::shared_ptr<Job> job = JobFor(request, range);
      if (job != nullptr) return job;
      expired = TakeExpired();
      before_init_.push_back(Parked{SteadyClock::now(), request});
    }
    AnswerExpired(expired);
    return nullptr;
  }

  // The job `request` (of range `range`) is for, or null when it has not been initialised
  // here (a push-pull names its job by token). REQUIRES: job_mu_ held.
  std::shared_ptr<Job> JobFor(const Envelope& request, int range) const {
    auto it = jobs_.find(range);
    if (it == jobs_.end()) return nullptr;
    const PsPushPullRequest* push_pull = request.As<PsPushPullRequest>();
    if (push_pull != nullptr && push_pull->job_token != it->second->token) return nullptr;
    return it->second;
  }

  // The parked requests that waited longer than the limit, no longer parked. REQUIRES: job_mu_
  // held.
  std::vector<Parked> TakeExpired() {
    const SteadyClock::time_point oldest =
        SteadyClock::now() - std::chrono::milliseconds(options_.park_limit_ms);
    std::vector<Parked> expired, kept;
    for (Parked& parked : before_init_) {
      (parked.since < oldest ? expired : kept).push_back(std::move(parked));
    }
    before_init_.swap(kept);
    return expired;
  }

  void AnswerExpired(const std::vector<Parked>& expired) {
    for (const Parked& parked : expired) {
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - parked.since)
              .count();
      std::string job = "its job";
      if (const auto* push_pull = parked.request.As<PsPushPullRequest>()) {
        job = "its job (token " + std::to_string(push_pull->job_token) + ")";
      }
      StatusOr<int> range = RangeOf(parked.request);
      AnswerError(parked.request,
                  FailedPreconditionError(
                      std::string(MessageTypeName(parked.request.type())) + " from " +
                      parked.request.header.DescribeSender() + " waited " + std::to_string(waited) +
                      " ms for " + job + " to be initialised" +
                      (range.ok() ? RangeSuffix(*range) : std::string()) +
                      ", longer than the limit (" + std::to_string(options_.park_limit_ms) +
                      " ms): no worker initialised it here (a job replaced since?)"));
    }
  }

  static Status CheckRank(const Job& job, const Envelope& request) {
    const int rank = request.header.sender_rank;
    if (rank < 0 || rank >= job.config.num_workers) {
      return InvalidArgumentError("worker rank " + std::to_string(rank) + " is outside the job's " +
                                  std::to_string(job.config.num_workers) + " workers");
    }
    return OkStatus();
  }

  const PsServiceOptions options_;
  RpcEndpoint* const endpoint_;
  const std::unique_ptr<PsMetrics> metrics_;
  StepForwarder forwarder_;

  std::mutex job_mu_;
  // By range: this server's own, and with --replicas those it holds a replica of.
  std::map<int, std::shared_ptr<Job>> jobs_;  // guarded by job_mu_
  std::vector<Parked> before_init_;           // guarded by job_mu_

  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stopping_ = false;  // guarded by watch_mu_
  std::thread watch_;            // WatchLongWaits

  WorkQueue queue_;  // last: its threads stop before the rest goes
};

StatusOr<std::unique_ptr<PsService>> PsService::Start(const PsServiceOptions& options,
                                                      RpcEndpoint* endpoint,
                                                      MetricsRegistry* metrics) {
  ASSIGN_OR_RETURN(std::unique_ptr<PsMetrics> registered, PsMetrics::Register(metrics));
  auto impl = std::make_shared<Impl>(options, endpoint, std::move(registered));
  impl->InstallHandlers();
  impl->StartWatch();
  return std::unique_ptr<PsService>(new PsService(impl));
}

PsService::~PsService() { impl_->Stop(); }

void PsService::PeerLost(const std::string& address, const std::string& why) {
  impl_->PeerLost(address, why);
}

void PsService::WorkerLeft(int rank, const std::string& why) { impl_->WorkerLeft(rank, why); }

}  // namespace tessera::server
