#ifndef Detector_Common_interface_Layer_h
#define Detector_Common_interface_Layer_h

#include "Detector/Common/interface/Constants.h"

// An unscoped enum without a fixed type, inside a class, as CMSSW's PF code has one.
class DetLayer {
public:
  DetLayer() {}
  enum Layer { INNER = -1, NONE = 0, OUTER = 1 };
  static Layer fromId(int id) { return id > 0 ? OUTER : (id < 0 ? INNER : NONE); }
};

#endif
