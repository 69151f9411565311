#include "common/transport/bind_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>

#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// An IPv4 address of this host that is not the loopback, or "" when it has none.
std::string SomeNonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* it = list; it != nullptr && found.empty(); it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if ((it->ifa_flags & IFF_UP) == 0 || (it->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, text,
              sizeof(text));
    found = text;
  }
  freeifaddrs(list);
  return found;
}

TEST(ResolveBindAddressTest, AutoStaysOnTheLoopbackWithALoopbackCoordinatorOrNone) {
  for (const char* coordinator : {"", "127.0.0.1", "localhost", "::1", "[::1]"}) {
    StatusOr<BindAddress> address = ResolveBindAddress("auto", coordinator);
    ASSERT_TRUE(address.ok()) << coordinator << ": " << address.status();
    EXPECT_EQ(address->listen, "127.0.0.1") << coordinator;
    EXPECT_EQ(address->advertise, "127.0.0.1") << coordinator;
  }
}

TEST(ResolveBindAddressTest, AutoTakesTheLocalEndOfTheRouteToTheCoordinator) {
  const std::string own = SomeNonLoopbackAddress();
  if (own.empty()) GTEST_SKIP() << "this host has no IPv4 address besides the loopback";
  // A coordinator on this host's own address: the route to it starts at that address.
  StatusOr<BindAddress> address = ResolveBindAddress("auto", own);
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(address->listen, own);
  EXPECT_EQ(address->advertise, own);
  EXPECT_THAT(address->how, HasSubstr("route to " + own));
}

TEST(ResolveBindAddressTest, EveryInterfaceAdvertisesWhatAutoWould) {
  for (const char* every : {"0.0.0.0", "*"}) {
    StatusOr<BindAddress> address = ResolveBindAddress(every, "127.0.0.1");
    ASSERT_TRUE(address.ok()) << address.status();
    EXPECT_EQ(address->listen, "0.0.0.0");
    EXPECT_EQ(address->advertise, "127.0.0.1");
  }
  const std::string own = SomeNonLoopbackAddress();
  if (own.empty()) return;
  StatusOr<BindAddress> address = ResolveBindAddress("0.0.0.0", own);
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(address->listen, "0.0.0.0");
  EXPECT_EQ(address->advertise, own);
}

TEST(ResolveBindAddressTest, ACoordinatorListeningEverywhereAdvertisesASpecificAddress) {
  StatusOr<BindAddress> address = ResolveBindAddress("auto", "0.0.0.0");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_NE(address->advertise, "0.0.0.0");
  EXPECT_EQ(address->listen, address->advertise);
}

TEST(ResolveBindAddressTest, AnAddressOrAnInterfaceName) {
  StatusOr<BindAddress> address = ResolveBindAddress("10.1.2.3", "10.1.2.1");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(address->listen, "10.1.2.3");
  EXPECT_EQ(address->advertise, "10.1.2.3");

  address = ResolveBindAddress("lo", "10.1.2.1");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(address->listen, "127.0.0.1");
  EXPECT_THAT(address->how, HasSubstr("interface lo"));

  address = ResolveBindAddress("localhost", "");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(address->advertise, "127.0.0.1");
}

TEST(ResolveBindAddressTest, AnUnknownNameListsTheInterfaces) {
  StatusOr<BindAddress> address = ResolveBindAddress("nosuch0", "");
  ASSERT_FALSE(address.ok());
  EXPECT_THAT(address.status().message(), HasSubstr("--bind-host \"nosuch0\""));
  EXPECT_THAT(address.status().message(), HasSubstr("lo 127.0.0.1"));
  EXPECT_THAT(ResolveBindAddress("", "").status().message(), HasSubstr("empty"));
}

TEST(ResolveBindAddressTest, AnUnresolvableCoordinatorIsNamed) {
  StatusOr<BindAddress> address = ResolveBindAddress("auto", "no-such-host.invalid");
  ASSERT_FALSE(address.ok());
  EXPECT_THAT(address.status().message(), HasSubstr("no-such-host.invalid"));
  EXPECT_THAT(address.status().message(), HasSubstr("--bind-host auto"));
}

TEST(IsAddressOfThisHostTest, KnowsItsOwnAddresses) {
  EXPECT_TRUE(IsAddressOfThisHost("127.0.0.1"));
  EXPECT_TRUE(IsAddressOfThisHost("::ffff:127.0.0.1"));
  EXPECT_FALSE(IsAddressOfThisHost("192.0.2.77"));  // TEST-NET-1: documentation only
  EXPECT_FALSE(IsAddressOfThisHost(""));
  const std::string own = SomeNonLoopbackAddress();
  if (!own.empty()) {
    EXPECT_TRUE(IsAddressOfThisHost(own));
  }
}

TEST(InterfaceAddressTest, FindsTheLoopbackAndNamesTheMissing) {
  StatusOr<std::string> lo = InterfaceAddress("lo");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(*lo, "127.0.0.1");
  EXPECT_THAT(InterfaceAddress("nosuch0").status().message(), HasSubstr("no interface"));
}

// The same on every thread of one namespace; another network namespace (where this test may
// make one: root) has another.
TEST(LoopbackScopeTest, IsTheNetworkNamespaces) {
  const std::string here = LoopbackScope();
  EXPECT_EQ(here.rfind("boot ", 0), 0u) << here;
  std::string other_thread, other_namespace;
  bool unshared = false;
  std::thread([&] { other_thread = LoopbackScope(); }).join();
  std::thread([&] {
    unshared = unshare(CLONE_NEWNET) == 0;  // this thread only; it ends with it
    other_namespace = LoopbackScope();
  }).join();
  EXPECT_EQ(other_thread, here);
  if (unshared) {
    EXPECT_NE(other_namespace, here);
  }
}

}  // namespace
}  // namespace tessera
