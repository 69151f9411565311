// ExpectParamsMatch: two params files (worker/params_file.h) hold the same tensors, each
// element within `relative` of its tensor's scale in `want`: |got - want| <= relative *
// max |want tensor|. How the parallel modes' tests compare a run against one process (their
// sums run in other orders, so bitwise equality is not theirs to promise).
#ifndef TESSERA_TESTS_PARAMS_MATCH_H_
#define TESSERA_TESTS_PARAMS_MATCH_H_

#include <string>

namespace tessera::testing {

// gtest failures name the tensor, its largest difference and its scale.
void ExpectParamsMatch(const std::string& got_path, const std::string& want_path,
                       double relative = 1e-5);

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_PARAMS_MATCH_H_
