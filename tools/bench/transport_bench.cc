#include "tools/bench/transport_bench.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "common/config/flag_checks.h"
#include "common/security/job_key.h"
#include "common/transport/rpc_endpoint.h"
#include "common/transport/zmq/zmq_endpoint.h"

namespace tessera::tools {
namespace {

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

}  // namespace

// Tessera: a worker endpoint pushes one `size`-byte float tensor per PsPushPullRequest,
// shared (not copied) from one buffer; a server endpoint verifies each and replies with an Ack.
StatusOr<double> TesseraTransportRate(size_t size, double seconds, int window,
                                      const Credentials& credentials) {
  ZmqTransportOptions server_options;
  server_options.credentials = credentials;
  server_options.role = Role::kServer;
  server_options.rank = 0;
  ASSIGN_OR_RETURN(auto server, StartZmqEndpoint(server_options, nullptr));
  RpcEndpoint* raw_server = server.get();
  server->SetHandler(MessageType::kPsPushPullRequest,
                     [raw_server](Envelope e) { raw_server->Reply(e, Ack{}); });
  ZmqTransportOptions client_options;
  client_options.credentials = credentials;
  client_options.role = Role::kWorker;
  client_options.rank = 0;
  ASSIGN_OR_RETURN(auto client, StartZmqEndpoint(client_options, nullptr));

  auto buffer = std::make_shared<std::vector<float>>(size / sizeof(float), 1.0f);
  const size_t bytes = buffer->size() * sizeof(float);
  auto push = [&]() {
    PsPushPullRequest request;
    request.has_gradients = true;
    request.tensors.push_back(
        TensorData::Floats("bench.w", 0, buffer->data(), buffer->size(), buffer));
    return client->CallAsync(server->address(), std::move(request), 1,
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

namespace {

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
    // The default configuration: authenticated (a key of its own; both ends hold it).
    StatusOr<double> tessera_rate =
        TesseraTransportRate(size, seconds, window, Credentials::Authenticate(JobKey::Generate()));
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

struct TransportOptions {
  std::string sizes = "4096,65536,1048576,16777216";
  double seconds = 2;
  int window = 8;
  bool json = false;
};

}  // namespace

BenchCommand AddTransportBench(CLI::App* parent) {
  auto o = std::make_shared<TransportOptions>();
  CLI::App* transport = parent->add_subcommand(
      "transport",
      "Request/ack throughput of Tessera's transport vs raw ZeroMQ and memcpy, per message size");
  transport->add_option("--sizes", o->sizes, "Comma-separated payload sizes in bytes")->capture_default_str();
  transport->add_option("--seconds", o->seconds, "Time per figure")
      ->check(FiniteRange(0.1, 600))
      ->capture_default_str();
  transport->add_option("--window", o->window, "Requests in flight")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  transport->add_flag("--json", o->json, "Print one JSON object instead of the table");
  return {transport, [o] { return RunTransport(o->sizes, o->seconds, o->window, o->json); }};
}

}  // namespace tessera::tools
