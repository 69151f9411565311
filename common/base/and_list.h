// AndList: numbers as a sentence lists them, for messages: "2", "0 and 2", "0, 1 and 2".
#ifndef TESSERA_COMMON_BASE_AND_LIST_H_
#define TESSERA_COMMON_BASE_AND_LIST_H_

#include <string>
#include <vector>

namespace tessera {

inline std::string AndList(const std::vector<int>& items) {
  std::string listed;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) listed += i + 1 == items.size() ? " and " : ", ";
    listed += std::to_string(items[i]);
  }
  return listed;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_AND_LIST_H_
