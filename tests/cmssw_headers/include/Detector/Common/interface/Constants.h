// Constants the layouts of tests/cmssw_headers size their arrays with (project-written, in the
// style of CMSSW's DataFormats headers).
#ifndef Detector_Common_interface_Constants_h
#define Detector_Common_interface_Constants_h

#include <cstdint>

namespace detector {
  constexpr int kSamples = 10;  // samples per hit

  class phase1 {
  public:
    static constexpr unsigned int kChannels = 2 * 3;
    static constexpr double kPeriod = 25.;  // not an integer: never an extent
  };

  namespace {
    constexpr std::uint8_t kFirst = 0b1, kSecond = 0x2;
  }
}  // namespace detector

#endif
