// PsEngine against a stand-in server on an in-process transport (which shares a payload that
// has an owner, as ZeroMQ does, and copies one that has none): where the pushed gradient bytes
// come from, and how long the buffer they borrow lives.
#include "worker/engines/ps_engine.h"

#include <gtest/gtest.h>

#include <thread>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/transport/inproc/inproc_transport.h"

namespace tessera::worker {
namespace {

constexpr size_t kElements = 10;     // one tensor of 10 floats
constexpr uint64_t kChunk = 4;       // in chunks of 4: 4 + 4 + 2
constexpr float kServerValue = 2.5f;  // what the stand-in server answers every pull with

std::shared_ptr<InProcessNetwork> Network() {
  static const auto network = std::make_shared<InProcessNetwork>();
  return network;
}

std::unique_ptr<RpcEndpoint> StartEndpoint(Role role, const std::string& name) {
  auto transport = InProcessTransport::Create(Network(), name);
  EXPECT_TRUE(transport.ok()) << transport.status();
  auto endpoint = RpcEndpoint::Start(std::move(transport).value(), role, 0, nullptr);
  EXPECT_TRUE(endpoint.ok()) << endpoint.status();
  return std::move(endpoint).value();
}

// A server that takes the job, answers every pull and push with kServerValue and remembers
// where each pushed chunk's bytes were; with `hold_pushes`, it keeps pushes unanswered.
class StandInServer {
 public:
  StandInServer(const std::string& name, bool hold_pushes)
      : endpoint_(StartEndpoint(Role::kServer, name)) {
    RpcEndpoint* endpoint = endpoint_.get();
    endpoint->SetHandler(MessageType::kPsInitRequest,
                         [endpoint](Envelope e) { endpoint->Reply(e, Ack{}); });
    endpoint->SetHandler(MessageType::kPsPushPullRequest, [this, endpoint,
                                                           hold_pushes](Envelope e) {
      const PsPushPullRequest& request = *e.As<PsPushPullRequest>();
      PsPushPullReply reply;
      for (const TensorData& tensor : request.tensors) {
        const size_t count = static_cast<size_t>(tensor.shape[0]);
        if (request.has_gradients) {
          std::lock_guard<std::mutex> lock(mu_);
          pushed_at_.push_back(reinterpret_cast<const float*>(tensor.bytes.data()));
        }
        reply.tensors.push_back(TensorData::Floats(tensor.name, tensor.key,
                                                   std::vector<float>(count, kServerValue)));
      }
      if (request.has_gradients && hold_pushes) {
        std::lock_guard<std::mutex> lock(mu_);
        held_.push_back(std::move(e));
        return;
      }
      endpoint->Reply(e, std::move(reply));
    });
  }

  const std::string& address() const { return endpoint_->address(); }
  std::vector<const float*> pushed_at() {
    std::lock_guard<std::mutex> lock(mu_);
    return pushed_at_;
  }
  // The first held push's first chunk, as the server received it.
  std::vector<float> HeldChunk() {
    std::lock_guard<std::mutex> lock(mu_);
    const TensorData& tensor = held_.at(0).As<PsPushPullRequest>()->tensors.at(0);
    std::vector<float> values(tensor.bytes.size() / sizeof(float));
    std::memcpy(values.data(), tensor.bytes.data(), tensor.bytes.size());
    return values;
  }
  void DropHeld() {
    std::lock_guard<std::mutex> lock(mu_);
    held_.clear();
  }

 private:
  std::unique_ptr<RpcEndpoint> endpoint_;
  std::mutex mu_;
  std::vector<const float*> pushed_at_;  // guarded by mu_
  std::vector<Envelope> held_;           // guarded by mu_
};

struct Worker {
  std::unique_ptr<RpcEndpoint> endpoint;
  MetricsRegistry metrics;
  std::unique_ptr<PsEngine> engine;
  std::vector<float> params = std::vector<float>(kElements, 0.0f);
};

std::unique_ptr<Worker> StartWorker(const std::string& name, const StandInServer& server,
                                    int64_t request_timeout_ms) {
  auto worker = std::make_unique<Worker>();
  worker->endpoint = StartEndpoint(Role::kWorker, name);
  FleetView view;
  view.num_servers = 1;
  view.num_workers = 1;
  view.key_space = 100;
  view.members.push_back({Role::kServer, 0, server.address(), "", "", 0, MemberState::kAlive,
                          0, 100});
  MemberInfo self;
  self.address = worker->endpoint->address();
  self.rank = 0;
  view.members.push_back(self);
  PsEngineOptions options;
  options.consistency = PsConsistency::kAsync;
  options.chunk_elements = kChunk;
  options.chunks_per_request = 1;
  options.request_timeout_ms = request_timeout_ms;
  auto optimizer = ParseOptimizerOptions("sgd", "lr=0.1");
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  options.optimizer = *optimizer;
  auto engine = PsEngine::Create(options, worker->endpoint.get(), view, 0, &worker->metrics);
  EXPECT_TRUE(engine.ok()) << engine.status();
  worker->engine = std::move(engine).value();
  ParameterLayout layout;
  EXPECT_TRUE(layout.Add("w", {static_cast<int64_t>(kElements)}).ok());
  Status initialized = worker->engine->Initialize(layout, {}, worker->params.data());
  EXPECT_TRUE(initialized.ok()) << initialized;
  return worker;
}

std::shared_ptr<std::vector<float>> Gradients() {
  auto grads = std::make_shared<std::vector<float>>(kElements);
  for (size_t i = 0; i < kElements; ++i) (*grads)[i] = 0.5f + static_cast<float>(i);
  return grads;
}

TEST(PsEngineTest, GradientsWithAnOwnerArePushedFromTheCallersBuffer) {
  StandInServer server("ps-engine-test-server-1", /*hold_pushes=*/false);
  auto worker = StartWorker("ps-engine-test-worker-1", server, 10000);
  auto grads = Gradients();
  worker->engine->SetGradientOwner(grads);
  Status stepped = worker->engine->Step(1, worker->params.data(), grads->data(), {});
  ASSERT_TRUE(stepped.ok()) << stepped;
  const std::vector<const float*> expected = {grads->data(), grads->data() + kChunk,
                                              grads->data() + 2 * kChunk};
  EXPECT_EQ(server.pushed_at(), expected);
  EXPECT_EQ(worker->params, std::vector<float>(kElements, kServerValue));
}

TEST(PsEngineTest, GradientsWithoutAnOwnerAreCopied) {
  StandInServer server("ps-engine-test-server-2", /*hold_pushes=*/false);
  auto worker = StartWorker("ps-engine-test-worker-2", server, 10000);
  auto grads = Gradients();
  Status stepped = worker->engine->Step(1, worker->params.data(), grads->data(), {});
  ASSERT_TRUE(stepped.ok()) << stepped;
  ASSERT_EQ(server.pushed_at().size(), 3u);
  for (const float* at : server.pushed_at()) {
    EXPECT_FALSE(at >= grads->data() && at < grads->data() + kElements);
  }
  EXPECT_EQ(worker->params, std::vector<float>(kElements, kServerValue));
}

// A step that fails while its push is still held by the server (a timeout; a dead server's
// transport keeps it the same way): the borrowed buffer outlives both the step and the
// caller's reference, until the request is gone.
TEST(PsEngineTest, ABorrowedBufferLivesAsLongAsARequestThatOutlivesItsStep) {
  StandInServer server("ps-engine-test-server-3", /*hold_pushes=*/true);
  auto worker = StartWorker("ps-engine-test-worker-3", server, 300);
  auto grads = Gradients();
  const std::vector<float> sent(grads->begin(), grads->begin() + kChunk);
  worker->engine->SetGradientOwner(grads);
  Status stepped = worker->engine->Step(1, worker->params.data(), grads->data(), {});
  EXPECT_EQ(stepped.code(), StatusCode::kDeadlineExceeded) << stepped;
  std::weak_ptr<std::vector<float>> buffer = grads;
  grads.reset();
  worker->engine->SetGradientOwner(nullptr);
  EXPECT_FALSE(buffer.expired());  // the held request keeps it
  EXPECT_EQ(server.HeldChunk(), sent);
  server.DropHeld();
  // The step returned at its first failed reply; the step's other calls, which keep the buffer
  // for resending until they end, end at the same deadline a moment later.
  const Deadline released = Deadline::AfterMillis(5000);
  while (!buffer.expired() && !released.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(buffer.expired());
}

}  // namespace
}  // namespace tessera::worker
