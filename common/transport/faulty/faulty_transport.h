// FaultyTransport: a Transport decorator that loses, delays, duplicates and cuts off what this
// process sends, from a seed, so a test can show that the layer above notices (a deadline
// names the lost call, a duplicate is ignored, a late reply still lands in order).
//
//   FaultOptions faults;
//   faults.seed = 7;
//   faults.drop_probability = 0.1;
//   auto faulty = std::make_unique<FaultyTransport>(std::move(inner), faults);
//   faulty->Disconnect(peer_address);   // everything to that peer is lost from now on
//
// Faults apply to Send and Reply alike, per message. Delays keep each destination's order:
// a message never overtakes an earlier one to the same address (ZeroMQ's order per
// connection), so what a test sees is loss, lateness or repetition, never reordering.
// Decisions come from one seeded generator in the order messages are sent, so a test that
// sends from one thread sees the same faults on every run.
//
// Processes take one from the environment, for tests of whole jobs (common/process): with
// TESSERA_INJECT_FAULTS="seed=7,drop=0.05,duplicate=0.01,sends=ps" a worker or server loses
// 5% and repeats 1% of what it sends on the parameter-server path (FaultOptions::Parse).
//
// Thread-safety: thread-safe. Delayed messages leave from the decorator's own timer thread.
#ifndef TESSERA_COMMON_TRANSPORT_FAULTY_FAULTY_TRANSPORT_H_
#define TESSERA_COMMON_TRANSPORT_FAULTY_FAULTY_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "common/transport/transport.h"

namespace tessera {

struct FaultOptions {
  uint64_t seed = 1;
  double drop_probability = 0;       // the message is lost
  double duplicate_probability = 0;  // the message is sent twice
  double delay_probability = 0;      // the message waits delay_ms before it leaves
  int64_t delay_ms = 0;
  // Sends of these types only (empty: every Send); replies always. Other sends leave
  // untouched, drawing nothing, behind any delayed message to their destination.
  std::set<MessageType> send_types;

  // "seed=N,drop=P,duplicate=P,delay=P,delay_ms=MS,sends=ps" (any subset, any order; P in
  // [0, 1]); sends=ps is the requests a worker sends its parameter servers (init, push-pull,
  // sparse push and pull, checkpoint), whose servers answer nothing else. InvalidArgument
  // naming the part that is wrong.
  static StatusOr<FaultOptions> Parse(std::string_view text);
  std::string ToString() const;
};

class FaultyTransport final : public Transport {
 public:
  FaultyTransport(std::unique_ptr<Transport> inner, FaultOptions options);
  ~FaultyTransport() override;

  const std::string& address() const override { return inner_->address(); }
  Status Start(MessageHandler handler) override { return inner_->Start(std::move(handler)); }
  Status Send(const std::string& address, OutgoingMessage message) override;
  Status Reply(const Origin& origin, OutgoingMessage message) override;
  // Connections are the inner transport's: watched there, without faults.
  Status Watch(const std::string& address, std::function<void()> on_gone) override {
    return inner_->Watch(address, std::move(on_gone));
  }
  void Shutdown() override;
  void SetIdentity(Role role, int32_t rank) override { inner_->SetIdentity(role, rank); }

  // From now on every message to `address` (or, for replies, to the request's sender whose
  // route is `address`) is lost, as if the connection were cut. Reconnect undoes it.
  void Disconnect(const std::string& address);
  void Reconnect(const std::string& address);

  // Messages lost, sent twice and delayed so far.
  uint64_t dropped() const { return dropped_.load(); }
  uint64_t duplicated() const { return duplicated_.load(); }
  uint64_t delayed() const { return delayed_.load(); }

 private:
  struct Outgoing {
    bool is_reply = false;
    std::string address;  // Send: the destination; Reply: unused
    Origin origin;        // Reply: the request's origin
    OutgoingMessage message;
  };
  enum class Fate { kLost, kNow, kLater };

  Status Submit(Outgoing outgoing);
  Status Forward(const Outgoing& outgoing);
  void TimerLoop();

  const std::unique_ptr<Transport> inner_;
  const FaultOptions options_;
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> duplicated_{0};
  std::atomic<uint64_t> delayed_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::mt19937_64 random_;                               // guarded by mu_
  std::set<std::string> disconnected_;                   // guarded by mu_
  // Delayed messages by when they leave (ties in submission order).
  std::multimap<SteadyClock::time_point, Outgoing> later_;  // guarded by mu_
  // When the last delayed message to each destination leaves: later ones to it wait as long.
  std::map<std::string, SteadyClock::time_point> last_due_;  // guarded by mu_
  // Messages to each destination in later_: while any wait, new ones queue behind them.
  std::map<std::string, int> waiting_;  // guarded by mu_
  bool stopped_ = false;                                   // guarded by mu_
  std::thread timer_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TRANSPORT_FAULTY_FAULTY_TRANSPORT_H_
