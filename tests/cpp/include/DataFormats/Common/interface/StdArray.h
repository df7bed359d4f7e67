// soagen's own stand-in for CMSSW's edm::StdArray, for the compile tests only (not CMSSW's code):
// what the layout reads of it is its size, N values of T with nothing between or after them.
#pragma once

#include <cstddef>

namespace edm {

  template <typename T, std::size_t N>
  struct StdArray {
    T values[N];
  };

}  // namespace edm
