#include "common/config/flag_checks.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera {
namespace {

// Parses `--x=value` into a fresh app with `check` on --x; returns CLI11's error text, or "".
template <typename T>
std::string ParseError(const CLI::Validator& check, const std::string& value) {
  CLI::App app;
  T x{};
  app.add_option("--x", x)->check(check);
  std::vector<std::string> args = {"--x=" + value};
  try {
    app.parse(args);
  } catch (const CLI::ParseError& error) {
    return error.what();
  }
  return "";
}

TEST(FlagChecksTest, FiniteRangeRefusesWhatCliRangeLetsThrough) {
  const CLI::Validator lr = FiniteRange(0, 1e6);
  for (const char* good : {"0", "0.01", "1e6", "3"}) {
    EXPECT_EQ(ParseError<double>(lr, good), "") << good;
  }
  // An empty value ("--x=") is refused by CLI11 itself: "--x: 1 required ... missing".
  EXPECT_NE(ParseError<double>(lr, "").find("--x: 1 required"), std::string::npos);
  for (const char* bad : {"nan", "inf", "-inf", "-1", "1e999", "1e7", "abc", "0.1x"}) {
    const std::string error = ParseError<double>(lr, bad);
    EXPECT_NE(error.find("--x"), std::string::npos) << bad << ": " << error;
    EXPECT_NE(error.find("'" + std::string(bad) + "' is not a finite number in [0, 1e+06]"),
              std::string::npos)
        << bad << ": " << error;
  }
}

TEST(FlagChecksTest, UnsignedRangeRefusesASign) {
  const CLI::Validator seed = UnsignedRange(0, UINT64_MAX);
  for (const char* good : {"0", "7", "18446744073709551615"}) {
    EXPECT_EQ(ParseError<uint64_t>(seed, good), "") << good;
  }
  EXPECT_NE(ParseError<uint64_t>(seed, "").find("--x: 1 required"), std::string::npos);
  for (const char* bad : {"-1", "+1", "18446744073709551616", "1.5", "nan"}) {
    const std::string error = ParseError<uint64_t>(seed, bad);
    EXPECT_NE(error.find("'" + std::string(bad) + "' is not an integer in [0, 18446744073709551615]"),
              std::string::npos)
        << bad << ": " << error;
  }
}

}  // namespace
}  // namespace tessera
