// soagen's own stand-in for CMSSW's GENERATE_SOA_LAYOUT, for the compile tests only (not CMSSW's
// code). Written from the byte-layout rules in soagen's README: members in declaration order, each
// starting where the previous one ends; a column of T takes round_up(n * sizeof(T), A) bytes, an
// Eigen column of an R x C matrix R * C such columns, a scalar round_up(sizeof(T), A) bytes.
// Like CMSSW's, the layout is `template <std::size_t ALIGNMENT = 128, bool ALIGNMENT_ENFORCEMENT = false>`
// with `static constexpr computeDataSize(n)`; it adds what the tests read: `memberNames` and
// `offsets(n)` (byte offset of every member, in declaration order) and `offsetOf_<name>(n)`.
// Eigen types are read through their RowsAtCompileTime, ColsAtCompileTime and Scalar, so
// <Eigen/Core> must be included first where a layout has Eigen columns, as with CMSSW's.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include <boost/preprocessor/cat.hpp>
#include <boost/preprocessor/punctuation/comma_if.hpp>
#include <boost/preprocessor/seq/for_each.hpp>
#include <boost/preprocessor/seq/for_each_i.hpp>
#include <boost/preprocessor/seq/size.hpp>
#include <boost/preprocessor/stringize.hpp>
#include <boost/preprocessor/tuple/elem.hpp>
#include <boost/preprocessor/variadic/to_seq.hpp>

namespace soagen_standin {

  constexpr std::size_t roundUp(std::size_t size, std::size_t alignment) {
    return (size + alignment - 1) / alignment * alignment;
  }

  // One pitch rule per macro: the macro's tuple names its rule, so the layout needs no dispatch.
  struct Column {
    template <std::size_t A, typename T>
    static constexpr std::size_t pitch(std::size_t n) {
      return roundUp(n * sizeof(T), A);
    }
  };

  struct EigenColumn {
    template <std::size_t A, typename T>
    static constexpr std::size_t pitch(std::size_t n) {
      return std::size_t(T::RowsAtCompileTime) * std::size_t(T::ColsAtCompileTime) *
             roundUp(n * sizeof(typename T::Scalar), A);
    }
  };

  struct Scalar {
    template <std::size_t A, typename T>
    static constexpr std::size_t pitch(std::size_t) {
      return roundUp(sizeof(T), A);
    }
  };

}  // namespace soagen_standin

// Each member is a tuple (rule, type, name); the type is one macro argument, so it has no bare comma.
#define SOA_COLUMN(TYPE, NAME) (::soagen_standin::Column, TYPE, NAME)
#define SOA_EIGEN_COLUMN(TYPE, NAME) (::soagen_standin::EigenColumn, TYPE, NAME)
#define SOA_SCALAR(TYPE, NAME) (::soagen_standin::Scalar, TYPE, NAME)

#define SOAGEN_STANDIN_PITCH(R, DATA, I, MEMBER) \
  BOOST_PP_COMMA_IF(I)                            \
  BOOST_PP_TUPLE_ELEM(3, 0, MEMBER)::template pitch<ALIGNMENT, BOOST_PP_TUPLE_ELEM(3, 1, MEMBER)>(n)

#define SOAGEN_STANDIN_NAME(R, DATA, I, MEMBER) \
  BOOST_PP_COMMA_IF(I) BOOST_PP_STRINGIZE(BOOST_PP_TUPLE_ELEM(3, 2, MEMBER))

#define SOAGEN_STANDIN_OFFSET_OF(R, DATA, I, MEMBER)                                   \
  static constexpr std::size_t BOOST_PP_CAT(offsetOf_, BOOST_PP_TUPLE_ELEM(3, 2, MEMBER))( \
      std::size_t n) {                                                                   \
    return offsets(n)[I];                                                                \
  }

#define SOAGEN_STANDIN_LAYOUT(CLASS, MEMBERS)                                                      \
  template <std::size_t ALIGNMENT = 128, bool ALIGNMENT_ENFORCEMENT = false>                        \
  struct CLASS {                                                                                    \
    static constexpr std::size_t alignment = ALIGNMENT;                                             \
    static constexpr std::size_t memberCount = BOOST_PP_SEQ_SIZE(MEMBERS);                          \
    static constexpr std::array<std::string_view, memberCount> memberNames{                         \
        {BOOST_PP_SEQ_FOR_EACH_I(SOAGEN_STANDIN_NAME, ~, MEMBERS)}};                               \
    static constexpr std::array<std::size_t, memberCount> pitches(std::size_t n) {                  \
      return {{BOOST_PP_SEQ_FOR_EACH_I(SOAGEN_STANDIN_PITCH, ~, MEMBERS)}};                        \
    }                                                                                               \
    /* Each member starts where the previous one ends. */                                           \
    static constexpr std::array<std::size_t, memberCount> offsets(std::size_t n) {                  \
      std::array<std::size_t, memberCount> result{};                                                \
      std::size_t position = 0;                                                                     \
      for (std::size_t i = 0; i < memberCount; ++i) {                                               \
        result[i] = position;                                                                       \
        position += pitches(n)[i];                                                                  \
      }                                                                                             \
      return result;                                                                                \
    }                                                                                               \
    static constexpr std::size_t computeDataSize(std::size_t n) {                                   \
      return offsets(n)[memberCount - 1] + pitches(n)[memberCount - 1];                             \
    }                                                                                               \
    BOOST_PP_SEQ_FOR_EACH_I(SOAGEN_STANDIN_OFFSET_OF, ~, MEMBERS)                                  \
  };

#define GENERATE_SOA_LAYOUT(CLASS, ...) SOAGEN_STANDIN_LAYOUT(CLASS, BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__))
