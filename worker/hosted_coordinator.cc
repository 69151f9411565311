#include "worker/hosted_coordinator.h"

#include "common/base/deadline.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/transport/zmq/zmq_endpoint.h"

namespace tessera::worker {

StatusOr<std::unique_ptr<HostedCoordinator>> HostedCoordinator::Start(
    const ProcessConfig& config, const Credentials& credentials) {
  std::unique_ptr<HostedCoordinator> hosted(new HostedCoordinator());
  ASSIGN_OR_RETURN(auto host_port, ParseHostPort(config.coordinator));
  ZmqTransportOptions transport;
  transport.credentials = credentials;
  transport.bind_host = host_port.first;
  transport.port = host_port.second;
  transport.max_message_bytes = config.max_message_bytes;
  transport.role = Role::kCoordinator;
  transport.warn_when_exposed = false;  // the worker's own warning said it
  transport.record_source_host = true;  // Coordinator::CheckReachable
  StatusOr<std::unique_ptr<RpcEndpoint>> endpoint = StartZmqEndpoint(transport, nullptr);
  if (!endpoint.ok()) {
    return endpoint.status().WithContext(
        "hosting the job's rendezvous at " + config.coordinator +
        " (rank 0 must run on the step's first node, and no other job may use the port: give "
        "--coordinator or MASTER_ADDR/MASTER_PORT otherwise)");
  }
  hosted->endpoint_ = std::move(endpoint).value();
  coordinator::CoordinatorOptions options;
  options.job = config.job;
  options.num_servers = 0;
  options.num_workers = config.num_workers;
  options.exit_when_workers_leave = true;
  options.rendezvous_timeout_ms = config.rendezvous_timeout_ms;
  options.heartbeat_timeout_ms = config.heartbeat_timeout_ms;
  ASSIGN_OR_RETURN(hosted->coordinator_,
                   coordinator::Coordinator::Create(hosted->endpoint_.get(), options, nullptr));
  HostedCoordinator* raw = hosted.get();
  hosted->thread_ = std::thread([raw] {
    Status result = raw->coordinator_->Run([raw] { return raw->stop_.load(); });
    std::lock_guard<std::mutex> lock(raw->mu_);
    raw->result_ = result;
    raw->done_cv_.notify_all();
  });
  TLOG(INFO) << "hosting the job's rendezvous at " << hosted->endpoint_->address() << " for "
             << config.num_workers << " workers (Slurm step without a coordinator)";
  return hosted;
}

Status HostedCoordinator::Finish(const std::function<bool()>& stop_requested) {
  std::optional<Deadline> after_stop;
  std::unique_lock<std::mutex> lock(mu_);
  while (!done_cv_.wait_for(lock, std::chrono::milliseconds(50),
                            [this] { return result_.has_value(); })) {
    if (!after_stop && stop_requested()) after_stop = Deadline::AfterMillis(1000);
    if (after_stop && after_stop->Expired()) {
      return DeadlineExceededError(
          "the job's rendezvous hosted here: the other workers did not leave within 1 s of the "
          "stop");
    }
  }
  return *result_;
}

HostedCoordinator::~HostedCoordinator() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  coordinator_.reset();
  if (endpoint_) endpoint_->Shutdown();
}

}  // namespace tessera::worker
