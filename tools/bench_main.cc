// tessera-bench: benchmarks that state their figures as ratios against a peer or limit run
// beside them in the same process and run.
//
//   tessera-bench transport [--sizes 4096,1048576] [--seconds 2] [--window 8] [--json]
//
// transport: request/acknowledge throughput of Tessera's messaging (RpcEndpoint over
// ZmqTransport: verified headers, zero-copy payload frames) against raw ZeroMQ DEALER/ROUTER
// sockets doing the same exchange with no framing or checks, and memcpy of the same buffer
// (what one copy of the bytes would cost). Both messaging paths go over loopback TCP with
// `window` messages in flight.
//
//   tessera-bench train [--batch-size 64] [--optimizer sgd] [--hidden 1024,1024] [--steps 200]
//                       [--warmup-steps 20] [--threads N] [--repeats 3] [--json] [--no-torch]
//
// train: single-process training throughput (samples/s) of Tessera's `mlp` model on the CPU
// against PyTorch (Debian's python3-torch, CPU) training the same architecture with the same
// batch size, optimizer and thread count. Each side runs as a child process with the same
// environment (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, OMP_WAIT_POLICY=PASSIVE, and
// LD_LIBRARY_PATH on Debian's pthread OpenBLAS, so both load the same libopenblas; see
// shared/notes/peers.md): tessera-worker --mode local (the real training loop: Trainer, Mlp,
// CpuBackend, LocalEngine; the worker libraries are not visible to tools/, and a child process
// also sets OpenBLAS's thread count at load, as for the peer) and tools/bench/torch_mlp.py.
// Both train on a small pool of batches made before the clock starts (Tessera reads a TSRDATA1
// file of synthetic samples written here, so per step it only copies rows; generating
// synthetic samples is timed separately and reported, not counted), and both time only the
// steps after the warm-up: Tessera from the trainer's per-step progress lines, PyTorch with
// its own clock around the step loop.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "common/deadline.h"
#include "common/logging.h"
#include "common/rpc_endpoint.h"
#include "common/status.h"
#include "common/wire_codec.h"
#include "tools/process_group.h"
#include "worker/data/binary_dataset.h"
#include "worker/data/synthetic_classification.h"

namespace tessera::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Bytes per second of memcpy over a buffer of `size` bytes, for about `seconds`.
double MemcpyRate(size_t size, double seconds) {
  std::vector<char> from(size, 1), to(size, 0);
  uint64_t copies = 0;
  auto start = Clock::now();
  while (Seconds(Clock::now() - start) < seconds) {
    for (int i = 0; i < 8; ++i, ++copies) {
      from[copies % size] = static_cast<char>(copies);  // keep the copy from being elided
      std::memcpy(to.data(), from.data(), size);
    }
  }
  volatile char sink = to[size / 2];
  (void)sink;
  return static_cast<double>(copies) * static_cast<double>(size) / Seconds(Clock::now() - start);
}

// Raw ZeroMQ: a DEALER sends `size`-byte messages, a ROUTER answers each with 1 byte.
double RawZmqRate(size_t size, double seconds, int window) {
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  std::string address = router.get(zmq::sockopt::last_endpoint);
  std::atomic<bool> done{false};
  std::thread server([&] {
    router.set(zmq::sockopt::rcvtimeo, 100);
    while (!done) {
      zmq::message_t id, body;
      if (!router.recv(id)) continue;
      (void)router.recv(body);
      zmq::message_t ack(1);
      router.send(id, zmq::send_flags::sndmore);
      router.send(ack, zmq::send_flags::none);
    }
  });
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(address);
  std::vector<char> buffer(size, 7);
  uint64_t sent = 0, acked = 0;
  auto start = Clock::now();
  while (true) {
    bool time_left = Seconds(Clock::now() - start) < seconds;
    while (time_left && sent - acked < static_cast<uint64_t>(window)) {
      dealer.send(zmq::buffer(buffer.data(), buffer.size()), zmq::send_flags::none);
      ++sent;
    }
    if (acked == sent) break;
    zmq::message_t ack;
    (void)dealer.recv(ack);
    ++acked;
  }
  double rate = static_cast<double>(acked) * static_cast<double>(size) / Seconds(Clock::now() - start);
  done = true;
  server.join();
  return rate;
}

// Tessera: a worker endpoint pushes one `size`-byte float tensor per PushRequest, borrowed
// (not copied) from one buffer; a server endpoint verifies each and replies with an Ack.
StatusOr<double> TesseraRate(size_t size, double seconds, int window) {
  ZmqTransportOptions server_options;
  server_options.role = proto::Role::Server;
  server_options.rank = 0;
  ASSIGN_OR_RETURN(auto server, RpcEndpoint::Start(server_options, nullptr));
  RpcEndpoint* raw_server = server.get();
  server->SetHandler(proto::Body::PushRequest, [raw_server](Envelope e) {
    MessageBuilder b(proto::Role::Server, 0);
    Status s = raw_server->transport().Reply(
        e.origin, b.Finish(proto::CreateAckDirect(b.fbb(), ""), e.header->request_id()));
    (void)s;
  });
  ZmqTransportOptions client_options;
  client_options.role = proto::Role::Worker;
  client_options.rank = 0;
  ASSIGN_OR_RETURN(auto client, RpcEndpoint::Start(client_options, nullptr));

  auto buffer = std::make_shared<std::vector<float>>(size / sizeof(float), 1.0f);
  const size_t bytes = buffer->size() * sizeof(float);
  std::vector<int64_t> shape = {static_cast<int64_t>(buffer->size())};
  auto push = [&]() {
    MessageBuilder b(proto::Role::Worker, 0);
    int32_t frame = b.AddPayload(Payload::Borrow(buffer->data(), bytes, buffer));
    std::vector<flatbuffers::Offset<proto::TensorMeta>> metas = {proto::CreateTensorMetaDirect(
        b.fbb(), "bench.w", 0, proto::DType::Float32, &shape, frame, 0, bytes)};
    uint64_t id = client->NextRequestId();
    return client->CallAsync(server->address(),
                             b.Finish(proto::CreatePushRequestDirect(b.fbb(), &metas), id), id,
                             Deadline::AfterMillis(30000), "bench push");
  };
  std::deque<std::shared_future<StatusOr<Envelope>>> in_flight;
  uint64_t acked = 0;
  auto start = Clock::now();
  while (true) {
    bool time_left = Seconds(Clock::now() - start) < seconds;
    while (time_left && in_flight.size() < static_cast<size_t>(window)) in_flight.push_back(push());
    if (in_flight.empty()) break;
    const StatusOr<Envelope>& reply = in_flight.front().get();
    if (!reply.ok()) return reply.status();
    in_flight.pop_front();
    ++acked;
  }
  return static_cast<double>(acked) * static_cast<double>(bytes) / Seconds(Clock::now() - start);
}

std::vector<size_t> ParseSizes(const std::string& text) {
  std::vector<size_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) sizes.push_back(std::stoull(item));
  return sizes;
}

int RunTransport(const std::string& sizes_text, double seconds, int window, bool json) {
  std::vector<size_t> sizes;
  try {
    sizes = ParseSizes(sizes_text);
  } catch (const std::exception&) {
    std::cerr << "tessera-bench transport: --sizes=\"" << sizes_text
              << "\": expected comma-separated byte counts\n";
    return 2;
  }
  for (size_t size : sizes) {
    if (size < sizeof(float) || size % sizeof(float) != 0 || size > (size_t{1} << 30)) {
      std::cerr << "tessera-bench transport: size " << size
                << " must be a multiple of 4 between 4 and 1 GiB\n";
      return 2;
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  if (!json) {
    std::cout << "transport: request/ack throughput over loopback TCP, window " << window
              << ", " << seconds << " s per figure\n\n"
              << std::left << std::setw(12) << "bytes" << std::right << std::setw(12)
              << "memcpy GB/s" << std::setw(12) << "zmq GB/s" << std::setw(14) << "tessera GB/s"
              << std::setw(15) << "tessera/zmq" << std::setw(18) << "tessera/memcpy"
              << std::setw(14) << "tessera msg/s" << "\n";
  }
  for (size_t size : sizes) {
    if (!json) std::cerr << "measuring " << size << " bytes...\n";
    double memcpy_rate = MemcpyRate(size, seconds);
    double zmq_rate = RawZmqRate(size, seconds, window);
    StatusOr<double> tessera_rate = TesseraRate(size, seconds, window);
    if (!tessera_rate.ok()) {
      std::cerr << "tessera-bench transport: " << tessera_rate.status() << "\n";
      return 1;
    }
    rows.push_back({{"bytes", size},
                    {"memcpy_bytes_per_second", memcpy_rate},
                    {"zmq_bytes_per_second", zmq_rate},
                    {"tessera_bytes_per_second", *tessera_rate},
                    {"tessera_over_zmq", *tessera_rate / zmq_rate},
                    {"tessera_over_memcpy", *tessera_rate / memcpy_rate},
                    {"tessera_messages_per_second", *tessera_rate / static_cast<double>(size)}});
    if (!json) {
      std::cout << std::left << std::setw(12) << size << std::right << std::fixed
                << std::setprecision(2) << std::setw(12) << memcpy_rate / 1e9 << std::setw(12)
                << zmq_rate / 1e9 << std::setw(14) << *tessera_rate / 1e9 << std::setw(15)
                << *tessera_rate / zmq_rate << std::setw(18) << *tessera_rate / memcpy_rate
                << std::setw(14) << std::setprecision(0)
                << *tessera_rate / static_cast<double>(size) << "\n";
    }
  }
  if (json) {
    std::cout << nlohmann::json({{"benchmark", "transport"},
                                 {"window", window},
                                 {"seconds_per_figure", seconds},
                                 {"rows", rows}})
                     .dump(2)
              << "\n";
  }
  return 0;
}


// ---------------------------------------------------------------------------------------------
// train: Tessera's single-process training throughput against PyTorch's (see the file comment).

constexpr char kPython[] = "/usr/bin/python3";  // Debian's, where python3-torch installs
constexpr char kTorchInstallHint[] = "apt-get install python3-torch libopenblas0-pthread";
// Debian's pthread OpenBLAS; first on the children's library path, so PyTorch's libblas.so.3 is
// OpenBLAS rather than the reference BLAS (and tessera-worker loads the same libopenblas).
constexpr char kOpenBlasPthreadDir[] = "/usr/lib/x86_64-linux-gnu/openblas-pthread";
// Distinct batches each side cycles through, so both touch the same amount of data.
constexpr int64_t kBatchPool = 8;
// Per child run; a run of the defaults takes seconds.
constexpr int64_t kChildTimeoutMillis = 600'000;

struct TrainBenchOptions {
  std::vector<int64_t> batch_sizes;
  std::vector<std::string> optimizers;  // sgd | adam
  std::vector<int64_t> hidden;
  int64_t input_dim = 784;
  int64_t classes = 10;
  int64_t steps = 200;        // timed
  int64_t warmup_steps = 20;  // run first, not timed
  int threads = 1;
  int repeats = 3;
  bool json = false;
  bool no_torch = false;
};

// One timed run of one side.
struct TrainRun {
  double samples_per_second = 0;
  double ms_per_step = 0;
  int64_t parameters = 0;
  nlohmann::json report;  // the side's own summary
};

struct ChildOutput {
  std::vector<std::string> stdout_lines;
  std::vector<std::string> stderr_lines;
};

std::string JoinInts(const std::vector<int64_t>& values, const char* separator) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : separator) + std::to_string(v);
  return text;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double DefaultLr(const std::string& optimizer) { return optimizer == "adam" ? 0.001 : 0.01; }

// Runs argv until it exits and returns its output. An error names `label`, how the child
// ended and the last lines of its stderr.
StatusOr<ChildOutput> RunToCompletion(const std::string& label,
                                      const std::vector<std::string>& argv) {
  ProcessGroup group;
  ASSIGN_OR_RETURN(int id, group.Spawn(label, argv));
  const Deadline deadline = Deadline::AfterMillis(kChildTimeoutMillis);
  ChildOutput output;
  auto collect = [&output](const ChildEvent& event) {
    if (event.kind != ChildEvent::Kind::kLine) return;
    (event.stream == ChildStream::kStdout ? output.stdout_lines : output.stderr_lines)
        .push_back(event.line);
  };
  bool exited = false;
  while (!exited) {
    if (deadline.Expired()) {
      group.StopAll(std::chrono::seconds(2), collect);
      return DeadlineExceededError(label + ": still running after " +
                                   std::to_string(kChildTimeoutMillis / 1000) + " s; stopped");
    }
    std::vector<ChildEvent> events =
        group.Poll(Deadline::AfterMillis(std::min<int64_t>(1000, deadline.RemainingMillis())));
    for (const ChildEvent& event : events) {
      if (event.kind == ChildEvent::Kind::kExit) exited = true;
      collect(event);
    }
    if (events.empty() && !group.Running(id)) exited = true;
  }
  const ChildExit& exit = group.ExitOf(id);
  if (!exit.success()) {
    std::string tail;
    const size_t n = output.stderr_lines.size();
    for (size_t i = n > 5 ? n - 5 : 0; i < n; ++i) tail += "\n  " + output.stderr_lines[i];
    return UnavailableError(label + " " + exit.Describe() + (tail.empty() ? "" : ":" + tail));
  }
  return output;
}

// The last stdout line that parses as a JSON object.
StatusOr<nlohmann::json> LastJsonLine(const std::string& label, const ChildOutput& output) {
  for (auto line = output.stdout_lines.rbegin(); line != output.stdout_lines.rend(); ++line) {
    if (line->empty() || (*line)[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(*line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) return j;
  }
  return DataLossError(label + ": printed no JSON summary on stdout");
}

// Where Bazel puts a data dependency of this binary: its runfiles, or (for a binary copied
// out of bazel-bin with its tree) relative to it.
StatusOr<std::string> FindRunfile(const std::string& workspace_path) {
  std::vector<char> buffer(4096);
  ssize_t length = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (length <= 0) {
    return UnavailableError(std::string("readlink /proc/self/exe: ") + std::strerror(errno));
  }
  const std::string self(buffer.data(), static_cast<size_t>(length));
  const std::string self_dir = self.substr(0, self.rfind('/'));
  std::string tried;
  for (const std::string& root : {self + ".runfiles/tessera", self_dir + "/.."}) {
    const std::string path = root + "/" + workspace_path;
    if (access(path.c_str(), R_OK) == 0) return path;
    tried += "\n  " + path;
  }
  return NotFoundError("cannot find " + workspace_path +
                       "; build with `bazel build //tools:tessera-bench`. Looked in:" + tried);
}

// `/usr/bin/env VAR=value ...`: the environment both sides run in, identical for both.
// OMP_WAIT_POLICY=PASSIVE: PyTorch's OpenMP workers otherwise spin between parallel regions
// and take the cores OpenBLAS's own threads need (3-4x slower with 2 threads on 2 cores).
std::vector<std::string> ChildEnvironment(int threads) {
  std::vector<std::string> env = {"/usr/bin/env",
                                  "OPENBLAS_NUM_THREADS=" + std::to_string(threads),
                                  "OMP_NUM_THREADS=" + std::to_string(threads),
                                  "OMP_WAIT_POLICY=PASSIVE"};
  if (access(kOpenBlasPthreadDir, R_OK) == 0) {
    env.push_back(std::string("LD_LIBRARY_PATH=") + kOpenBlasPthreadDir);
  }
  return env;
}

// Fails with the install command when Debian's PyTorch cannot be imported.
Status CheckTorch() {
  const std::string hint = std::string("; install it with `") + kTorchInstallHint +
                           "` (as root), or pass --no-torch to measure Tessera alone";
  if (access(kPython, X_OK) != 0) {
    return FailedPreconditionError(std::string("PyTorch's side needs ") + kPython +
                                   ", which is missing" + hint);
  }
  StatusOr<ChildOutput> probe =
      RunToCompletion("python3 -c 'import torch.nn'", {kPython, "-c", "import torch.nn"});
  if (!probe.ok()) {
    return FailedPreconditionError(std::string(kPython) + " cannot import torch (" +
                                   probe.status().ToString() + ")" + hint);
  }
  return OkStatus();
}

// Writes kBatchPool batches of synthetic samples to `path` (TSRDATA1) and returns how long
// generating one batch took (what reading --dataset synthetic would add to every step).
StatusOr<double> WriteBatchPool(const TrainBenchOptions& o, int64_t batch,
                                const std::string& path) {
  worker::data::SyntheticClassificationOptions options;
  options.num_samples = static_cast<size_t>(kBatchPool * batch);
  options.feature_dim = static_cast<size_t>(o.input_dim);
  options.num_classes = static_cast<size_t>(o.classes);
  ASSIGN_OR_RETURN(auto dataset, worker::data::SyntheticClassification::Create(options));
  std::vector<float> features(options.feature_dim);
  int64_t label = 0;
  auto start = Clock::now();
  for (size_t i = 0; i < options.num_samples; ++i) {
    RETURN_IF_ERROR(dataset->Get(i, features.data(), &label));
  }
  const double seconds = Seconds(Clock::now() - start);
  RETURN_IF_ERROR(worker::data::WriteBinaryDataset(*dataset, path));
  return 1000.0 * seconds / static_cast<double>(kBatchPool);
}

// tessera-worker --mode local on the batch pool, a progress line per step; the timed steps'
// rates are read back from those lines.
StatusOr<TrainRun> RunTessera(const std::string& worker, const std::string& data_path,
                              const TrainBenchOptions& o, int64_t batch,
                              const std::string& optimizer) {
  const int64_t total = o.warmup_steps + o.steps;
  std::vector<std::string> argv = ChildEnvironment(o.threads);
  for (const std::string& arg :
       {worker, std::string("--mode=local"), std::string("--model=mlp"),
        std::string("--dataset=file"), "--data-path=" + data_path,
        "--hidden=" + JoinInts(o.hidden, ","), "--batch-size=" + std::to_string(batch),
        "--steps=" + std::to_string(total), "--optimizer=" + optimizer,
        "--lr=" + std::to_string(DefaultLr(optimizer)), std::string("--device=cpu"),
        std::string("--seed=0"), std::string("--log-every=1"), std::string("--log-level=info"),
        std::string("--json")}) {
    argv.push_back(arg);
  }
  const std::string label =
      "tessera-worker (batch " + std::to_string(batch) + ", " + optimizer + ")";
  ASSIGN_OR_RETURN(ChildOutput output, RunToCompletion(label, argv));
  // "... I worker | step 21/220 loss 2.29 accuracy 0.11 samples/s 7578": the rate of one step,
  // timed by the trainer around data, forward/backward and the optimizer step.
  double seconds = 0;
  int64_t timed = 0;
  for (const std::string& line : output.stderr_lines) {
    const size_t at = line.find("| step ");
    const size_t rate_at = line.find(" samples/s ");
    if (at == std::string::npos || rate_at == std::string::npos) continue;
    const int64_t step = std::strtoll(line.c_str() + at + 7, nullptr, 10);
    const double rate = std::strtod(line.c_str() + rate_at + 11, nullptr);
    if (step <= o.warmup_steps) continue;
    if (!(rate > 0)) return DataLossError(label + ": bad progress line: " + line);
    seconds += static_cast<double>(batch) / rate;
    ++timed;
  }
  if (timed != o.steps) {
    return DataLossError(label + ": expected " + std::to_string(o.steps) +
                         " progress lines after the warm-up, read " + std::to_string(timed));
  }
  ASSIGN_OR_RETURN(nlohmann::json summary, LastJsonLine(label, output));
  TrainRun run;
  run.samples_per_second = static_cast<double>(batch * o.steps) / seconds;
  run.ms_per_step = 1000.0 * seconds / static_cast<double>(o.steps);
  run.parameters = summary.value("parameters", int64_t{0});
  run.report = std::move(summary);
  return run;
}

StatusOr<TrainRun> RunTorch(const std::string& script, const TrainBenchOptions& o, int64_t batch,
                            const std::string& optimizer) {
  std::vector<std::string> argv = ChildEnvironment(o.threads);
  for (const std::string& arg :
       {std::string(kPython), script, "--batch-size=" + std::to_string(batch),
        "--hidden=" + JoinInts(o.hidden, ","), "--input-dim=" + std::to_string(o.input_dim),
        "--classes=" + std::to_string(o.classes), "--optimizer=" + optimizer,
        "--lr=" + std::to_string(DefaultLr(optimizer)), "--steps=" + std::to_string(o.steps),
        "--warmup-steps=" + std::to_string(o.warmup_steps),
        "--threads=" + std::to_string(o.threads), "--pool=" + std::to_string(kBatchPool)}) {
    argv.push_back(arg);
  }
  const std::string label =
      "torch_mlp.py (batch " + std::to_string(batch) + ", " + optimizer + ")";
  ASSIGN_OR_RETURN(ChildOutput output, RunToCompletion(label, argv));
  ASSIGN_OR_RETURN(nlohmann::json summary, LastJsonLine(label, output));
  TrainRun run;
  run.samples_per_second = summary.value("samples_per_second", 0.0);
  run.ms_per_step = summary.value("ms_per_step", 0.0);
  run.parameters = summary.value("parameters", int64_t{0});
  if (!(run.samples_per_second > 0)) return DataLossError(label + ": no samples_per_second");
  run.report = std::move(summary);
  return run;
}

// OpenBLAS 0.3.21 does not recognise some recent AVX-512 Xeons and falls back to a slow
// kernel unless OPENBLAS_CORETYPE says otherwise (shared/notes/peers.md). Both sides load the
// same library with the same environment, so a warning is all this needs.
void WarnOnGenericOpenBlasCore(const std::string& core) {
  if (core.empty()) return;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool avx512 = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      avx512 = line.find(" avx512f") != std::string::npos;
      break;
    }
  }
  if (avx512 && core != "SkylakeX" && core != "Cooperlake" && core != "SapphireRapids") {
    std::cerr << "warning: OpenBLAS chose its " << core << " kernels on an AVX-512 CPU; "
              << "both sides are slower than they could be. Set OPENBLAS_CORETYPE=SkylakeX.\n";
  }
}

struct TrainRow {
  int64_t batch = 0;
  std::string optimizer;
  std::vector<TrainRun> tessera, torch;
  double synthetic_ms_per_batch = 0;
};

Status MeasureRow(const std::string& worker, const std::string& script,
                  const std::string& data_path, const TrainBenchOptions& o, TrainRow* row) {
  for (int r = 0; r < o.repeats; ++r) {
    // Alternate which side goes first, so drift in the machine's load hits both alike.
    for (int side = 0; side < 2; ++side) {
      const bool tessera_turn = (side == 0) == (r % 2 == 0);
      if (!tessera_turn && o.no_torch) continue;
      if (!o.json) {
        std::cerr << "batch " << row->batch << " " << row->optimizer << ": "
                  << (tessera_turn ? "tessera" : "torch") << " run " << r + 1 << "/"
                  << o.repeats << "\n";
      }
      if (tessera_turn) {
        ASSIGN_OR_RETURN(TrainRun run,
                         RunTessera(worker, data_path, o, row->batch, row->optimizer));
        row->tessera.push_back(std::move(run));
      } else {
        ASSIGN_OR_RETURN(TrainRun run, RunTorch(script, o, row->batch, row->optimizer));
        row->torch.push_back(std::move(run));
      }
    }
  }
  if (!row->torch.empty() && row->torch[0].parameters != row->tessera[0].parameters) {
    return InternalError("the models differ: tessera has " +
                         std::to_string(row->tessera[0].parameters) + " parameters, torch " +
                         std::to_string(row->torch[0].parameters));
  }
  return OkStatus();
}

double MedianOf(const std::vector<TrainRun>& runs, double TrainRun::*field) {
  std::vector<double> values;
  for (const TrainRun& run : runs) values.push_back(run.*field);
  return Median(values);
}

// A scratch directory for the batch pools, removed when done.
class ScratchDirectory {
 public:
  static StatusOr<std::unique_ptr<ScratchDirectory>> Create() {
    std::error_code error;
    std::filesystem::path base = std::filesystem::temp_directory_path(error);
    if (error) base = "/tmp";
    std::string pattern = (base / "tessera-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      return UnavailableError("mkdtemp " + pattern + ": " + std::strerror(errno));
    }
    return std::unique_ptr<ScratchDirectory>(new ScratchDirectory(pattern));
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDirectory(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

Status RunTrainBench(const TrainBenchOptions& o) {
  ASSIGN_OR_RETURN(std::string worker, FindRunfile("worker/tessera-worker"));
  std::string script;
  if (!o.no_torch) {
    RETURN_IF_ERROR(CheckTorch());
    ASSIGN_OR_RETURN(script, FindRunfile("tools/bench/torch_mlp.py"));
  }
  ASSIGN_OR_RETURN(auto scratch, ScratchDirectory::Create());
  std::vector<int64_t> layers = {o.input_dim};
  layers.insert(layers.end(), o.hidden.begin(), o.hidden.end());
  layers.push_back(o.classes);

  std::vector<TrainRow> rows;
  for (int64_t batch : o.batch_sizes) {
    const std::string data_path = scratch->path() + "/pool-" + std::to_string(batch) + ".bin";
    ASSIGN_OR_RETURN(double synthetic_ms, WriteBatchPool(o, batch, data_path));
    for (const std::string& optimizer : o.optimizers) {
      TrainRow row;
      row.batch = batch;
      row.optimizer = optimizer;
      row.synthetic_ms_per_batch = synthetic_ms;
      RETURN_IF_ERROR(MeasureRow(worker, script, data_path, o, &row));
      rows.push_back(std::move(row));
    }
  }

  const int64_t parameters = rows.front().tessera.front().parameters;
  std::string torch_version, openblas_core;
  if (!o.no_torch) {
    const nlohmann::json& report = rows.front().torch.front().report;
    torch_version = report.value("torch_version", "");
    openblas_core = report.value("openblas_core", "");
    WarnOnGenericOpenBlasCore(openblas_core);
  }
  nlohmann::json json_rows = nlohmann::json::array();
  if (!o.json) {
    std::cout << "train: mlp " << JoinInts(layers, "-") << " (" << parameters
              << " parameters, ReLU, softmax cross-entropy) on the CPU, " << o.threads
              << (o.threads == 1 ? " thread" : " threads") << ", " << o.steps
              << " timed steps after " << o.warmup_steps << " warm-up, median of " << o.repeats
              << (o.repeats == 1 ? " run" : " runs") << "\n"
              << (o.no_torch ? "" : "PyTorch " + torch_version + ", OpenBLAS core " +
                                        (openblas_core.empty() ? "?" : openblas_core) + "\n")
              << "\n"
              << std::left << std::setw(7) << "batch" << std::setw(11) << "optimizer"
              << std::right << std::setw(19) << "tessera samples/s" << std::setw(17)
              << "torch samples/s" << std::setw(15) << "tessera/torch" << std::setw(17)
              << "tessera ms/step" << std::setw(15) << "torch ms/step" << "\n";
  }
  for (const TrainRow& row : rows) {
    const double tessera_rate = MedianOf(row.tessera, &TrainRun::samples_per_second);
    const double tessera_ms = MedianOf(row.tessera, &TrainRun::ms_per_step);
    nlohmann::json tessera_runs = nlohmann::json::array(), torch_runs = nlohmann::json::array();
    for (const TrainRun& run : row.tessera) tessera_runs.push_back(run.samples_per_second);
    for (const TrainRun& run : row.torch) torch_runs.push_back(run.samples_per_second);
    nlohmann::json j = {{"batch_size", row.batch},
                        {"optimizer", row.optimizer},
                        {"lr", DefaultLr(row.optimizer)},
                        {"tessera_samples_per_second", tessera_rate},
                        {"tessera_ms_per_step", tessera_ms},
                        {"tessera_runs_samples_per_second", tessera_runs},
                        {"synthetic_data_ms_per_batch_untimed", row.synthetic_ms_per_batch}};
    double torch_rate = 0, torch_ms = 0;
    if (!row.torch.empty()) {
      torch_rate = MedianOf(row.torch, &TrainRun::samples_per_second);
      torch_ms = MedianOf(row.torch, &TrainRun::ms_per_step);
      j["torch_samples_per_second"] = torch_rate;
      j["torch_ms_per_step"] = torch_ms;
      j["torch_runs_samples_per_second"] = torch_runs;
      j["tessera_over_torch"] = tessera_rate / torch_rate;
    }
    json_rows.push_back(std::move(j));
    if (!o.json) {
      std::cout << std::left << std::setw(7) << row.batch << std::setw(11) << row.optimizer
                << std::right << std::fixed << std::setprecision(0) << std::setw(19)
                << tessera_rate;
      if (row.torch.empty()) {
        std::cout << std::setw(17) << "-" << std::setw(15) << "-" << std::setprecision(2)
                  << std::setw(17) << tessera_ms << std::setw(15) << "-" << "\n";
      } else {
        std::cout << std::setw(17) << torch_rate << std::setprecision(2) << std::setw(15)
                  << tessera_rate / torch_rate << std::setw(17) << tessera_ms << std::setw(15)
                  << torch_ms << "\n";
      }
    }
  }
  if (o.json) {
    nlohmann::json j = {{"benchmark", "train"},
                        {"model", "mlp"},
                        {"layers", layers},
                        {"parameters", parameters},
                        {"threads", o.threads},
                        {"steps", o.steps},
                        {"warmup_steps", o.warmup_steps},
                        {"repeats", o.repeats},
                        {"batch_pool", kBatchPool},
                        {"rows", json_rows}};
    if (!o.no_torch) {
      j["torch_version"] = torch_version;
      j["openblas_core"] = openblas_core;
    }
    std::cout << j.dump(2) << "\n";
  } else {
    // One figure per batch size (rows of one size are adjacent).
    std::ostringstream costs;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i > 0 && rows[i].batch == rows[i - 1].batch) continue;
      costs << (i > 0 ? ", " : "") << std::fixed << std::setprecision(2)
            << rows[i].synthetic_ms_per_batch << " ms per batch of " << rows[i].batch;
    }
    std::cout << "\nNot timed: making the " << kBatchPool << " batches each side cycles "
              << "through. Generating them as --dataset synthetic does every step would add "
              << costs.str() << ".\n";
  }
  return OkStatus();
}

template <typename T>
StatusOr<std::vector<T>> ParseList(const std::string& flag, const std::string& text,
                                   const std::function<StatusOr<T>(const std::string&)>& parse) {
  std::vector<T> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    StatusOr<T> value = parse(item);
    if (!value.ok()) {
      return InvalidArgumentError(flag + "=\"" + text + "\": " + value.status().message());
    }
    values.push_back(*value);
  }
  if (values.empty()) return InvalidArgumentError(flag + " is empty");
  return values;
}

StatusOr<int64_t> ParsePositive(const std::string& item) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(item.c_str(), &end, 10);
  if (item.empty() || *end != '\0' || errno == ERANGE || value < 1 || value > (1 << 20)) {
    return InvalidArgumentError("\"" + item + "\" is not an integer in [1, 1048576]");
  }
  return static_cast<int64_t>(value);
}

StatusOr<std::string> ParseOptimizerName(const std::string& item) {
  if (item == "sgd" || item == "adam") return item;
  return InvalidArgumentError("\"" + item + "\" is not sgd or adam");
}

}  // namespace
}  // namespace tessera::tools

int main(int argc, char** argv) {
  CLI::App app("tessera-bench: Tessera's benchmarks; every figure is a ratio against a peer or "
               "limit measured beside it in the same run.",
               "tessera-bench");
  app.require_subcommand(1);
  std::string sizes = "4096,65536,1048576,16777216";
  double seconds = 2;
  int window = 8;
  bool json = false;
  CLI::App* transport = app.add_subcommand(
      "transport",
      "Request/ack throughput of Tessera's transport vs raw ZeroMQ and memcpy, per message size");
  transport->add_option("--sizes", sizes, "Comma-separated payload sizes in bytes")->capture_default_str();
  transport->add_option("--seconds", seconds, "Time per figure")
      ->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
  transport->add_option("--window", window, "Requests in flight")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  transport->add_flag("--json", json, "Print one JSON object instead of the table");

  tessera::tools::TrainBenchOptions train_options;
  std::string batch_sizes = "64", optimizers = "sgd", hidden = "1024,1024";
  CLI::App* train = app.add_subcommand(
      "train", "Single-process training throughput of the mlp model on the CPU vs PyTorch");
  train->add_option("--batch-size", batch_sizes, "Batch size(s), comma-separated: a row each")
      ->capture_default_str();
  train->add_option("--optimizer", optimizers, "sgd and/or adam, comma-separated: a row each")
      ->capture_default_str();
  train->add_option("--hidden", hidden, "Hidden widths, comma-separated")->capture_default_str();
  train->add_option("--input-dim", train_options.input_dim, "Input features")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  train->add_option("--classes", train_options.classes, "Classes")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();
  train->add_option("--steps", train_options.steps, "Timed steps per run")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}))
      ->capture_default_str();
  train->add_option("--warmup-steps", train_options.warmup_steps, "Untimed steps before them")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
      ->capture_default_str();
  train_options.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  train->add_option("--threads", train_options.threads,
                    "Threads for both sides (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, "
                    "torch.set_num_threads); default: all cores")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  train->add_option("--repeats", train_options.repeats, "Runs per side per row; the median counts")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  train->add_flag("--json", train_options.json, "Print one JSON object instead of the table");
  train->add_flag("--no-torch", train_options.no_torch, "Measure Tessera alone");
  CLI11_PARSE(app, argc, argv);
  tessera::SetMinLogLevel(tessera::LogLevel::kWarning);
  if (transport->parsed()) return tessera::tools::RunTransport(sizes, seconds, window, json);

  using tessera::tools::ParseList;
  auto batches = ParseList<int64_t>("--batch-size", batch_sizes, tessera::tools::ParsePositive);
  auto kinds =
      ParseList<std::string>("--optimizer", optimizers, tessera::tools::ParseOptimizerName);
  auto widths = ParseList<int64_t>("--hidden", hidden, tessera::tools::ParsePositive);
  for (const tessera::Status& status : {batches.status(), kinds.status(), widths.status()}) {
    if (!status.ok()) {
      std::cerr << "tessera-bench train: " << status.message() << "\n";
      return 2;
    }
  }
  train_options.batch_sizes = *batches;
  train_options.optimizers = *kinds;
  train_options.hidden = *widths;
  tessera::Status status = tessera::tools::RunTrainBench(train_options);
  if (!status.ok()) {
    std::cerr << "tessera-bench train: " << status << "\n";
    return 1;
  }
  return 0;
}
