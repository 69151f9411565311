// CLI11 checks for numeric flags. Every numeric flag of every binary states its range with one
// of these (or CLI::Range for integers), so a value outside it is refused naming the flag, the
// value and the range, and no number means "use the default": that is an absent flag.
//
//   app.add_option("--lr", lr, "Learning rate")->check(FiniteRange(0, 1e6));
//   app.add_option("--seed", seed, "Seed")->check(UnsignedRange(0, UINT64_MAX));
//
// CLI::Range alone is not enough for these: it lets nan through (every comparison with nan is
// false), and CLI11 reads "-1" into an unsigned flag as 2^64 - 1.
#ifndef TESSERA_COMMON_CONFIG_FLAG_CHECKS_H_
#define TESSERA_COMMON_CONFIG_FLAG_CHECKS_H_

#include <cstdint>

#include <CLI/CLI.hpp>

namespace tessera {

// A finite number in [min, max]: "nan is not a finite number in [0, 1000000]".
CLI::Validator FiniteRange(double min, double max);

// A decimal integer in [min, max], without a sign: "-1 is not an integer in [0, 18446744073709551615]".
CLI::Validator UnsignedRange(uint64_t min, uint64_t max);

}  // namespace tessera

#endif  // TESSERA_COMMON_CONFIG_FLAG_CHECKS_H_
