// Test offsets of grouped operands (host side of the library): grouped_gemm's and quantize_fp8's
// (groups) test inputs share them, so that both ops meet the same kinds of groups.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace kiln {

/// Offsets [G + 1] (as floats, the test inputs' type) that split `tokens` rows over G groups
/// unevenly: group g gets a share 1 / (g + 1), shuffled, and every third group is empty when
/// G > 2 (a Zipf-like law of expert loads). offsets[0] = 0, offsets[G] = tokens.
inline std::vector<float> grouped_test_offsets(int64_t G, int64_t tokens, std::mt19937_64& rng) {
  std::vector<double> share(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) share[g] = (G > 2 && g % 3 == 1) ? 0.0 : 1.0 / static_cast<double>(g + 1);
  std::shuffle(share.begin(), share.end(), rng);
  double total = 0;
  for (double x : share) total += x;
  std::vector<int64_t> size(static_cast<size_t>(G), 0);
  int64_t used = 0;
  for (int64_t g = 0; g < G; ++g) {
    size[g] = static_cast<int64_t>(static_cast<double>(tokens) * share[g] / total);
    used += size[g];
  }
  for (int64_t g = 0; used < tokens; g = (g + 1) % G)
    if (share[g] > 0) ++size[g], ++used;
  std::vector<float> off(static_cast<size_t>(G + 1), 0.0f);
  for (int64_t g = 0; g < G; ++g) off[g + 1] = off[g] + static_cast<float>(size[g]);
  return off;
}

}  // namespace kiln
