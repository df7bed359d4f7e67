#pragma once

#include <array>
#include <Eigen/Core>
#include "DataFormats/SoATemplate/interface/SoALayout.h"

#define TRACK_HITS 4

namespace {
  constexpr int kLayers = 2 * 3;
}

template <typename TrackerTraits>
struct TrackSoAWrapper {
  using HitCharge = Eigen::Vector<float, TRACK_HITS>;

  GENERATE_SOA_LAYOUT(
      TrackLayout,
      SOA_COLUMN(float, pt),  // transverse momentum
                              // in GeV
      SOA_COLUMN(unsigned short, nHits),

      SOA_EIGEN_COLUMN(HitCharge, hitCharge),
      SOA_COLUMN(bool, quality),
      SOA_SCALAR(int, nTracks)
  );
};

using LayerFlags = std::array<signed char, kLayers>;

GENERATE_SOA_LAYOUT(VertexCounts,
                    SOA_COLUMN(int, counts),
                    SOA_COLUMN(LayerFlags, layerFlags)
)

using VertexCountsSoA = VertexCounts<>;
