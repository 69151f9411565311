// ProcessRuntime: what every Tessera process owns, wired once in main().
//
//   int main(int argc, char** argv) {
//     CLI::App app("tessera-worker: ...");
//     std::string mode = "local";
//     app.add_option("--mode", mode, "...");
//     return RunProcess(Role::kWorker, argc, argv, &app, [&](ProcessRuntime& runtime) {
//       ... // the process's work; return a Status
//     });
//   }
//
// RunProcess parses and validates the config (exit 2 with the reason on bad input, 0 after
// --help), sets the log prefix, logs the effective config, starts the metrics registry and its
// HTTP server, the RPC endpoint (the coordinator's listens on --coordinator, others' on
// --bind-host:--port), and SIGINT/SIGTERM handling; then runs `body` and turns its Status into
// the exit code (0 OK, 1 error, 130/143 when stopped by a signal before finishing).
//
// Thread-safety: accessors and stop functions are thread-safe.
#ifndef TESSERA_COMMON_PROCESS_PROCESS_RUNTIME_H_
#define TESSERA_COMMON_PROCESS_PROCESS_RUNTIME_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"
#include "common/security/credentials.h"
#include "common/transport/bind_address.h"
#include "common/transport/faulty/faulty_transport.h"
#include "common/transport/rpc_endpoint.h"

namespace tessera {

class ProcessRuntime {
 public:
  static StatusOr<std::unique_ptr<ProcessRuntime>> Start(const ProcessConfig& config);
  ~ProcessRuntime();

  const ProcessConfig& config() const { return config_; }
  MetricsRegistry& metrics() { return metrics_; }
  MetricsHttpServer& http() { return *http_; }
  RpcEndpoint& endpoint() { return *endpoint_; }
  std::string metrics_url() const { return http_->url(); }
  // Where --bind-host put this process's sockets, and the address the others reach it at.
  const BindAddress& bind_address() const { return bind_address_; }
  // How this process proves it belongs to the job (--auth-key-file, --insecure, --encrypt),
  // for every transport and channel it opens besides the endpoint.
  const Credentials& credentials() const { return credentials_; }

  // Prints the line tessera-launch waits for, on stdout:
  // "TESSERA_READY role=worker rank=1 address=tcp://... metrics=http://.../metrics pid=123".
  void AnnounceReady(int rank);

  // Asks the process to stop (also done by SIGINT/SIGTERM).
  void RequestStop(int signal_number = 0);
  bool StopRequested() const { return stop_signal_.load() >= 0; }
  // The signal that asked us to stop, 0 for RequestStop(), -1 while running.
  int stop_signal() const { return stop_signal_.load(); }
  // Why we are stopping: "stopped by SIGTERM" ("SIGINT"; "a stop request" without a signal).
  std::string StopReason() const;
  // Waits until a stop is requested (true) or the deadline passes (false).
  bool WaitForStop(Deadline deadline);

 private:
  explicit ProcessRuntime(const ProcessConfig& config) : config_(config) {}

  const ProcessConfig config_;
  BindAddress bind_address_;
  Credentials credentials_;
  MetricsRegistry metrics_;
  std::unique_ptr<MetricsHttpServer> http_;
  std::unique_ptr<RpcEndpoint> endpoint_;
  FaultyTransport* faults_ = nullptr;  // owned by endpoint_, under TESSERA_INJECT_FAULTS

  std::mutex mu_;
  std::condition_variable stop_cv_;
  std::atomic<int> stop_signal_{-1};
};

// The credentials `config` asks for; `listen_host` is where the process listens (decides
// --encrypt auto). A standalone worker (no coordinator) without a key gets one of its own.
StatusOr<Credentials> ResolveProcessCredentials(const ProcessConfig& config,
                                                std::string_view listen_host);

// See the file comment. `app` holds the binary's own flags (the common ones are added to it) and
// must not have been parsed. REQUIRES: app != nullptr.
int RunProcess(Role role, int argc, char** argv, CLI::App* app,
               const std::function<Status(ProcessRuntime&)>& body);

}  // namespace tessera

#endif  // TESSERA_COMMON_PROCESS_PROCESS_RUNTIME_H_
