#include "worker/collectives/channel/zmq/collective_mailbox.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "worker/collectives/channel/zmq/communicator_tags.h"

namespace tessera::worker {
namespace {

RingFrame Frame(uint64_t tag, uint32_t slot, int32_t sender = 1) {
  RingFrame frame;
  frame.sender_rank = sender;
  frame.tag = tag;
  frame.slot = slot;
  return frame;
}

std::shared_ptr<CollectiveMailbox> NewMailbox(std::shared_ptr<FailureBus> failures = nullptr,
                                              size_t max_queued_frames = kMaxKeptFrames) {
  if (failures == nullptr) failures = std::make_shared<FailureBus>();
  return std::make_shared<CollectiveMailbox>(std::move(failures), max_queued_frames);
}

TEST(CollectiveMailboxTest, PopsByTagAndSlotWhateverTheArrivalOrder) {
  auto mailbox = NewMailbox();
  mailbox->Deliver(Frame(2, 1));
  mailbox->Deliver(Frame(1, 3));
  mailbox->Deliver(Frame(1, 0));
  auto first = mailbox->Pop(1, 0, Deadline::AfterMillis(1000));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->tag, 1u);
  EXPECT_EQ(first->slot, 0u);
  EXPECT_EQ(mailbox->Pop(2, 1, Deadline::AfterMillis(1000))->tag, 2u);
  EXPECT_EQ(mailbox->Pop(1, 3, Deadline::AfterMillis(1000))->slot, 3u);
  EXPECT_EQ(mailbox->queued(), 0u);
}

// Frames under one (tag, slot) are popped in the order they came: a tag used again by a later
// call is matched call by call.
TEST(CollectiveMailboxTest, FramesUnderOneKeyPopInArrivalOrder) {
  auto mailbox = NewMailbox();
  RingFrame first = Frame(4, 0);
  first.block = 1;
  RingFrame second = Frame(4, 0);
  second.block = 2;
  mailbox->Deliver(first);
  mailbox->Deliver(second);
  EXPECT_EQ(mailbox->Pop(4, 0, Deadline::AfterMillis(1000))->block, 1u);
  EXPECT_EQ(mailbox->Pop(4, 0, Deadline::AfterMillis(1000))->block, 2u);
}

TEST(CollectiveMailboxTest, WaitsForAFrameThatArrivesLater) {
  auto mailbox = NewMailbox();
  std::thread sender([&mailbox] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    mailbox->Deliver(Frame(7, 2));
  });
  auto frame = mailbox->Pop(7, 2, Deadline::AfterMillis(10000));
  sender.join();
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->sender_rank, 1);
}

TEST(CollectiveMailboxTest, PopEndsAtTheDeadline) {
  auto mailbox = NewMailbox();
  mailbox->Deliver(Frame(1, 1));  // another slot: not what we wait for
  auto started = SteadyClock::now();
  auto frame = mailbox->Pop(1, 0, Deadline::AfterMillis(100));
  auto waited = SteadyClock::now() - started;
  EXPECT_EQ(frame.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(frame.status().message(), "");  // the caller says what it waited for
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_LT(waited, std::chrono::milliseconds(5000));
  EXPECT_TRUE(mailbox->failure().ok());
}

TEST(CollectiveMailboxTest, AFailureOnTheBusWakesEveryWaiterWithTheRootCause) {
  auto failures = std::make_shared<FailureBus>();
  auto mailbox = NewMailbox(failures);
  std::vector<std::thread> waiters;
  std::vector<Status> results(3);
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&mailbox, &results, i] {
      results[i] = mailbox->Pop(1, static_cast<uint32_t>(i), Deadline::AfterMillis(60000)).status();
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto started = SteadyClock::now();
  failures->Fail(AbortedError("worker 0 (tcp://127.0.0.1:5000) failed: no heartbeat"));
  failures->Fail(AbortedError("a later failure caused by the first"));
  for (auto& waiter : waiters) waiter.join();
  EXPECT_LT(SteadyClock::now() - started, std::chrono::milliseconds(2000));
  for (const Status& result : results) {
    EXPECT_EQ(result, AbortedError("worker 0 (tcp://127.0.0.1:5000) failed: no heartbeat"));
  }
  // Later pops fail at once with the same root cause, even for a frame that is there.
  mailbox->Deliver(Frame(1, 5));
  EXPECT_EQ(mailbox->Pop(1, 5, Deadline::AfterMillis(60000)).status(), results[0]);
  EXPECT_EQ(mailbox->failure(), results[0]);
}

// The mailbox may go before the bus: its subscription ends with it.
TEST(CollectiveMailboxTest, ABusThatOutlivesTheMailboxFailsSafely) {
  auto failures = std::make_shared<FailureBus>();
  NewMailbox(failures).reset();
  failures->Fail(AbortedError("after the mailbox"));
  EXPECT_FALSE(failures->failure().ok());
}

TEST(CollectiveMailboxTest, OverflowFailsTheBusNamingTheSender) {
  auto failures = std::make_shared<FailureBus>();
  auto mailbox = NewMailbox(failures, /*max_queued_frames=*/2);
  mailbox->Deliver(Frame(1, 0));
  mailbox->Deliver(Frame(1, 1));
  mailbox->Deliver(Frame(9, 0, /*sender=*/4));
  Status failure = failures->failure();
  EXPECT_EQ(failure.code(), StatusCode::kUnavailable);
  EXPECT_EQ(failure.message(),
            "collective mailbox full (2 frames waiting) when worker 4 sent tag=9 slot 0: frames "
            "arrive for no running collective");
  EXPECT_EQ(mailbox->failure(), failure);
  EXPECT_EQ(mailbox->Pop(1, 0, Deadline::AfterMillis(1000)).status(), failure);
  EXPECT_EQ(mailbox->queued(), 2u);
}

TEST(CollectiveMailboxTest, DiscardDropsOneTagOnly) {
  auto mailbox = NewMailbox();
  mailbox->Deliver(Frame(3, 0));
  mailbox->Deliver(Frame(3, 4));
  mailbox->Deliver(Frame(4, 0));
  mailbox->Discard(3);
  EXPECT_EQ(mailbox->queued(), 1u);
  EXPECT_EQ(mailbox->Pop(3, 0, Deadline::AfterMillis(10)).status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(mailbox->Pop(4, 0, Deadline::AfterMillis(1000)).ok());
}

// Delivers a frame (tag 1, slot = count) numbered as `channel`'s `count`th frame; whether the
// mailbox kept it.
bool Kept(CollectiveMailbox& mailbox, uint32_t channel, uint32_t count, int32_t sender = 1) {
  const size_t before = mailbox.queued();
  RingFrame frame = Frame(1, count, sender);
  frame.sequence = RingFrameNumber(channel, count);
  mailbox.Deliver(std::move(frame));
  return mailbox.queued() == before + 1;
}

TEST(CollectiveMailboxTest, AFrameDeliveredTwiceIsDropped) {
  auto mailbox = NewMailbox();
  EXPECT_TRUE(Kept(*mailbox, 7, 1));
  EXPECT_FALSE(Kept(*mailbox, 7, 1));
  EXPECT_TRUE(Kept(*mailbox, 7, 2));
  EXPECT_FALSE(Kept(*mailbox, 7, 2));
  EXPECT_FALSE(Kept(*mailbox, 7, 1));
  EXPECT_EQ(mailbox->repeats(), 3u);
  // Each sender counts on its own, and unnumbered frames (0) are always taken.
  EXPECT_TRUE(Kept(*mailbox, 7, 1, /*sender=*/2));
  mailbox->Deliver(Frame(1, 1));
  mailbox->Deliver(Frame(1, 1));
  EXPECT_EQ(mailbox->queued(), 5u);
  EXPECT_EQ(mailbox->repeats(), 3u);
}

// Frames that overtook each other are each taken once, as long as none is more than
// kRepeatWindow below the newest; older ones cannot be told from repeats and are dropped.
TEST(CollectiveMailboxTest, FramesOutOfOrderAreTakenOnce) {
  auto mailbox = NewMailbox();
  EXPECT_TRUE(Kept(*mailbox, 7, 5));
  EXPECT_TRUE(Kept(*mailbox, 7, 3));
  EXPECT_FALSE(Kept(*mailbox, 7, 3));
  EXPECT_TRUE(Kept(*mailbox, 7, 4));
  EXPECT_FALSE(Kept(*mailbox, 7, 5));
  EXPECT_TRUE(Kept(*mailbox, 7, 6));
  const uint32_t window = CollectiveMailbox::kRepeatWindow;
  EXPECT_TRUE(Kept(*mailbox, 7, 7 + window));  // 7 .. 6 + window not had yet
  EXPECT_TRUE(Kept(*mailbox, 7, 7));           // the oldest the window holds
  EXPECT_FALSE(Kept(*mailbox, 7, 7));
  EXPECT_FALSE(Kept(*mailbox, 7, 6));  // had, and below the window anyway
  EXPECT_FALSE(Kept(*mailbox, 7, 2));  // never had, but too old to tell
  EXPECT_TRUE(Kept(*mailbox, 7, 6 + window));
}

TEST(CollectiveMailboxTest, CountsMayWrapAndANewChannelCountsAfresh) {
  auto mailbox = NewMailbox();
  EXPECT_TRUE(Kept(*mailbox, 9, 0xffffffff));
  EXPECT_TRUE(Kept(*mailbox, 9, 0));
  EXPECT_TRUE(Kept(*mailbox, 9, 1));
  EXPECT_FALSE(Kept(*mailbox, 9, 0xffffffff));
  EXPECT_FALSE(Kept(*mailbox, 9, 0));
  // The sender's new channel (a restarted worker) starts from 1 again.
  EXPECT_TRUE(Kept(*mailbox, 10, 1));
  EXPECT_TRUE(Kept(*mailbox, 10, 2));
  EXPECT_FALSE(Kept(*mailbox, 10, 1));
}

// One process sends through several channels at once (its ring's, its point-to-point one, its
// groups'): each counts on its own, and switching between them forgets none of their repeats.
TEST(CollectiveMailboxTest, ASendersChannelsCountApart) {
  auto mailbox = NewMailbox();
  EXPECT_TRUE(Kept(*mailbox, 9, 1));
  EXPECT_TRUE(Kept(*mailbox, 10, 1));
  EXPECT_TRUE(Kept(*mailbox, 9, 2));
  EXPECT_TRUE(Kept(*mailbox, 10, 2));
  EXPECT_FALSE(Kept(*mailbox, 9, 1));
  EXPECT_FALSE(Kept(*mailbox, 10, 2));
  EXPECT_EQ(mailbox->repeats(), 2u);
}

TEST(CollectiveMailboxTest, AForgottenGroupsFramesGoNowAndLater) {
  auto mailbox = NewMailbox();
  mailbox->Deliver(Frame(*WireTag(3, 1), 0));
  mailbox->Deliver(Frame(*WireTag(4, 1), 0));
  mailbox->Deliver(Frame(1, 0));  // the world's
  mailbox->ForgetGroup(3);
  EXPECT_EQ(mailbox->queued(), 2u);
  mailbox->Deliver(Frame(*WireTag(3, ~uint64_t{0}), 0));  // its setup's, say
  EXPECT_EQ(mailbox->queued(), 2u);
  EXPECT_TRUE(mailbox->Pop(*WireTag(4, 1), 0, Deadline::AfterMillis(0)).ok());
}

Envelope FrameFrom(std::optional<Role> role, int32_t rank, RingFrame frame) {
  Envelope envelope;
  envelope.origin.reply_to = "route";
  envelope.header.sender_role = role;
  envelope.header.sender_rank = rank;
  envelope.body = std::move(frame);
  return envelope;
}

// The sender rank of a frame is the one its envelope names (what the transport says), not what
// the frame says; frames from anyone but a worker take part in no ring.
TEST(CollectiveMailboxTest, TheHandlerTakesTheSenderFromTheEnvelopeAndOnlyFromWorkers) {
  auto mailbox = NewMailbox();
  MessageHandler handler = CollectiveMailbox::Handler(mailbox);
  RingFrame frame = Frame(6, 0, /*sender=*/9);
  frame.sequence = RingFrameNumber(5, 1);
  Envelope numbered = FrameFrom(Role::kWorker, 3, frame);
  handler(numbered);
  handler(numbered);
  handler(FrameFrom(Role::kServer, 0, Frame(6, 1)));
  handler(FrameFrom(std::nullopt, -1, Frame(6, 2)));
  EXPECT_EQ(mailbox->queued(), 1u);
  EXPECT_EQ(mailbox->repeats(), 1u);
  auto popped = mailbox->Pop(6, 0, Deadline::AfterMillis(1000));
  ASSERT_TRUE(popped.ok()) << popped.status();
  EXPECT_EQ(popped->sender_rank, 3);
}

}  // namespace
}  // namespace tessera::worker
