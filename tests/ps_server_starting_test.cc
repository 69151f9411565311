// A ps-* job whose server is in the fleet view but does not serve ps-* requests yet (it
// registered, and installs its PsService a moment later: what a job attaching to a long-running
// fleet that is still starting meets). PsEngine::Initialize waits for it, within the request
// deadline, and names the server when it never comes. Real endpoints on loopback, in one
// process, so the moment the service appears is under the test's control.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "common/messages/fleet_view.h"
#include "common/metrics/metrics.h"
#include "common/training/parameter_layout.h"
#include "common/transport/rpc_endpoint.h"
#include "common/transport/zmq/zmq_endpoint.h"
#include "server/ps/ps_service.h"
#include "worker/engines/ps_engine.h"

namespace tessera {
namespace {

constexpr uint64_t kKeySpace = 1000;

class PsServerStartingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZmqTransportOptions options;
    options.role = Role::kServer;
    options.rank = 0;
    auto server = StartZmqEndpoint(options, nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    options.role = Role::kWorker;
    auto worker = StartZmqEndpoint(options, nullptr);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = std::move(worker).value();

    view_.num_servers = 1;
    view_.num_workers = 1;
    view_.key_space = kKeySpace;
    MemberInfo server_member;
    server_member.role = Role::kServer;
    server_member.rank = 0;
    server_member.address = server_->address();
    server_member.state = MemberState::kAlive;
    server_member.key_end = kKeySpace;
    MemberInfo worker_member;
    worker_member.role = Role::kWorker;
    worker_member.rank = 0;
    worker_member.address = worker_->address();
    worker_member.state = MemberState::kAlive;
    view_.members = {server_member, worker_member};
    ASSERT_TRUE(layout_.Add("w", {3, 5}).ok());
  }

  StatusOr<std::unique_ptr<server::PsService>> StartService() {
    server::PsServiceOptions ps;
    ps.server_rank = 0;
    ps.num_servers = 1;
    ps.key_space = kKeySpace;
    return server::PsService::Start(ps, server_.get(), &server_metrics_);
  }

  StatusOr<std::unique_ptr<worker::PsEngine>> Engine(int64_t request_timeout_ms) {
    worker::PsEngineOptions options;
    options.optimizer = DefaultOptimizerOptions(OptimizerKind::kSgd);
    options.request_timeout_ms = request_timeout_ms;
    return worker::PsEngine::Create(options, worker_.get(), view_, /*rank=*/0, &worker_metrics_);
  }

  MetricsRegistry server_metrics_;
  MetricsRegistry worker_metrics_;
  std::unique_ptr<RpcEndpoint> server_;
  std::unique_ptr<RpcEndpoint> worker_;
  FleetView view_;
  ParameterLayout layout_;
};

TEST_F(PsServerStartingTest, InitializeWaitsForTheServiceToAppear) {
  auto engine = Engine(/*request_timeout_ms=*/10000);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<float> params(layout_.total_size());
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.25f * static_cast<float>(i);
  const std::vector<float> initial = params;

  auto initialized = std::async(std::launch::async, [&] {
    return (*engine)->Initialize(layout_, {}, params.data());
  });
  // The engine's first requests are answered Unimplemented meanwhile.
  ASSERT_EQ(initialized.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << initialized.get();
  auto service = StartService();
  ASSERT_TRUE(service.ok()) << service.status();
  Status status = initialized.get();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(params, initial);  // pulled back from the server, which rank 0 initialised
}

TEST_F(PsServerStartingTest, AServerThatNeverServesIsNamedAtTheDeadline) {
  auto engine = Engine(/*request_timeout_ms=*/400);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<float> params(layout_.total_size(), 1.0f);
  const auto start = std::chrono::steady_clock::now();
  Status status = (*engine)->Initialize(layout_, {}, params.data());
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented) << status;
  EXPECT_NE(status.message().find("initialising server 0"), std::string::npos) << status;
  EXPECT_NE(status.message().find("does not serve PsInitRequest"), std::string::npos) << status;
  EXPECT_GE(waited, std::chrono::milliseconds(400));
  EXPECT_LT(waited, std::chrono::seconds(5));
}

}  // namespace
}  // namespace tessera
