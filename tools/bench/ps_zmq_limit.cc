// ps-zmq-limit: the raw ZeroMQ limit of `tessera-bench ps` (tools/bench/ps_bench.h). The same
// exchange as a parameter-server push+pull, with nothing of Tessera in it: no header, no
// checks, no optimizer.
//
//   ps-zmq-limit echo --port P --clients W
//       A ROUTER on 127.0.0.1:P (a "server"): answers each request [index, gradient bytes] with
//       [index, as many parameter bytes] in one frame from a constant buffer, sent without
//       copying. Exits
//       once W clients said done (an empty request), or after --idle-s without a request.
//   ps-zmq-limit client --servers tcp://...,... --rank R --sizes B,... [--chunk-bytes C]
//                       [--chunks-per-request K] [--warmup N] [--iters I | --seconds S]
//       A "worker": for each size, a step sends the buffer in chunks of C bytes dealt round
//       robin over the servers, K chunks per request (as PsEngine plans them), each request
//       from the gradient buffer without copying, all in flight at once on one DEALER per
//       server, then copies every reply into the parameter buffer at its place. Prints one JSON
//       line per size: {"bench":"ps","system":"zmq","rank":R,"bytes":B,"requests_per_step":Q,
//       "iters":K,"median_s":...,"mean_s":...,"min_s":...}; then tells every server it is done.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "common/config/flag_checks.h"
#include "common/training/ps_job.h"
#include "tools/bench/bench_util.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kReplyTimeoutMs = 60000;  // a client's wait for one reply

void KeepBytes(void*, void*) {}  // zero-copy frames of buffers that outlive the socket

zmq::message_t Borrowed(const void* data, size_t size) {
  return zmq::message_t(const_cast<void*>(data), size, &KeepBytes, nullptr);
}

int Echo(int port, int clients, double idle_s) {
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:" + std::to_string(port));
  // Replies are sent without copying, so a buffer stays while ZeroMQ may still read it: a
  // larger request gets a new buffer, and the old ones are kept.
  std::vector<std::unique_ptr<std::vector<uint8_t>>> values;
  int done = 0;
  while (done < clients) {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(static_cast<int64_t>(idle_s * 1000))) == 0) {
      std::cerr << "ps-zmq-limit echo on port " << port << ": no request for " << idle_s << " s; "
                << done << " of " << clients << " clients said done\n";
      return 1;
    }
    zmq::message_t identity, index;
    (void)router.recv(identity);
    (void)router.recv(index);
    if (!index.more()) {  // [identity, empty]: done
      ++done;
      continue;
    }
    size_t bytes = 0;  // of the request's chunk frames; the reply is as large, in one frame
    bool more = true;
    while (more) {
      zmq::message_t chunk;
      (void)router.recv(chunk);
      bytes += chunk.size();
      more = chunk.more();
    }
    if (values.empty() || values.back()->size() < bytes) {
      values.push_back(std::make_unique<std::vector<uint8_t>>(bytes, 0));
    }
    router.send(identity, zmq::send_flags::sndmore);
    router.send(index, zmq::send_flags::sndmore);
    router.send(Borrowed(values.back()->data(), bytes), zmq::send_flags::none);
  }
  return 0;
}

struct Request {
  int server = 0;
  std::vector<std::pair<size_t, size_t>> pieces;  // (offset, bytes) of its chunks
  size_t bytes = 0;
};

// The requests of one step for `bytes` (float32s), as PsEngine makes them: its chunk plan
// (PlanDenseChunks), each server's chunks grouped chunks_per_request at a time.
std::vector<Request> Plan(size_t bytes, size_t chunk_bytes, int servers, int chunks_per_request) {
  if (bytes % sizeof(float) != 0 || chunk_bytes % sizeof(float) != 0) {
    throw std::invalid_argument("sizes and --chunk-bytes are float32 buffers: multiples of 4, "
                                "not " + std::to_string(bytes) + " and " +
                                std::to_string(chunk_bytes));
  }
  constexpr uint64_t kKeySpace = uint64_t{1} << 40;  // never the limit here
  tessera::StatusOr<std::vector<tessera::DenseChunk>> plan = tessera::PlanDenseChunks(
      bytes / sizeof(float), chunk_bytes / sizeof(float), servers, kKeySpace);
  if (!plan.ok()) throw std::invalid_argument(plan.status().message());
  std::vector<std::vector<std::pair<size_t, size_t>>> of(static_cast<size_t>(servers));
  for (const tessera::DenseChunk& chunk : *plan) {
    of[static_cast<size_t>(chunk.server)].push_back(
        {chunk.offset * sizeof(float), chunk.size * sizeof(float)});
  }
  std::vector<Request> requests;
  for (int s = 0; s < servers; ++s) {
    const auto& chunks = of[static_cast<size_t>(s)];
    for (size_t begin = 0; begin < chunks.size();
         begin += static_cast<size_t>(chunks_per_request)) {
      Request r;
      r.server = s;
      const size_t end = std::min(chunks.size(), begin + static_cast<size_t>(chunks_per_request));
      r.pieces.assign(chunks.begin() + static_cast<std::ptrdiff_t>(begin),
                      chunks.begin() + static_cast<std::ptrdiff_t>(end));
      for (const auto& [offset, n] : r.pieces) r.bytes += n;
      requests.push_back(std::move(r));
    }
  }
  return requests;
}

int Client(const std::vector<std::string>& servers, int rank, const std::vector<size_t>& sizes,
           size_t chunk_bytes, int chunks_per_request, int warmup, int fixed_iters,
           double seconds) {
  zmq::context_t context(1);
  std::vector<zmq::socket_t> dealers;
  for (const std::string& address : servers) {
    dealers.emplace_back(context, zmq::socket_type::dealer);
    dealers.back().set(zmq::sockopt::linger, 1000);
    dealers.back().set(zmq::sockopt::rcvtimeo, kReplyTimeoutMs);
    dealers.back().connect(address);
  }
  for (size_t bytes : sizes) {
    std::vector<uint8_t> grads(bytes, 1), params(bytes, 0);
    const std::vector<Request> requests =
        Plan(bytes, chunk_bytes, static_cast<int>(servers.size()), chunks_per_request);
    auto step = [&] {
      for (size_t i = 0; i < requests.size(); ++i) {
        const Request& r = requests[i];
        zmq::socket_t& dealer = dealers[static_cast<size_t>(r.server)];
        const uint64_t index = i;
        dealer.send(zmq::buffer(&index, sizeof(index)), zmq::send_flags::sndmore);
        // A server's chunks are not contiguous in the buffer: a request carries each chunk
        // as a frame of its own, as Tessera's does.
        for (size_t k = 0; k < r.pieces.size(); ++k) {
          const auto& [offset, n] = r.pieces[k];
          dealer.send(Borrowed(grads.data() + offset, n),
                      k + 1 < r.pieces.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
        }
      }
      for (size_t i = 0; i < requests.size(); ++i) {
        const Request& r = requests[i];
        zmq::message_t index, values;
        zmq::socket_t& dealer = dealers[static_cast<size_t>(r.server)];
        if (!dealer.recv(index) || !dealer.recv(values)) {
          throw std::runtime_error("no reply from " + servers[static_cast<size_t>(r.server)] +
                                   " within " + std::to_string(kReplyTimeoutMs) + " ms");
        }
        uint64_t which = 0;
        std::memcpy(&which, index.data(), sizeof(which));
        const Request& answered = requests[which];
        const auto* data = static_cast<const uint8_t*>(values.data());
        for (const auto& [offset, n] : answered.pieces) {
          std::memcpy(params.data() + offset, data, n);
          data += n;
        }
      }
    };
    auto warm_start = Clock::now();
    for (int i = 0; i < warmup; ++i) step();
    const double warm =
        warmup > 0 ? std::chrono::duration<double>(Clock::now() - warm_start).count() / warmup
                   : 0.0;
    int iters = fixed_iters;
    if (iters == 0) {
      iters = std::clamp(warm > 0 ? static_cast<int>(seconds / warm) : 10000, 5, 10000);
    }
    std::vector<double> times(static_cast<size_t>(iters));
    for (double& t : times) {
      const auto start = Clock::now();
      step();
      t = std::chrono::duration<double>(Clock::now() - start).count();
    }
    double total = 0;
    for (double t : times) total += t;
    std::printf("%s\n", nlohmann::json{{"bench", "ps"},
                                       {"system", "zmq"},
                                       {"rank", rank},
                                       {"bytes", bytes},
                                       {"requests_per_step", requests.size()},
                                       {"iters", iters},
                                       {"median_s", tessera::tools::Median(times)},
                                       {"mean_s", total / static_cast<double>(times.size())},
                                       {"min_s", *std::min_element(times.begin(), times.end())}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  for (zmq::socket_t& dealer : dealers) dealer.send(zmq::message_t(), zmq::send_flags::none);
  return 0;
}

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) items.push_back(item);
  return items;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("ps-zmq-limit: raw ZeroMQ push+pull, the limit of tessera-bench ps");
  app.require_subcommand(1);
  int port = 0, clients = 1, rank = 0, chunks_per_request = 4, warmup = 3, iters = 0;
  double idle_s = 120, seconds = 1;
  std::string servers, sizes;
  size_t chunk_bytes = size_t{1} << 18;
  auto* echo = app.add_subcommand("echo", "A server: answer every request");
  echo->add_option("--port", port)->required();
  echo->add_option("--clients", clients)->check(CLI::Range(1, 1024));
  echo->add_option("--idle-s", idle_s)->check(tessera::FiniteRange(0.1, 86400));
  auto* client = app.add_subcommand("client", "A worker: time push+pull steps");
  client->add_option("--servers", servers)->required();
  client->add_option("--rank", rank);
  client->add_option("--sizes", sizes)->required();
  client->add_option("--chunk-bytes", chunk_bytes)->check(CLI::Range(size_t{4}, size_t{1} << 30));
  client->add_option("--chunks-per-request", chunks_per_request)->check(CLI::Range(1, 1024));
  client->add_option("--warmup", warmup)->check(CLI::Range(0, 1000));
  client->add_option("--iters", iters)->check(CLI::Range(0, 100000));
  client->add_option("--seconds", seconds)->check(tessera::FiniteRange(0, 600));
  CLI11_PARSE(app, argc, argv);
  try {
    if (echo->parsed()) return Echo(port, clients, idle_s);
    std::vector<size_t> byte_sizes;
    for (const std::string& item : Split(sizes)) byte_sizes.push_back(std::stoull(item));
    return Client(Split(servers), rank, byte_sizes, chunk_bytes, chunks_per_request, warmup, iters,
                  seconds);
  } catch (const std::exception& e) {
    std::cerr << "ps-zmq-limit: " << e.what() << "\n";
    return 1;
  }
}
