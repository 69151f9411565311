#include "server/ps/step_forwarder.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/transport/inproc/inproc_transport.h"

namespace tessera::server {
namespace {

// Servers over in-process transports: `answers` acknowledges each forward at once (and keeps
// what it was told to forward on to), a silent one never answers.
class StepForwarderTest : public ::testing::Test {
 protected:
  std::unique_ptr<RpcEndpoint> Server(const std::string& name, int rank, bool answers) {
    auto transport = InProcessTransport::Create(network_, name);
    EXPECT_TRUE(transport.ok()) << transport.status();
    auto endpoint = RpcEndpoint::Start(std::move(transport).value(), Role::kServer, rank, nullptr);
    EXPECT_TRUE(endpoint.ok()) << endpoint.status();
    RpcEndpoint* raw = endpoint->get();
    raw->SetHandler(MessageType::kPsPushPullRequest, [this, raw, answers, name](Envelope e) {
      if (!answers) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        received_.push_back(name + " <- " + e.As<PsPushPullRequest>()->forward_to);
      }
      raw->Reply(e, Ack{});
    });
    return std::move(endpoint).value();
  }

  static DenseShard::ForwardedStep Push(int rank, int64_t step) {
    DenseShard::ForwardedStep forwarded;
    forwarded.step = step;
    forwarded.pushed_by = rank;
    forwarded.gradients = {TensorData::Floats("chunk0", 0, {1, 2})};
    forwarded.updates = {step};
    return forwarded;
  }

  std::vector<std::string> Received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }

  std::shared_ptr<InProcessNetwork> network_ = std::make_shared<InProcessNetwork>();
  std::mutex mu_;
  std::vector<std::string> received_;  // guarded by mu_: "name <- forward_to"
};

// Forwards finish as they are answered: one to a copy that answers is done while one sent
// before it, to a silent copy, still waits (in a chain, that earlier one's acknowledgement may
// wait for this one).
TEST_F(StepForwarderTest, EachForwardIsDoneWhenAnsweredNotInTheOrderSent) {
  auto primary = Server("primary", 0, true);
  auto silent = Server("silent", 1, false);
  auto backup = Server("backup", 2, true);
  StepForwarder forwarder(primary.get(), StepForwarderOptions{0, 10000, 250});
  std::promise<Status> first;
  std::promise<Status> second;
  forwarder.Forward(silent->address(), 0, 7, Push(0, 1),
                    [&first](const Status& refused) { first.set_value(refused); });
  forwarder.Forward(backup->address(), 1, 7, Push(0, 1),
                    [&second](const Status& refused) { second.set_value(refused); });
  auto done = second.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  auto waiting = first.get_future();
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  forwarder.PeerLost(silent->address(), "server 1 failed");
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(waiting.get().ok());  // a backup declared failed: the range lives here alone
}

// Along a chain "middle,last": the middle is told to forward on to the last; when the middle is
// declared failed before it answered, the forward goes on to the last itself, and later
// forwards pass over the middle.
TEST_F(StepForwarderTest, AChainsFailedMiddleCopyIsPassedOver) {
  auto primary = Server("primary", 0, true);
  auto middle = Server("middle", 1, false);
  auto last = Server("last", 2, true);
  StepForwarder forwarder(primary.get(), StepForwarderOptions{0, 10000, 250});
  const std::string chain = middle->address() + "," + last->address();
  std::promise<Status> first;
  forwarder.Forward(chain, 0, 7, Push(0, 1),
                    [&first](const Status& refused) { first.set_value(refused); });
  auto done = first.get_future();
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  forwarder.PeerLost(middle->address(), "server 1 failed");
  ASSERT_EQ(done.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  std::promise<Status> second;
  forwarder.Forward(chain, 0, 7, Push(1, 1),
                    [&second](const Status& refused) { second.set_value(refused); });
  auto later = second.get_future();
  ASSERT_EQ(later.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(later.get().ok());
  // The last copy is the end of the chain: nothing to forward on to.
  EXPECT_EQ(Received(), (std::vector<std::string>{"last <- ", "last <- "}));
}

// A forward still out when the forwarder stops: its call ends later (here the endpoint fails
// it) without reaching the forwarder that is gone.
TEST_F(StepForwarderTest, AForwardStillOutWhenTheForwarderStopsEndsSafely) {
  auto primary = Server("primary", 0, true);
  auto silent = Server("silent", 1, false);
  bool ran = false;
  {
    StepForwarder forwarder(primary.get(), StepForwarderOptions{0, 10000, 250});
    forwarder.Forward(silent->address(), 0, 7, Push(0, 1), [&ran](const Status&) { ran = true; });
  }
  primary->FailAll(CancelledError("stopping"));
  EXPECT_FALSE(ran);  // dropped with the forwarder, as the service's waiting replies are
}

}  // namespace
}  // namespace tessera::server
