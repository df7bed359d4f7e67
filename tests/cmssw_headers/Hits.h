#ifndef Detector_Hits_h
#define Detector_Hits_h

#include <Eigen/Core>

#include "DataFormats/Common/interface/StdArray.h"  // not under -I: edm::StdArray is known anyway
#include "DataFormats/SoATemplate/interface/SoALayout.h"
#include "Detector/Common/interface/Layer.h"

namespace detector {
  namespace hits {

    using Position = Eigen::Matrix<float, 3, 1>;
    typedef Eigen::Matrix<double, 2, 2> Covariance;
    using Samples = edm::StdArray<uint16_t, kSamples>;
    using Grid = edm::StdArray<edm::StdArray<int8_t, 4>, phase1::kChannels>;
    using Rotation = Eigen ::Matrix3d;
    enum class Status : int16_t { good = 0, bad = 1 };

    // Hits of one event,
    // one element per hit.
    GENERATE_SOA_LAYOUT(HitLayout,
                        // the hit's detector id
                        SOA_COLUMN(uint32_t, id),
                        SOA_COLUMN(double  , energy),  // in GeV
                        SOA_EIGEN_COLUMN(Position, position),
                        /* covariance of the
                         * position */
                        SOA_EIGEN_COLUMN(Covariance, covariance),
                        SOA_EIGEN_COLUMN(Eigen::Vector2f, direction),
                        SOA_EIGEN_COLUMN(Rotation, rotation),
                        SOA_COLUMN(Samples, adc),
                        SOA_COLUMN(Grid, grid),
                        SOA_COLUMN(Status, status),
                        SOA_COLUMN(DetLayer::Layer, layer),
                        SOA_SCALAR(Status, worst),
                        SOA_SCALAR(std::int64_t, event),
                        SOA_SCALAR(uint32_t, size),  // hits in use

                        SOA_ELEMENT_METHODS(
                            float perSample() const { return energy() / (adc()[0] + 1, 1.f); }
                            void reset() {
                              if (id() > 0) {
                                energy() = 0;
                              }
                            }),
                        SOA_CONST_ELEMENT_METHODS(
                            bool isGood() const { return status() == Status::good; }))

    using HitSoA = HitLayout<64>;

  }  // namespace hits
}  // namespace detector

#endif
