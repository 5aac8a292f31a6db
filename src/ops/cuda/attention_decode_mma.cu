// Path mode (attention.h) on the tensor cores, for fp16 K/V (DeviceAttnMask::path_tensor_cores): one-token
// decode, chain verify (a causal block of up to 32 queries without a window) and trees of up to 128 nodes. A
// verify's queries share the K/V tiles of their prefix, where attention_decode.cu's float32 kernel walks the
// prefix once per query; every row's sums still run in an order fixed by its own visible keys and the split
// count, so a verify query's output equals the one-token decode's at its position bit for bit.
//
// Blocks (x, y) = (row block and key split, KV head). Rows are (query, head-of-group) pairs of one KV head,
// query-major (row g: query g / group, head kv_head * group + g % group), 16 an m-tile, MT m-tiles a block.
// Warps: 2 groups of MT, warp (group, t) owns m-tile t's rows for the tiles k = group (mod 2) of the split
// (and for MT = 1, a decode, two more warps that only issue copies).
//
// Where a call's rows take several row blocks (a verify of 16 or 23 queries of the 27B shape: 6 or 9 m-tiles of 4 a
// block), one block a (split, KV head) takes the row blocks one after another (the RES form): one wave of blocks
// where there were row_blocks waves (each block fills an SM), a row block's Q loaded in one go, and a split whose
// keys the ring holds whole (up to 4 tiles a group) copied once for all the row blocks; a longer split is streamed
// again (from the L2) for each row block.
//
// A row's keys are split as the float32 kernel splits them: its visible keys kend (the prefix and its path:
// n_prefix + depth + 1), keys per split kps = decode_keys_per_split(kend, n_splits, BN), split s = keys
// [s kps, min((s + 1) kps, kend)) in tiles of BN (32; 16 at head_dim 256). Queries of a block with the same
// kps (in practice all of them, or two classes where a chain straddles a rounding step) share the tiles: one
// pass of the split per class, rows of other classes masked.
//
// A pass streams its tiles through a ring of shared-memory stages by cp.async (rows padded by 16 bytes for
// ldmatrix; two threads a row, so that a warp's requests are whole 32-byte sectors), a round of two tiles (one
// a group) at a time, and per tile each warp with an active row:
//   1. S = Q K^T: mma.sync m16n8k16 (Q staged once as f16, times scale * log2(e); K as stored), f32 sums;
//   2. keys past a row's own end (or of another class) masked to -inf; online softmax in f32 per row (the 4
//      threads of a quad share a row): running max m, correction 2^(m_old - m_new) (exactly 1 when the max
//      does not move), p = 2^(s - m_new), a per-thread partial of the sum l;
//   3. O = O * corr + P V, P rounded to f16 from the S accumulators, V's fragments by ldmatrix.trans.
// A tile with no visible key for a row leaves that row's (m, l, O) bit for bit as they were (corr 1, p 0,
// zero products), so a row's result depends on its own tiles only; stage rows past a pass's keys are zeros.
//
// Trees: keys below n_prefix are every node's, keys past it the node's path (key n_prefix + d: its ancestor
// at depth d). A split of prefix keys only ((s + 1) kps <= n_prefix) is walked by the row blocks, its tiles
// shared by all nodes; a split that reaches past the prefix and holds keys of node i by node i's own block
// (after the row blocks in x, for the few splits that can), its path gathered, so no block walks the nodes
// one after another. Chains need no gather (slot d is the path's depth d): row blocks walk every split.
//
// Group 1 then hands its rows' (m, l, O) to group 0 (in shared memory: the ring's, or in the RES form the Q
// rows', half of O's columns at a time), which combines the two in group order (one rounding, combine_terms) and
// writes O / l (one split) or the partial (O, m, l) that attention.cu's merge_kernel combines.
// Precision: q, p rounded to f16 (k and v are fp16 already), f32 products and sums (attention_test's bound).
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/attention_internal.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_f16.cuh"

namespace dflash::cuda::attn_decode {
namespace {

constexpr int kTileGroups = 2;  // tile k of a split goes to warp group k % 2

constexpr size_t align16(size_t b) { return (b + 15) / 16 * 16; }

// RES: a block takes one split of every row block in turn (see the header); group 1's sums pass to group 0
// through the Q rows in two halves of columns, so that the ring keeps its keys.
template <int HD, int MT, bool RES = false>
struct MmaShape {
  static constexpr int BN = HD >= 256 ? 16 : 32;  // keys a tile (the float32 kernel's tile: same splits)
  static constexpr int LD = HD + 8;               // halves a shared row: +16 bytes, conflict-free ldmatrix
  static constexpr int kComputeWarps = kTileGroups * MT;
  // A block of one m-tile (decode) has two more warps that only issue the K/V copies, so that the two
  // computing warps never wait on the copy queue.
  static constexpr int kCopyWarps = MT == 1 ? 2 : 0;
  static constexpr int kThreads = 32 * (kComputeWarps + kCopyWarps);
  static constexpr int kCopyThreads = kCopyWarps > 0 ? 32 * kCopyWarps : kThreads;
  static constexpr int kRows = 16 * MT;
  static constexpr int kMaxQ = kRows + 1;                   // queries a block's rows can belong to
  static constexpr size_t kStageBytes = 2 * 2 * BN * LD;    // K rows, then V rows, f16
  // Group 1's O (RES: half its columns) for group 0, rows kCombLd floats apart (8 more than the columns: a
  // half-warp's float2 stores of 4 quads' rows fall in distinct banks), then (m, l) a row.
  static constexpr int kCombLd = HD / (RES ? 2 : 1) + 8;
  static constexpr size_t kCombineBytes = sizeof(float) * kRows * (kCombLd + 2);
  static constexpr size_t kQBytes = align16(RES ? std::max<size_t>(2 * kRows * LD, kCombineBytes)  // f16 [kRows][LD]
                                                : 2 * kRows * LD);
  static constexpr size_t kInfoBytes = 2 * 8 * kMaxQ + 4 * kMaxPathQueries;  // kend, kps; a tree's parents
  static constexpr size_t kPathBytes = kMaxPathQueries;  // uint8 [128]: a node block's path
  static constexpr int kTabChunks = 64;  // a pass's chunk pointers staged in shared memory, up to 64 chunks
  static constexpr size_t kTabBytes = 2 * kTabChunks * sizeof(void*);  // [K, V][kTabChunks]
  static constexpr size_t kFixed = kQBytes + align16(kInfoBytes) + kPathBytes + kTabBytes;
  // Rounds in the ring: 3 where they fit beside two blocks an SM, else 2. (A deeper RES ring that holds a
  // 4096-key split of the 27B whole, 205 KB a block, ran faster alone but slowed the recorded verify step: the
  // largest shared-memory carveout cost ~0.4 ms a step, as it did forced onto this kernel; docs/benchmarks.md.)
  static constexpr int kRounds = kFixed + 3 * kTileGroups * kStageBytes <= 113 * 1024 ? 3 : 2;
  static constexpr size_t kRingBytes = RES ? size_t{kRounds} * kTileGroups * kStageBytes
                                           : std::max(size_t{kRounds} * kTileGroups * kStageBytes, kCombineBytes);
  static constexpr size_t kQ = 0;
  static constexpr size_t kInfo = kQBytes;
  static constexpr size_t kPath = kInfo + align16(kInfoBytes);
  static constexpr size_t kTab = kPath + kPathBytes;
  static constexpr size_t kRing = kTab + kTabBytes;
  static constexpr size_t kBytes = kRing + kRingBytes;
  static_assert(HD % 16 == 0 && BN % 16 == 0 && kBytes <= 227 * 1024);
  static_assert(kRows * (HD / 4) % kThreads == 0);
};

// o * f0 + c * f1 in one fixed rounding (no contraction left to the compiler): both forms of the combine below
// use it, so a verify's row equals its decode's whichever form wrote it.
__device__ __forceinline__ float combine_terms(float o, float f0, float c, float f1) {
  return __fmaf_rn(c, f1, __fmul_rn(o, f0));
}

template <int HD, int MT, bool RES>
__global__ void __launch_bounds__(MmaShape<HD, MT, RES>::kThreads, 1) decode_mma_kernel(const Params p) {
  pdl_begin();
  using S = MmaShape<HD, MT, RES>;
  constexpr int BN = S::BN, LD = S::LD, kThreads = S::kThreads, kMaxQ = S::kMaxQ;
  extern __shared__ uint4 smem_u4[];
  char* smem = reinterpret_cast<char*>(smem_u4);
  __half* q_s = reinterpret_cast<__half*>(smem + S::kQ);
  int64_t* kend_s = reinterpret_cast<int64_t*>(smem + S::kInfo);  // [kMaxQ]: visible keys of the query
  int64_t* kps_s = kend_s + kMaxQ;                                  // [kMaxQ]: its keys per split
  int32_t* par_s = reinterpret_cast<int32_t*>(kps_s + kMaxQ);       // [n_q]: a tree's parents
  uint8_t* path_s = reinterpret_cast<uint8_t*>(smem + S::kPath);    // [128]: a node's slot at depth d
  const float** tab_s = reinterpret_cast<const float**>(smem + S::kTab);  // [K, V][kTabChunks]
  char* ring = smem + S::kRing;
  const uint32_t q_base = smem_u32(q_s), ring_base = smem_u32(ring);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = warp / MT, mt = warp % MT;
  const int kvh = blockIdx.y;
  // Row and block indices fit 32 bits (at most 32 or 128 queries of 64 heads; the launch checks the grid):
  // cheap divisions, a short kernel.
  const int g_size = p.group, n_rows_kv = static_cast<int>(p.n_q) * g_size;
  // Blocks x < row_blocks * n_splits (RES: x < n_splits): (row block, split), x-major in splits (RES: split x
  // of every row block, one after another). Then, for a tree, node blocks (node, split node_split0 + t) for
  // t < node_splits: one node's rows.
  const int row_blocks = (n_rows_kv + S::kRows - 1) / S::kRows, bx = static_cast<int>(blockIdx.x);
  const int row_block_xs = (RES ? 1 : row_blocks) * p.n_splits;
  const bool node_block = bx >= row_block_xs;
  int split, row0, n_groups = 1, node_t = 0;
  if (!node_block) {
    split = bx % p.n_splits;
    row0 = bx / p.n_splits * S::kRows;
    if (RES) n_groups = row_blocks;
  } else {
    const int t = bx - row_block_xs;
    node_t = t % p.node_splits;
    split = p.node_split0 + node_t;  // node_split0 < 0: counted from the node's first split past the prefix (below)
    row0 = t / p.node_splits * g_size;
  }
  int64_t n_prefix = p.n_prefix, n_tokens = p.n_tokens;
  if (p.lengths != nullptr) {
    n_prefix = p.lengths[0];
    n_tokens = p.lengths[1];
  }
  const float scale_log2 = p.scale * 1.4426950408889634f;
  if (p.tree) {
    for (int e = tid; e < p.n_q; e += kThreads) par_s[e] = p.parents[e];
    __syncthreads();
  }
  // RES: the keys [res_kb, res_ke) a pass left in the ring whole (none: res_ke < 0), which a later row block's
  // pass of the same keys reads again without copying them.
  int32_t res_kb = 0, res_ke = -1;  // 32 bits: registers are short here; keys past 2^31 are never kept

  // Row blocks one after another (RES), else this block's one.
#pragma unroll 1
  for (int rg = 0; rg < n_groups; ++rg, row0 += S::kRows) {
    if (rg > 0) __syncthreads();  // the last row block's combine is read, and its kend_s / kps_s
    const int row_end = node_block ? row0 + g_size : std::min(row0 + S::kRows, n_rows_kv);
    const int q_lo = row0 / g_size;
    const int nq = (row_end - 1) / g_size - q_lo + 1;

    // Q rows * scale * log2(e) (zeros past row_end), stored to shared memory as f16: scores come out in base-2
    // units. Loaded now and stored behind the first pass's K/V copies; RES: stored now (held across the pass
    // set-up, the loads spilled in a loop over row blocks; a later row block's keys are often in the ring already).
    constexpr int kQLoads = S::kRows * (HD / 4) / kThreads;
    auto load_q = [&](int u) {
      const int e = tid + u * kThreads, r = e / (HD / 4), c4 = e % (HD / 4);
      const int g = row0 + r;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (g < row_end)
        v = *reinterpret_cast<const float4*>(
            p.q + (static_cast<int64_t>(g / g_size) * p.n_heads + kvh * g_size + g % g_size) * HD + 4 * c4);
      return v;
    };
    auto put_q = [&](int u, float4 v) {
      const int e = tid + u * kThreads, r = e / (HD / 4), c4 = e % (HD / 4);
      *reinterpret_cast<uint2*>(q_s + r * LD + 4 * c4) =
          make_uint2(pack_half2(v.x * scale_log2, v.y * scale_log2), pack_half2(v.z * scale_log2, v.w * scale_log2));
    };
    float4 qv[RES ? 1 : kQLoads];
    bool q_stored = RES;
    if constexpr (RES) {
      float4 t[kQLoads];
#pragma unroll
      for (int u = 0; u < kQLoads; ++u) t[u] = load_q(u);
#pragma unroll
      for (int u = 0; u < kQLoads; ++u) put_q(u, t[u]);
    } else {
#pragma unroll
      for (int u = 0; u < kQLoads; ++u) qv[u] = load_q(u);
    }
    auto store_q = [&] {
      if constexpr (!RES) {
#pragma unroll
        for (int u = 0; u < kQLoads; ++u) put_q(u, qv[u]);
      }
      q_stored = true;
    };

    // Each query's visible keys and keys per split; a tree node's path (its depth from the parents, staged).
    for (int qi = tid; qi < nq; qi += kThreads) {
      const int64_t i = q_lo + qi;
      int64_t depth = i;
      if (p.tree) {  // a malformed parent (parents[a] >= a) ends the walk rather than loop
        depth = 0;
        for (int64_t a = i; par_s[a] >= 0 && par_s[a] < a; a = par_s[a]) ++depth;
        int64_t d = depth;
        for (int64_t a = i; node_block; a = par_s[a]) {  // only a node block gathers a path (its one node's)
          path_s[d] = static_cast<uint8_t>(a);
          if (d-- == 0) break;
        }
      }
      const int64_t kend = std::min<int64_t>(n_tokens, n_prefix + depth + 1);
      kend_s[qi] = kend;
      kps_s[qi] = decode_keys_per_split(kend, p.n_splits, BN);
    }
    __syncthreads();
    // Trees: a split of only prefix keys for a node ((split + 1) kps <= n_prefix) is walked by the row blocks,
    // its tiles shared by every node; a split that reaches past the prefix and holds some of the node's keys,
    // by the node's own block, its path gathered. Row blocks write the rest (empty splits: zeros).
    auto node_owned = [&](int qi) {
      return p.tree && (split + 1) * kps_s[qi] > n_prefix && split * kps_s[qi] < kend_s[qi];
    };
    if (node_block && p.node_split0 < 0) {  // lengths read here: the node's splits from the one holding key n_prefix
      split = static_cast<int>(n_prefix / kps_s[0]) + node_t;
      if (split >= p.n_splits) return;
    }
    if (node_block && !node_owned(0)) return;  // the whole block: before any other barrier

    // This thread's C-fragment rows (quad and quad + 8 of its warp's m-tile) as block queries (-1: none).
    const int quad = lane >> 2, qc = lane & 3;
    const int ra = mt * 16 + quad;
    const int qa = row0 + ra < row_end ? (row0 + ra) / g_size - q_lo : -1;
    const int qb = row0 + ra + 8 < row_end ? (row0 + ra + 8) / g_size - q_lo : -1;
    // ldmatrix: lane L addresses row (L & 7) of matrix L >> 3 (fragment layouts as in attention_mma.cu).
    const int lm_row = lane & 7, lm_mat = lane >> 3;
    const uint32_t q_addr = q_base + 2u * static_cast<uint32_t>((mt * 16 + lm_row + ((lm_mat & 1) << 3)) * LD +
                                                                ((lm_mat >> 1) << 3));
    const uint32_t k_off = 2u * static_cast<uint32_t>((lm_row + ((lm_mat >> 1) << 3)) * LD + ((lm_mat & 1) << 3));
    const uint32_t v_off = 2u * static_cast<uint32_t>((lm_row + ((lm_mat & 1) << 3)) * LD + ((lm_mat >> 1) << 3));

    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

    // Copy roles (the copy warps', or every thread's): a round is 2 tiles of BN K rows and BN V rows; four
    // threads a row, each taking every fourth 16-byte piece (a warp's request covers whole 32-byte sectors of 8
    // rows), kRowsPerThread rows a thread. Four beat two and eight at every shape measured (docs/benchmarks.md,
    // twenty-ninth session: one query at 32768 keys, head_dim 128 64.5 -> 55.7 us, 256 68.8 -> 56.6 us).
    constexpr int kCopyThreads = S::kCopyThreads, kRoundRows = 2 * 2 * BN, kPieces = HD / 8, kTpr = 4;
    static_assert(kPieces % kTpr == 0);
    constexpr int kRowStep = kCopyThreads / kTpr, kRowsPerThread = (kRoundRows + kRowStep - 1) / kRowStep;
    const int ct = tid - (kThreads - kCopyThreads);  // copy thread index (< 0: none)
    const bool computes = warp < S::kComputeWarps;

    // One pass a class of queries (equal keys per split), in increasing kps.
    for (int64_t cur = 0;;) {
      int64_t next = LLONG_MAX;
      for (int qi = 0; qi < nq; ++qi)
        if (kps_s[qi] > cur) next = std::min(next, kps_s[qi]);
      if (next == LLONG_MAX) break;
      cur = next;
      const int64_t kb = split * cur;
      if (p.tree && !node_block && kb + cur > n_prefix) continue;  // the node blocks' split (or an empty one)
      int64_t ke_max = kb;
      for (int qi = 0; qi < nq; ++qi)
        if (kps_s[qi] == cur) ke_max = std::max(ke_max, std::min(kend_s[qi], kb + cur));
      // RES: the ring already holds these keys whole (a row block's pass before this one copied them).
      const bool resident = RES && !node_block && kb == res_kb && ke_max == res_ke;
      // The chunk pointers of keys [kb, ke_max), staged once (a tree node's keys past the prefix may lie past
      // them: those are read from the table in global memory).
      auto chunk_of = [&](int64_t j) { return j >> p.chunk_shift; };  // chunks of a power of two (launch_mma)
      const int64_t c0 = chunk_of(kb);
      const int64_t n_span = ke_max > kb && !resident ? chunk_of(ke_max - 1) - c0 + 1 : 0;
      const int n_tab = n_span <= S::kTabChunks ? static_cast<int>(n_span) : 0;
      for (int e = tid; e < 2 * n_tab; e += kThreads)
        tab_s[e / n_tab * S::kTabChunks + e % n_tab] = (e < n_tab ? p.k_chunks : p.v_chunks)[c0 + e % n_tab];
      __syncthreads();  // tab_s; and the previous pass's ring is free
      if (ke_max <= kb) continue;
      const int n_tiles = static_cast<int>((ke_max - kb + BN - 1) / BN);
      const int n_items = (n_tiles + 1) / 2;  // rounds of two tiles
      if (RES && !node_block) {
        res_kb = static_cast<int32_t>(kb);
        res_ke = n_items <= S::kRounds && ke_max <= INT32_MAX ? static_cast<int32_t>(ke_max) : -1;
      }
      // The thread's rows' key ends in this pass (kb: the row is of another class, or of no query).
      const int64_t pe_a = qa >= 0 && kps_s[qa] == cur ? std::min(kend_s[qa], kb + cur) : kb;
      const int64_t pe_b = qb >= 0 && kps_s[qb] == cur ? std::min(kend_s[qb], kb + cur) : kb;
      // Decode (copy warps): a round's tile g is "whole" when all its keys are below ke_max, contiguous (not a tree
      // node's path) and in one chunk that tab_s holds; then its K and V rows lie kv_row_bytes apart from one base
      // each, found once a round. Other tiles, and every tile where all threads copy and compute (MT > 1, whose
      // registers the bases would take), go row by row: a chunk lookup a row and zeros past ke_max. That cost the
      // copy warps about 1,000 instructions a round: at 32768 keys the compute warps waited at the round's
      // barrier for the copy warps' address arithmetic, not for the data (docs/benchmarks.md, fortieth session).
      const uint32_t kv_row_bytes = 2u * static_cast<uint32_t>(p.n_kv_heads) * HD;
      auto issue = [&](int r) {
        if (ct < 0) return;
        const int64_t ke = ke_max;
        const uint32_t slot = static_cast<uint32_t>(r % S::kRounds) * kTileGroups;
        const char* whole[2][2];  // [tile g][K, V]: the tile's first row, or nullptr
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          whole[g][0] = whole[g][1] = nullptr;
          const int k = 2 * r + g;
          const int64_t j0 = kb + static_cast<int64_t>(k) * BN;
          if (S::kCopyWarps > 0 && k < n_tiles && j0 + BN <= ke && !(node_block && j0 + BN > n_prefix)) {
            const int64_t ch = chunk_of(j0), tc = ch - c0;
            if (chunk_of(j0 + BN - 1) == ch && tc >= 0 && tc < n_tab) {
              const int64_t off = 2 * (((j0 - ch * p.chunk_tokens) * p.n_kv_heads + kvh) * HD);
              whole[g][0] = reinterpret_cast<const char*>(tab_s[tc]) + off;
              whole[g][1] = reinterpret_cast<const char*>(tab_s[S::kTabChunks + tc]) + off;
            }
          }
        }
        // Rows kU at a time (unrolled), so that a thread's many rows hold few addresses at once (no spills).
        constexpr int kU = kRowsPerThread < 4 ? kRowsPerThread : 4;
        static_assert(kRowsPerThread % kU == 0);
#pragma unroll 1
        for (int ri0 = 0; ri0 < kRowsPerThread; ri0 += kU)
#pragma unroll
        for (int ri = ri0; ri < ri0 + kU; ++ri) {
          const int row = ct / kTpr + ri * kRowStep;
          if (kRoundRows % kRowStep != 0 && row >= kRoundRows) break;
          const int g = row / (2 * BN), kv = row / BN % 2, t = row % BN;
          const int k = 2 * r + g;
          if (k >= n_tiles) continue;
          if constexpr (S::kCopyWarps > 0) {
            const char* w = g == 0 ? (kv == 0 ? whole[0][0] : whole[0][1]) : (kv == 0 ? whole[1][0] : whole[1][1]);
            if (w != nullptr) {
              const uint32_t dst =
                  ring_base + (slot + g) * static_cast<uint32_t>(S::kStageBytes) + (kv * BN + t) * LD * 2;
              const char* src = w + t * kv_row_bytes;
              for (int c = ct % kTpr; c < kPieces; c += kTpr) cp_async16(dst + 16 * c, src + 16 * c);
              continue;
            }
          }
          const int64_t j = kb + static_cast<int64_t>(k) * BN + t;
          const bool valid = j < ke;
          const char* src = reinterpret_cast<const char*>(p.q);  // any global address: not read when !valid
          if (valid) {  // key j's row of this KV head (a tree node's keys past the prefix: its path)
            const int64_t pj = node_block && j >= n_prefix ? n_prefix + path_s[j - n_prefix] : j;
            const int64_t ch = chunk_of(pj), tc = ch - c0;
            const float* base =
                tc >= 0 && tc < n_tab ? tab_s[kv * S::kTabChunks + tc] : (kv == 0 ? p.k_chunks : p.v_chunks)[ch];
            src = reinterpret_cast<const char*>(base) + 2 * (((pj - ch * p.chunk_tokens) * p.n_kv_heads + kvh) * HD);
          }
          char* dst = ring + (slot + g) * S::kStageBytes + (kv * BN + t) * LD * 2;
          for (int c = ct % kTpr; c < kPieces; c += kTpr)
            cp_async16_zfill(dst + 16 * c, src + (valid ? 16 * c : 0), valid);
        }
      };
      // Step st issues item st and computes item st - (kRounds - 1) (one call site each: a short kernel).
#pragma unroll 1
      for (int st = 0; st < n_items + S::kRounds - 1; ++st) {
        const int it = st - (S::kRounds - 1);
        if (it >= 0) {
          cp_async_wait<S::kRounds - 2>();  // this thread's copies of item it have landed
          __syncthreads();                  // everyone's have; and every warp is done with item it - 1's stages
        }
        if (st < n_items && !resident) issue(st);
        cp_async_commit();
        if (it < 0) {
          if (it == -1 && !q_stored) store_q();  // read after item 0's barrier
          continue;
        }
        const int k = 2 * it + group;
        if (!computes || k >= n_tiles) continue;
        const int64_t j0 = kb + static_cast<int64_t>(k) * BN;
        if (!__any_sync(0xffffffffu, pe_a > j0 || pe_b > j0)) continue;  // no row of the m-tile sees this tile
        const uint32_t kbuf =
            ring_base + static_cast<uint32_t>((it % S::kRounds) * kTileGroups + group) * S::kStageBytes;
        const uint32_t vbuf = kbuf + 2u * BN * LD;

        // 1. S = Q K^T; 2. keys past each row's end masked, online softmax; 3. O += P V.
        float s[BN / 8][4];
        qk_tile<HD, BN>(s, q_addr, kbuf + k_off, LD);
        const int ne_a = static_cast<int>(std::min<int64_t>(BN, std::max<int64_t>(0, pe_a - j0)));
        const int ne_b = static_cast<int>(std::min<int64_t>(BN, std::max<int64_t>(0, pe_b - j0)));
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (n * 8 + 2 * qc + (e & 1) >= (e < 2 ? ne_a : ne_b)) s[n][e] = -INFINITY;
        online_softmax<HD, BN>(s, m_a, m_b, l_a, l_b, o);
        pv_tile<HD, BN>(s, o, vbuf + v_off, LD);
      }
      cp_async_wait<0>();  // nothing outstanding, and (barrier) every warp done with the ring and tab_s
      __syncthreads();
    }

    // Row sums over the quad; group 1 hands (m, l, O) to group 0, which combines them in group order: through
    // the ring, or (RES) through the Q rows, half of O's columns at a time, so that the ring keeps its keys.
#pragma unroll
    for (int w = 1; w <= 2; w <<= 1) {
      l_a += __shfl_xor_sync(0xffffffffu, l_a, w);
      l_b += __shfl_xor_sync(0xffffffffu, l_b, w);
    }
    constexpr int kHalves = RES ? 2 : 1, kDs = HD / 8 / kHalves;
    constexpr int kLdc = S::kCombLd;
    float* comb_o = reinterpret_cast<float*>(RES ? smem + S::kQ : ring);  // [kRows][kLdc]
    float* comb_ml = comb_o + S::kRows * kLdc;                            // [kRows][2]
    // Row ra + 8 half's combined max M and sum L, and the weights of group 0's and group 1's sums (recomputed
    // where used rather than held across the barriers: held, they pushed the RES form into spills).
    auto weights = [&](int half, float& big_m, float& f0, float& f1, float& big_l) {
      const int r = ra + 8 * half;
      const float m0 = half ? m_b : m_a, l0 = half ? l_b : l_a;
      const float m1 = comb_ml[2 * r], l1 = comb_ml[2 * r + 1];
      big_m = fmaxf(m0, m1);
      f0 = m0 == big_m ? 1.0f : fast_exp2(m0 - big_m);
      f1 = m1 == big_m ? 1.0f : fast_exp2(m1 - big_m);
      big_l = l0 * f0 + l1 * f1;
    };
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      if (h > 0) __syncthreads();  // group 0 has read the first half
      if (group == 1) {
#pragma unroll
        for (int d = 0; d < kDs; ++d) {
          const int dd = h * kDs + d;
          *reinterpret_cast<float2*>(comb_o + ra * kLdc + 8 * d + 2 * qc) = make_float2(o[dd][0], o[dd][1]);
          *reinterpret_cast<float2*>(comb_o + (ra + 8) * kLdc + 8 * d + 2 * qc) = make_float2(o[dd][2], o[dd][3]);
        }
        if (h == 0 && qc == 0) {
          comb_ml[2 * ra] = m_a;
          comb_ml[2 * ra + 1] = l_a;
          comb_ml[2 * (ra + 8)] = m_b;
          comb_ml[2 * (ra + 8) + 1] = l_b;
        }
      }
      __syncthreads();
      if (group != 0) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = ra + 8 * half;
        float big_m, f0, f1, big_l;
        weights(half, big_m, f0, f1, big_l);
#pragma unroll
        for (int d = 0; d < kDs; ++d) {
          const int dd = h * kDs + d;
          const float2 c = *reinterpret_cast<const float2*>(comb_o + r * kLdc + 8 * d + 2 * qc);
          o[dd][2 * half] = combine_terms(o[dd][2 * half], f0, c.x, f1);
          o[dd][2 * half + 1] = combine_terms(o[dd][2 * half + 1], f0, c.y, f1);
        }
      }
    }
    if (group != 0) continue;  // group 1, and the copy warps (the next row block's barrier waits for them)
    const int64_t n_rows = p.n_q * p.n_heads;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int g = row0 + ra + 8 * half;
      if (g >= row_end || (!node_block && node_owned(g / g_size - q_lo))) continue;
      const int64_t row = static_cast<int64_t>(g / g_size) * p.n_heads + kvh * g_size + g % g_size;
      float big_m, f0, f1, big_l;
      weights(half, big_m, f0, f1, big_l);
      float ov[HD / 8][2];
#pragma unroll
      for (int d = 0; d < HD / 8; ++d) {
        ov[d][0] = o[d][2 * half];
        ov[d][1] = o[d][2 * half + 1];
      }
      store_row<HD>(ov, big_m, big_l, row, qc, split, p.n_splits, n_rows, p.out, p.part_acc, p.part_ml);
    }
  }
}

template <int HD, int MT, bool RES = false>
cudaError_t launch_mt(const Params& p, cudaStream_t stream) {
  using S = MmaShape<HD, MT, RES>;
  if (const cudaError_t err = allow_dynamic_smem<decode_mma_kernel<HD, MT, RES>>(S::kBytes); err != cudaSuccess)
    return err;
  // A tree's node blocks: the splits that can reach past the prefix for some node, from the longest keys per
  // split (the deepest node) to the last split holding keys at the shortest.
  Params q = p;
  q.node_split0 = 0;
  q.node_splits = 0;
  if (p.tree && p.lengths != nullptr) {
    // Lengths known only on the device: each node's splits counted from its first past the prefix there. A node
    // owns the splits from floor(n_prefix / kps) to floor((n_prefix + depth) / kps): at most depth / BN + 2 of
    // them (kps >= BN), and depth <= n_q - 1.
    q.node_split0 = -1;
    q.node_splits = static_cast<int32_t>(std::min<int64_t>(p.n_splits, (p.n_q - 1) / S::BN + 2));
  } else if (p.tree && p.n_q > 0) {
    const int64_t kend_lo = std::min<int64_t>(p.n_tokens, p.n_prefix + 1);
    const int64_t kend_hi = std::min<int64_t>(p.n_tokens, p.n_prefix + p.n_q);
    const int64_t kps_lo = decode_keys_per_split(kend_lo, p.n_splits, S::BN);
    const int64_t kps_hi = decode_keys_per_split(kend_hi, p.n_splits, S::BN);
    const int64_t s_lo = p.n_prefix / kps_hi;
    const int64_t s_hi = std::min<int64_t>(p.n_splits - 1, (kend_hi + kps_lo - 1) / kps_lo - 1);
    q.node_split0 = static_cast<int32_t>(s_lo);
    q.node_splits = static_cast<int32_t>(std::max<int64_t>(0, s_hi - s_lo + 1));
  }
  const int64_t row_blocks = (p.n_q * p.group + S::kRows - 1) / S::kRows;
  const int64_t blocks = (RES ? 1 : row_blocks) * p.n_splits + p.n_q * q.node_splits;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.n_kv_heads), 1);
  launch_pdl(decode_mma_kernel<HD, MT, RES>, grid, dim3(S::kThreads), S::kBytes, stream, q);
  return cudaGetLastError();
}

// m-tiles a block: the call's rows in one block where they fit, up to 6 (4 at head_dim 256, whose accumulators
// take twice the registers; 8 would spill at 128); a group's heads always fit one (kMmaMaxGroup). More rows: a
// block a split takes the row blocks one after another (RES), each split's keys copied once.
template <int HD>
cudaError_t launch_hd(const Params& p, cudaStream_t stream) {
  if (p.group > kMmaMaxGroup) return cudaErrorInvalidValue;
  const int64_t m_tiles = (p.n_q * p.group + 15) / 16;
  if (m_tiles <= 1) return launch_mt<HD, 1>(p, stream);
  if (m_tiles <= 2) return launch_mt<HD, 2>(p, stream);
  if (m_tiles <= 4) return launch_mt<HD, 4>(p, stream);
  if constexpr (HD >= 256) {
    return launch_mt<HD, 4, true>(p, stream);
  } else {
    if (m_tiles <= 6) return launch_mt<HD, 6>(p, stream);
    return launch_mt<HD, 6, true>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_mma(const Params& p, int head_dim, cudaStream_t stream) {
  if (!p.kv_f16 || p.chunk_shift < 0 || p.n_q > kMaxPathQueries) return cudaErrorInvalidValue;
  switch (head_dim) {
    case 64: return launch_hd<64>(p, stream);
    case 128: return launch_hd<128>(p, stream);
    case 256: return launch_hd<256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace dflash::cuda::attn_decode
