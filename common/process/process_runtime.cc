#include "common/process/process_runtime.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "common/base/descriptor_limit.h"
#include "common/base/host_port.h"
#include "common/base/logging.h"
#include "common/base/version.h"
#include "common/messages/fleet_view.h"
#include "common/metrics/metric_names.h"
#include "common/process/metrics_http_settings.h"
#include "common/transport/bind_address.h"
#include "common/transport/faulty/faulty_transport.h"
#include "common/transport/zmq/zmq_endpoint.h"

namespace tessera {
namespace {

// SIGINT/SIGTERM are blocked in every thread and taken by one thread with sigwait, so stopping
// is ordinary code rather than a signal handler.
sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

StatusOr<Credentials> ResolveProcessCredentials(const ProcessConfig& config,
                                                std::string_view listen_host) {
  const bool standalone = config.role == Role::kWorker && config.coordinator.empty();
  if (standalone && !config.insecure && config.auth_key_file.empty()) {
    // No peers: a key nobody else holds admits nobody, which is right.
    Credentials own = Credentials::Authenticate(JobKey::Generate());
    own.origin = "a key of its own: a standalone worker has no peers";
    return own;
  }
  // The coordinator's socket listens on its --coordinator host.
  std::string coordinator_host;
  if (!config.coordinator.empty()) {
    ASSIGN_OR_RETURN(auto host_port, ParseHostPort(config.coordinator));
    coordinator_host = host_port.first;
  }
  StatusOr<Credentials> credentials = ResolveCredentials(
      config.insecure, config.encrypt, config.auth_key_file, listen_host, coordinator_host);
  if (!credentials.ok() && !config.auth_key_file.empty()) {
    auto source = config.sources.find("--auth-key-file");
    return credentials.status().WithContext(
        "--auth-key-file" +
        (source != config.sources.end() && source->second != "flag" ? " (" + source->second + ")"
                                                                    : std::string()));
  }
  return credentials;
}

StatusOr<std::unique_ptr<ProcessRuntime>> ProcessRuntime::Start(const ProcessConfig& config) {
  RaiseDescriptorLimit();  // a coordinator or server of a large fleet holds many connections
  std::unique_ptr<ProcessRuntime> runtime(new ProcessRuntime(config));
  namespace names = metric_names;
  ASSIGN_OR_RETURN(GaugeFamily * start_time,
                   runtime->metrics_.RegisterGauge(names::kProcessStartTimeSeconds.name,
                                                   names::kProcessStartTimeSeconds.help));
  ASSIGN_OR_RETURN(Gauge * start, start_time->WithLabels({}));
  start->Set(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                 .count());
  ASSIGN_OR_RETURN(GaugeFamily * build_info,
                   runtime->metrics_.RegisterGauge(names::kBuildInfo.name, names::kBuildInfo.help,
                                                   {"role", "version"}));
  ASSIGN_OR_RETURN(Gauge * info,
                   build_info->WithLabels({std::string(RoleName(config.role)), kVersion}));
  info->Set(1);

  std::string coordinator_host;
  if (!config.coordinator.empty()) {
    ASSIGN_OR_RETURN(auto host_port, ParseHostPort(config.coordinator));
    coordinator_host = host_port.first;
  }
  ASSIGN_OR_RETURN(runtime->bind_address_, ResolveBindAddress(config.bind_host, coordinator_host));
  const BindAddress& bind = runtime->bind_address_;
  // One line for all of this process's sockets: where, why, and that they are exposed.
  if (!IsLoopbackHost(bind.listen)) {
    TLOG(INFO) << "--bind-host " << config.bind_host << ": listening on " << bind.listen
               << ", reachable at " << bind.advertise << " (" << bind.how
               << "), from the network";
  } else if (config.bind_host != "auto") {
    TLOG(INFO) << "--bind-host " << config.bind_host << ": listening on " << bind.listen;
  }
  ASSIGN_OR_RETURN(runtime->credentials_, ResolveProcessCredentials(config, bind.listen));
  const Credentials& credentials = runtime->credentials_;
  if (!credentials.authenticated()) {
    TLOG(WARNING) << "--insecure: authentication is off. Any process that reaches this "
                     "process's ports can join the job, read its parameters and change them";
  } else {
    // The default (authenticated, the loopback) is said once by the launcher; what differs
    // from it by every process.
    if (credentials.encrypted()) {
      TLOG(INFO) << "security: " << credentials.Describe();
    } else {
      TLOG(DEBUG) << "security: " << credentials.Describe();
    }
    if (!credentials.encrypted() && !IsLoopbackHost(bind.listen)) {
      TLOG(WARNING) << "--encrypt off: traffic to and from " << bind.listen
                    << " crosses the network unencrypted; anyone on the path can read it";
    }
  }

  ASSIGN_OR_RETURN(MetricsHttpOptions http_options,
                   ResolveMetricsHttpOptions(MetricsHttpSettings::FromConfig(config), bind,
                                             coordinator_host));
  ASSIGN_OR_RETURN(runtime->http_, MetricsHttpServer::Start(http_options, &runtime->metrics_));

  ZmqTransportOptions transport;
  transport.credentials = credentials;
  transport.max_message_bytes = config.max_message_bytes;
  transport.role = config.role;
  transport.rank = config.rank;
  if (config.role == Role::kCoordinator) {
    ASSIGN_OR_RETURN(auto host_port, ParseHostPort(config.coordinator));
    transport.bind_host = host_port.first;
    if (IsUnspecifiedHost(host_port.first)) transport.advertise_host = bind.advertise;
    transport.record_source_host = true;  // Coordinator::CheckReachable
    transport.port = host_port.second;
  } else {
    transport.bind_host = bind.listen;
    transport.advertise_host = bind.advertise;
    transport.warn_when_exposed = false;  // said above
    transport.port = config.port;
  }
  const char* faults_text = std::getenv("TESSERA_INJECT_FAULTS");
  if (faults_text == nullptr || *faults_text == '\0' || config.role == Role::kCoordinator) {
    ASSIGN_OR_RETURN(runtime->endpoint_, StartZmqEndpoint(transport, &runtime->metrics_));
    return runtime;
  }
  // A test of whole jobs: the parameter-server path made lossy (faulty_transport.h).
  StatusOr<FaultOptions> faults = FaultOptions::Parse(faults_text);
  if (!faults.ok()) return faults.status().WithContext("TESSERA_INJECT_FAULTS");
  TLOG(WARNING) << "TESSERA_INJECT_FAULTS: this process loses, repeats and delays messages on "
                   "purpose ("
                << faults->ToString() << "); for tests only";
  ASSIGN_OR_RETURN(std::unique_ptr<ZmqTransport> zmq,
                   ZmqTransport::Create(transport, &runtime->metrics_));
  auto faulty = std::make_unique<FaultyTransport>(std::move(zmq), *faults);
  runtime->faults_ = faulty.get();
  ASSIGN_OR_RETURN(runtime->endpoint_, RpcEndpoint::Start(std::move(faulty), transport.role,
                                                          transport.rank, &runtime->metrics_));
  return runtime;
}

ProcessRuntime::~ProcessRuntime() {
  if (endpoint_) endpoint_->Shutdown();
  if (faults_ != nullptr) {
    TLOG(WARNING) << "TESSERA_INJECT_FAULTS: lost " << faults_->dropped() << ", repeated "
                  << faults_->duplicated() << " and delayed " << faults_->delayed()
                  << " messages";
  }
}

void ProcessRuntime::AnnounceReady(int rank) {
  std::printf("TESSERA_READY role=%s rank=%d address=%s metrics=%s pid=%d\n",
              std::string(RoleName(config_.role)).c_str(), rank, endpoint_->address().c_str(),
              metrics_url().c_str(), static_cast<int>(getpid()));
  std::fflush(stdout);
}

void ProcessRuntime::RequestStop(int signal_number) {
  int expected = -1;
  if (stop_signal_.compare_exchange_strong(expected, signal_number)) {
    std::lock_guard<std::mutex> lock(mu_);
    stop_cv_.notify_all();
  }
}

std::string ProcessRuntime::StopReason() const {
  const int signal_number = stop_signal();
  if (signal_number == SIGINT) return "stopped by SIGINT";
  if (signal_number == SIGTERM) return "stopped by SIGTERM";
  if (signal_number > 0) return "stopped by signal " + std::to_string(signal_number);
  return "stopped on request";
}

bool ProcessRuntime::WaitForStop(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return stop_cv_.wait_until(lock, deadline.when(), [this] { return StopRequested(); });
}

int RunProcess(Role role, int argc, char** argv, CLI::App* app,
               const std::function<Status(ProcessRuntime&)>& body) {
  // Before any thread exists, so that every thread inherits the mask.
  sigset_t stop_signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  bool help = false;
  StatusOr<ProcessConfig> config =
      ParseProcessConfig(role, argc, argv, CurrentEnvironment(), app, &help);
  if (help) return 0;
  if (!config.ok()) {
    std::fprintf(stderr, "tessera-%s: %s\nRun with --help for the list of flags.\n",
                 std::string(RoleName(role)).c_str(), config.status().message().c_str());
    return 2;
  }
  SetLogIdentity(RoleName(role), config->rank);
  SetMinLogLevel(config->log_level);
  // One line of what differs from the defaults; the whole table only when asked for.
  TLOG(INFO) << "config: " << DescribeSettings(*config, *app);
  if (LogLevelEnabled(LogLevel::kDebug)) {
    std::istringstream lines(DescribeAllSettings(*config, *app));
    std::string line;
    while (std::getline(lines, line)) TLOG(DEBUG) << "config " << line;
  }

  StatusOr<std::unique_ptr<ProcessRuntime>> runtime = ProcessRuntime::Start(*config);
  if (!runtime.ok()) {
    TLOG(ERROR) << "cannot start: " << runtime.status();
    return 1;
  }
  ProcessRuntime* raw = runtime->get();
  auto exiting = std::make_shared<std::atomic<bool>>(false);
  std::thread signal_thread([raw, stop_signals, exiting] {
    while (true) {
      int signal_number = 0;
      if (sigwait(&stop_signals, &signal_number) != 0) continue;
      if (exiting->load()) return;  // woken by RunProcess below, not by a user
      TLOG(INFO) << "received " << (signal_number == SIGINT ? "SIGINT" : "SIGTERM")
                 << "; stopping";
      raw->RequestStop(signal_number);
      return;
    }
  });

  Status status = body(**runtime);
  // The signal thread may still be inside RequestStop (a signal's stop is seen as soon as the
  // flag is set): wake it if it still waits, and join it before the runtime goes.
  exiting->store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);  // blocked everywhere: only sigwait sees it
  signal_thread.join();
  int stop_signal = (*runtime)->stop_signal();
  runtime->reset();
  if (!status.ok()) {
    if (stop_signal > 0 && status.code() == StatusCode::kCancelled) {
      TLOG(INFO) << "stopped by signal " << stop_signal << ": " << status.message();
      return 128 + stop_signal;
    }
    TLOG(ERROR) << "failed: " << status;
    return 1;
  }
  TLOG(INFO) << "done";
  return 0;
}

}  // namespace tessera
