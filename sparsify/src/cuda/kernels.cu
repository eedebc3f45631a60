// Kernels for sparsify's CUDA path, compiled at run time with NVRTC (no headers needed).
//
// Magnitudes are compared as unsigned integers: for a finite float, bits & 0x7fffffff
// orders like |x|; NaN and infinities map at or above INF_BITS. Every index and count is
// 64-bit, so nothing wraps past 2^32 elements. All selection decisions stay on the device
// in a State struct; the host reads the state once per call and copies only the selected
// (index, value) pairs back.
//
// Passes over the dense vector for every selector: one fused pass (r += g, non-finite
// check, and the entries at or above a lower bound t_low appended, unordered, to a
// candidate buffer with one atomic per warp: 12 bytes per element, vectorised). For exact
// top-k and MSTopK, t_low comes from a strided sample of r + g read before the pass (the
// sample's r_s-th largest value, r_s a few standard deviations above k's share of the
// sample, so at least k entries lie above it with overwhelming probability; the host checks
// and falls back when not). The radix select and MSTopK's rounds then run on the candidates
// only, and the chosen entries are marked in two bitmaps (above the k-th value, and equal to
// it for the ties) that one ordered compaction turns into index-ordered output, reading
// d/16 bytes. The older two-pass path (histogram pass, ordered compaction of the dense
// vector) stays as the fallback.

typedef unsigned int u32;
typedef unsigned long long u64;

#define INF_BITS 0x7f800000u
#define NONE64 0xffffffffffffffffull
#define FULL 0xffffffffu

#define HBINS 2048          // level-0 histogram: magnitude bits 30..20
#define AT 256              // threads of the fused accumulate pass
#define AI 8                // items per thread per accumulate tile
#define CT 256              // threads of the ordered compaction
#define CI 16               // items per thread per compaction tile
#define CTILE (CT * CI)     // elements per compaction tile
#define CWARPS (CT / 32)
#define PT 1024             // threads of the single-block kernels

// Shared with the host (`State` in mod.rs, checked field by field by the layout tests).
struct State {
    u32 a_bits;        // class A: bits >= a_bits (inside the partition)
    u32 b_lo;          // class B: b_lo <= bits < a_bits (inside the partition)
    u64 part_lo;       // classes apply only to dense indices in [part_lo, part_hi)
    u64 part_hi;
    u64 b_start;       // B entries whose rank among B is in [b_start, b_start + b_need)
    u64 b_need;
    u32 prefix;        // radix select: magnitude bits fixed so far
    u32 t_low;         // lower edge of the level-0 bin (candidates are bits >= t_low)
    u64 k_rem;         // radix select: entries still to take at the current prefix
    u64 first_bad;     // smallest index of a NaN/inf (NONE64: none)
    u64 n_cand;        // candidates found (may exceed cand_cap: overflow)
    u64 cand_cap;      // capacity of the candidate buffers
    u64 count;         // entries emitted (may exceed out_cap: overflow)
    u64 out_cap;       // capacity of the output buffers
    u64 total_a;       // class totals of the last compaction
    u64 total_b;
    u64 argmax_key;    // (bits << 32) | (0xffffffff - index) of the partition maximum
    double abs_sum;    // sum of |x| (MSTopK's mean)
    u32 max_bits;      // largest magnitude bits (MSTopK's max)
    u32 t1_bits;       // MSTopK thres1 (0x7fffffff: unset)
    u32 t2_bits;       // MSTopK thres2 (0: unset)
    u32 from_cand;     // MSTopK: 1 when thres2 >= t_low (emit from the candidates)
    u64 k1;            // MSTopK: entries at or above thres1
    u64 len2;          // MSTopK: entries in [thres2, thres1) (from the candidates)
    u64 k_sel;         // entries the selection needs among the candidates (0: no check)
};

__device__ __forceinline__ u32 abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }
__device__ __forceinline__ u64 mn64(u64 a, u64 b) { return a < b ? a : b; }

// Wire rounding (f16, bf16), saturating at the largest finite value like the CPU's
// round_saturating.
__device__ __forceinline__ unsigned short f32_to_f16_sat(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    if ((h & 0x7fffu) == 0x7c00u && abs_bits(v) < INF_BITS) h = (unsigned short)(h - 1);
    return h;
}

__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even exactly as the `half` crate's software bf16::from_f32.
__device__ __forceinline__ unsigned short f32_to_bf16_sat(float v) {
    const u32 x = __float_as_uint(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    unsigned short h = (unsigned short)(x >> 16);
    if ((x & 0x8000u) != 0 && (x & (3u * 0x8000u - 1u)) != 0) h = (unsigned short)(h + 1);
    if ((h & 0x7fffu) == 0x7f80u && abs_bits(v) < INF_BITS) h = (unsigned short)(h - 1);
    return h;
}

// What the finishing step leaves in the residual for an emitted entry of value v, and the
// 16-bit wire value (wire 1: f16, 2: bf16; 0: f32, the entry is zeroed).
__device__ __forceinline__ float finish_one(float v, int wire, unsigned short* h16) {
    if (wire == 0) return 0.0f;
    const unsigned short h = wire == 1 ? f32_to_f16_sat(v) : f32_to_bf16_sat(v);
    const float q = wire == 1 ? f16_to_f32(h) : __uint_as_float((u32)h << 16);
    *h16 = h;
    return __fsub_rn(v, q);
}

// True when the call succeeded so far: no non-finite value, no buffer overflow, and at
// least k_sel candidates (else the host retries and the residual must stay r + g).
__device__ __forceinline__ bool call_ok(const State* s) {
    return s->first_bad == NONE64 && s->count <= s->out_cap && s->n_cand <= s->cand_cap &&
           s->n_cand >= s->k_sel;
}

// Writes the offset of every State field within `s`, in declaration order, then
// sizeof(State) (the layout test on a device).
extern "C" __global__ void state_layout(const State* s, u64* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int i = 0;
#define OFF(f) out[i++] = (u64)((const char*)&s->f - (const char*)s)
    OFF(a_bits); OFF(b_lo); OFF(part_lo); OFF(part_hi); OFF(b_start); OFF(b_need);
    OFF(prefix); OFF(t_low); OFF(k_rem); OFF(first_bad); OFF(n_cand); OFF(cand_cap);
    OFF(count); OFF(out_cap); OFF(total_a); OFF(total_b); OFF(argmax_key); OFF(abs_sum);
    OFF(max_bits); OFF(t1_bits); OFF(t2_bits); OFF(from_cand); OFF(k1); OFF(len2); OFF(k_sel);
#undef OFF
    out[i] = (u64)sizeof(State);
}

// ---------------------------------------------------------------------------------------
// Fused error feedback: r += g (g may be null: read-only), non-finite check, and on demand
// the level-0 histogram (mode & 1) and the |x| statistics (mode & 2). Block-uniform tile
// loop so the warp primitives see every lane.
extern "C" __global__ void __launch_bounds__(AT) ef_accumulate(float* r, const float* g, u64 n,
                                                               State* s, u64* hist, int mode) {
    __shared__ u32 sh[HBINS];
    __shared__ double wsum[AT / 32];
    __shared__ u32 wmax[AT / 32];
    const bool want_hist = (mode & 1) != 0, want_stats = (mode & 2) != 0;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (want_hist)
        for (u32 b = threadIdx.x; b < HBINS; b += AT) sh[b] = 0;
    __syncthreads();
    double sum = 0.0;
    u32 mx = 0;
    u64 bad = NONE64;
    const u64 tile = (u64)AT * AI;
    const u64 tiles = (n + tile - 1) / tile;
    for (u64 t = blockIdx.x; t < tiles; t += gridDim.x) {
        const u64 base = t * tile + threadIdx.x;
        float a[AI];
#pragma unroll
        for (int j = 0; j < AI; j++) {
            u64 e = base + (u64)j * AT;
            a[j] = e < n ? r[e] : 0.0f;
        }
        if (g) {
#pragma unroll
            for (int j = 0; j < AI; j++) {
                u64 e = base + (u64)j * AT;
                if (e < n) {
                    a[j] += g[e];
                    r[e] = a[j];
                }
            }
        }
#pragma unroll
        for (int j = 0; j < AI; j++) {
            const u64 e = base + (u64)j * AT;
            const bool valid = e < n;
            const u32 bits = valid ? abs_bits(a[j]) : 0u;
            if (valid && bits >= INF_BITS && e < bad) bad = e;
            if (want_stats && valid) {
                sum += (double)__uint_as_float(bits);
                mx = max(mx, bits);
            }
            if (want_hist) {
                // Warp-aggregated: one shared atomic per distinct bin in the warp (one in
                // all for the mostly-zero gradients where every lane hits the same bin).
                const u32 bin = valid ? (bits >> 20) : FULL;
                const u32 b0 = __shfl_sync(FULL, bin, 0);
                if (__all_sync(FULL, bin == b0)) {
                    if (lane == 0 && b0 != FULL) atomicAdd(&sh[b0], 32u);
                } else {
                    const u32 peers = __match_any_sync(FULL, bin);
                    if (lane == (u32)(__ffs(peers) - 1) && bin != FULL)
                        atomicAdd(&sh[bin], (u32)__popc(peers));
                }
            }
        }
    }
    if (bad != NONE64) atomicMin(&s->first_bad, bad);
    if (want_stats) {
        for (int o = 16; o > 0; o >>= 1) {
            sum += __shfl_down_sync(FULL, sum, o);
            mx = max(mx, __shfl_down_sync(FULL, mx, o));
        }
        if (lane == 0) {
            wsum[warp] = sum;
            wmax[warp] = mx;
        }
    }
    __syncthreads();
    if (want_stats && threadIdx.x == 0) {
        double bs = 0.0;
        u32 bm = 0;
        for (int w = 0; w < AT / 32; w++) {
            bs += wsum[w];
            bm = max(bm, wmax[w]);
        }
        atomicAdd(&s->abs_sum, bs);
        atomicMax(&s->max_bits, bm);
    }
    if (want_hist)
        for (u32 b = threadIdx.x; b < HBINS; b += AT)
            if (sh[b]) atomicAdd(&hist[b], (u64)sh[b]);
}

// Histogram of the bits below `shift + width` of the candidates whose higher bits equal
// the prefix fixed so far (levels 1 and 2 of the radix select).
extern "C" __global__ void radix_hist(const float* x, u64 cap, const State* s, u64* hist,
                                      int shift, int width) {
    __shared__ u32 sh[HBINS];
    const u32 nb = 1u << width;
    for (u32 b = threadIdx.x; b < nb; b += blockDim.x) sh[b] = 0;
    __syncthreads();
    const u64 n = mn64(cap, s->n_cand);
    const int top = shift + width;
    const u32 pre = s->prefix >> top;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 b = abs_bits(x[i]);
        if ((b >> top) == pre) atomicAdd(&sh[(b >> shift) & (nb - 1)], 1u);
    }
    __syncthreads();
    for (u32 b = threadIdx.x; b < nb; b += blockDim.x)
        if (sh[b]) atomicAdd(&hist[b], (u64)sh[b]);
}

// Block-wide inclusive scan of one u64 per thread (PT threads).
__device__ u64 block_scan_incl(u64 v, u64* wtot) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(FULL, v, o);
        if (lane >= (u32)o) v += y;
    }
    if (lane == 31) wtot[warp] = v;
    __syncthreads();
    if (warp == 0) {
        u64 w = lane < blockDim.x / 32 ? wtot[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const u64 y = __shfl_up_sync(FULL, w, o);
            if (lane >= (u32)o) w += y;
        }
        wtot[lane] = w;
    }
    __syncthreads();
    return v + (warp > 0 ? wtot[warp - 1] : 0);
}

// Parallel bin search (one block of PT threads, two bins each, scanned from the top):
// fixes the bin that holds the k_rem-th largest entry, and zeroes the bins it read. mode 1
// (level 0): the candidates are everything at or above that bin. mode 2 (last level):
// emission classes of exact top-k, A = above the k-th value, B = equal to it (ties: the
// lower indices). mode 3 (last level over the sample): t_low = the value found, and the
// select restarts for k_sel entries over the (not yet filled) candidates.
extern "C" __global__ void __launch_bounds__(PT) radix_pick(u64* hist, State* s, int shift,
                                                            int width, int mode) {
    __shared__ u64 wtot[32];
    const int nb = 1 << width;
    const int hb = nb - 1 - 2 * (int)threadIdx.x, lb = hb - 1;
    const u64 h0 = hb >= 0 ? hist[hb] : 0, h1 = lb >= 0 ? hist[lb] : 0;
    const u64 kr = s->k_rem;
    const u64 incl = block_scan_incl(h0 + h1, wtot);
    const u64 total = wtot[31];
    const u64 excl = incl - h0 - h1;
    int chosen = -1;
    u64 above = 0;
    if (hb >= 0 && excl < kr && excl + h0 >= kr) {
        chosen = hb;
        above = excl;
    } else if (lb >= 0 && excl + h0 < kr && excl + h0 + h1 >= kr) {
        chosen = lb;
        above = excl + h0;
    } else if (total < kr && (hb == 0 || lb == 0)) {
        // Fewer entries than asked for: take everything (bin 0 and above).
        chosen = 0;
        above = total - hist[0];
    }
    __syncthreads();  // every thread has read k_rem and its bins before they change
    // Leave the histogram zeroed for the next level (no memset between levels).
    if (hb >= 0) hist[hb] = 0;
    if (lb >= 0) hist[lb] = 0;
    if (chosen < 0) return;
    const u32 pre = s->prefix | ((u32)chosen << shift);
    s->prefix = pre;
    s->k_rem = kr - above;
    if (mode == 1) {
        s->t_low = pre;
        s->a_bits = pre;
        s->b_lo = pre;
        s->b_start = 0;
        s->b_need = 0;
    } else if (mode == 2) {
        s->a_bits = pre + 1;
        s->b_lo = pre;
        s->b_start = 0;
        s->b_need = kr - above;
    } else if (mode == 3) {
        // The sample's value fixes the candidates' lower bound; the select restarts on them.
        s->t_low = pre;
        s->prefix = 0;
        s->k_rem = s->k_sel;
        s->n_cand = 0;
    }
}

// ---------------------------------------------------------------------------------------
// Ordered compaction with a decoupled look-back scan (one pass, one block per tile, tile
// ids taken in launch order so every predecessor is running or done).

#define FLAG_AGG (1ull << 62)
#define FLAG_PRE (2ull << 62)
#define VAL_MASK (FLAG_AGG - 1)

// Publishes this tile's aggregate, sums the predecessors' until one has its inclusive
// prefix, publishes the inclusive prefix; returns the exclusive prefix (to every lane).
// Called by a whole warp: lane i reads the tile i + 1 places back, so one step covers 32
// predecessors instead of one.
__device__ u64 look_back(u64* st, u64 tile, u64 agg) {
    const u32 lane = threadIdx.x & 31;
    if (tile == 0) {
        if (lane == 0) atomicExch(&st[0], FLAG_PRE | agg);
        return 0;
    }
    if (lane == 0) atomicExch(&st[tile], FLAG_AGG | agg);
    u64 excl = 0;
    long long p = (long long)tile - 1;
    for (;;) {
        const long long at = p - (long long)lane;
        // Past tile 0 reads as an inclusive prefix of zero (tile 0 always publishes one).
        u64 w = at >= 0 ? *((volatile u64*)&st[at]) : FLAG_PRE;
        while (__any_sync(FULL, (w & ~VAL_MASK) == 0)) {
            if ((w & ~VAL_MASK) == 0) {
                __nanosleep(32);
                w = *((volatile u64*)&st[at]);
            }
        }
        const u32 pre = __ballot_sync(FULL, (w & ~VAL_MASK) == FLAG_PRE);
        const u32 upto = pre ? (u32)(__ffs(pre) - 1) : 31u;
        u64 v = lane <= upto ? (w & VAL_MASK) : 0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
        excl += v;
        if (pre) break;
        p -= 32;
    }
    if (lane == 0) atomicExch(&st[tile], FLAG_PRE | (excl + agg));
    return excl;
}

// Emits, in index order, every class-A entry and the class-B entries whose rank among B is
// in the window [b_start, b_start + b_need). Input: x[0..n) with dense index e (xidx null)
// or xidx[e] (candidates, n = min(n_arg, n_cand)). With g: x += g first (fused error
// feedback) and x is written back. target 0: into the candidate buffers (count -> n_cand),
// 1: into the output buffers (count -> count), 2: count only. Writes past the capacity are
// dropped and show as count > capacity. `look`: 1 + 2 * ntiles zeroed words.
extern "C" __global__ void __launch_bounds__(CT) compact(float* x, const float* g, const u32* xidx,
                                                         u64 n_arg, State* s, u64* look, u64 ntiles,
                                                         u32* out_idx, float* out_val, int target) {
    __shared__ u64 sh_tile, sh_ex_a, sh_ex_b, sh_agg_a, sh_agg_b;
    __shared__ u32 cnt_a[CI * CWARPS], cnt_b[CI * CWARPS];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) sh_tile = atomicAdd(&look[0], 1ull);
    __syncthreads();
    const u64 tile = sh_tile;
    const u64 n = xidx ? mn64(n_arg, s->n_cand) : n_arg;
    const u32 a_bits = s->a_bits, b_lo = s->b_lo;
    const u64 plo = s->part_lo, phi = s->part_hi;
    const u64 base = tile * CTILE + threadIdx.x;
    float v[CI];
    u32 ma[CI], mb[CI];
    u64 bad = NONE64;
#pragma unroll
    for (int j = 0; j < CI; j++) {
        const u64 e = base + (u64)j * CT;
        float a = 0.0f;
        int c = 0;
        if (e < n) {
            a = x[e];
            if (g) {
                a += g[e];
                x[e] = a;
            }
            const u32 bits = abs_bits(a);
            const u64 gi = xidx ? (u64)xidx[e] : e;
            if (bits >= INF_BITS && gi < bad) bad = gi;
            if (gi >= plo && gi < phi) c = bits >= a_bits ? 1 : (bits >= b_lo ? 2 : 0);
        }
        v[j] = a;
        ma[j] = __ballot_sync(FULL, c == 1);
        mb[j] = __ballot_sync(FULL, c == 2);
        if (lane == 0) {
            cnt_a[j * CWARPS + warp] = __popc(ma[j]);
            cnt_b[j * CWARPS + warp] = __popc(mb[j]);
        }
    }
    if (bad != NONE64) atomicMin(&s->first_bad, bad);
    __syncthreads();
    // Warp 0 scans the A counts in (row, warp) order = index order, warp 1 the B counts;
    // lane 0 of each then looks back over the preceding tiles.
    if (warp < 2) {
        u32* c = warp == 0 ? cnt_a : cnt_b;
        u64* st = look + 1 + (warp == 0 ? 0 : ntiles);
        u32 q[4];
        u32 local = 0;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            q[t] = c[lane * 4 + t];
            local += q[t];
        }
        u32 incl = local;
        for (int o = 1; o < 32; o <<= 1) {
            const u32 y = __shfl_up_sync(FULL, incl, o);
            if (lane >= (u32)o) incl += y;
        }
        u32 run = incl - local;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            c[lane * 4 + t] = run;
            run += q[t];
        }
        const u32 agg = __shfl_sync(FULL, incl, 31);
        const u64 ex = look_back(st, tile, (u64)agg);
        if (lane == 0) {
            if (warp == 0) {
                sh_ex_a = ex;
                sh_agg_a = agg;
            } else {
                sh_ex_b = ex;
                sh_agg_b = agg;
            }
        }
    }
    __syncthreads();
    const u64 ea = sh_ex_a, eb = sh_ex_b;
    const u64 bstart = s->b_start, bneed = s->b_need;
    const u64 cap = target == 0 ? s->cand_cap : (target == 1 ? s->out_cap : 0);
    u32* oi = out_idx;
    float* ov = out_val;
    const u32 lt = (1u << lane) - 1u;
#pragma unroll
    for (int j = 0; j < CI; j++) {
        const bool is_a = (ma[j] >> lane) & 1u, is_b = (mb[j] >> lane) & 1u;
        if (!(is_a || is_b)) continue;
        const u64 ra = ea + cnt_a[j * CWARPS + warp] + __popc(ma[j] & lt);
        const u64 rb = eb + cnt_b[j * CWARPS + warp] + __popc(mb[j] & lt);
        const u64 b_before = rb > bstart ? mn64(rb - bstart, bneed) : 0;
        const bool take = is_a || (rb >= bstart && rb - bstart < bneed);
        const u64 pos = ra + b_before;
        if (take && pos < cap) {
            const u64 e = base + (u64)j * CT;
            oi[pos] = xidx ? xidx[e] : (u32)e;
            ov[pos] = v[j];
        }
    }
    if (tile == ntiles - 1 && threadIdx.x == 0) {
        const u64 ta = ea + sh_agg_a, tb = eb + sh_agg_b;
        s->total_a = ta;
        s->total_b = tb;
        const u64 cnt = ta + (tb > bstart ? mn64(tb - bstart, bneed) : 0);
        if (target == 0) s->n_cand = cnt;
        else if (target == 1) s->count = cnt;
    }
}

// ---------------------------------------------------------------------------------------
// The one-pass path.

// S strided samples of |r + g| (jittered inside each stride) into out[0..S), read only.
extern "C" __global__ void sample_abs(const float* r, const float* g, u64 n, u64 S, float* out) {
    const u64 stride = n / S;
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < S;
         j += (u64)gridDim.x * blockDim.x) {
        u64 i = j * n / S;
        if (stride > 1) i += (u64)(((u32)j * 2654435761u) >> 7) % stride;
        out[j] = r[i] + (g ? g[i] : 0.0f);
    }
}

#define FT 256   // threads of the fused candidate pass
#define FU 2     // rows of 32 float4 groups per warp and step
#define WBUF 512 // staged candidates per warp (at least twice one step's 32 * FU * 4)

// One warp moves its `m` staged candidates to the global buffer: one atomicAdd reserves
// the range; entries past the capacity are dropped (n_cand still counts them).
__device__ __forceinline__ void flush_staged(State* s, u32* cidx, float* cval, u64 cap,
                                             const u32* si, const float* sv, u32 m, u32 lane) {
    u64 base = 0;
    if (lane == 0) base = atomicAdd(&s->n_cand, (u64)m);
    base = __shfl_sync(FULL, base, 0);
    for (u32 i = lane; i < m; i += 32) {
        if (base + i < cap) {
            cidx[base + i] = si[i];
            cval[base + i] = sv[i];
        }
    }
    __syncwarp();
}

__device__ __forceinline__ bool is_cand(u32 bits, u64 e, u32 t_low, u64 plo, u64 phi) {
    return bits >= t_low && e >= plo && e < phi;
}

// Fused error feedback and candidate emission: r += g (g null: read only, nothing
// written), non-finite check, every entry with bits >= t_low inside [part_lo, part_hi)
// appended to (cidx, cval) in no particular order (one atomicAdd per warp that has any;
// n_cand counts past cand_cap and the host retries), and with mode & 2 the |x| statistics.
// `vec`: r and g are 16-byte aligned, so the body uses float4 loads and stores.
extern "C" __global__ void __launch_bounds__(FT, 4) ef_candidates(float* r, const float* g, u64 n,
                                                                  State* s, u32* cidx, float* cval,
                                                                  int mode, int vec) {
    __shared__ double wsum[FT / 32];
    __shared__ u32 wmax[FT / 32];
    // Per-warp staging of candidates: a warp flushes to the global buffer with one atomic
    // per WBUF / 2 or more entries, so dense selections do not serialise on n_cand.
    __shared__ u32 sidx[FT / 32][WBUF];
    __shared__ float sval[FT / 32][WBUF];
    const bool want_stats = (mode & 2) != 0;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 t_low = s->t_low;
    const u64 plo = s->part_lo, phi = s->part_hi, cap = s->cand_cap;
    u32 staged = 0;  // warp-uniform
    double sum = 0.0;
    u32 mx = 0;
    u64 bad = NONE64;
    const u64 nq = (n + 3) / 4;                       // groups of four elements
    // Each warp takes FU rows of 32 consecutive groups per step: all loads are issued
    // before any is used, so FU·32 bytes per lane are in flight.
    const u64 step = (u64)gridDim.x * FT * FU;
    for (u64 qb = ((u64)blockIdx.x * FT + warp * 32) * FU; qb < nq; qb += step) {
        float a[FU][4];
        float4 x[FU], y[FU];
#pragma unroll
        for (int u = 0; u < FU; u++) {
            const u64 q = qb + u * 32 + lane;
            if (vec && q * 4 + 3 < n) {
                x[u] = reinterpret_cast<const float4*>(r)[q];
                y[u] = g ? reinterpret_cast<const float4*>(g)[q] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
#pragma unroll
        for (int u = 0; u < FU; u++) {
            const u64 q = qb + u * 32 + lane;
            const u64 e0 = q * 4;
            if (vec && e0 + 3 < n) {
                if (g) {
                    x[u].x += y[u].x; x[u].y += y[u].y; x[u].z += y[u].z; x[u].w += y[u].w;
                    reinterpret_cast<float4*>(r)[q] = x[u];
                }
                a[u][0] = x[u].x; a[u][1] = x[u].y; a[u][2] = x[u].z; a[u][3] = x[u].w;
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const u64 e = e0 + j;
                    a[u][j] = 0.0f;
                    if (e < n) {
                        a[u][j] = r[e];
                        if (g) {
                            a[u][j] += g[e];
                            r[e] = a[u][j];
                        }
                    }
                }
            }
        }
        u32 c = 0, flags = 0;
#pragma unroll
        for (int u = 0; u < FU; u++) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u64 e = (qb + u * 32 + lane) * 4 + j;
                const bool valid = e < n;
                const u32 bits = valid ? abs_bits(a[u][j]) : 0u;
                if (valid && bits >= INF_BITS && e < bad) bad = e;
                if (want_stats && valid) {
                    sum += (double)__uint_as_float(bits);
                    mx = max(mx, bits);
                }
                if (valid && is_cand(bits, e, t_low, plo, phi)) {
                    flags |= 1u << (u * 4 + j);
                    c++;
                }
            }
        }
        if (__any_sync(FULL, c != 0)) {
            u32 incl = c;
            for (int o = 1; o < 32; o <<= 1) {
                const u32 y2 = __shfl_up_sync(FULL, incl, o);
                if (lane >= (u32)o) incl += y2;
            }
            const u32 total = __shfl_sync(FULL, incl, 31);
            u32 at = staged + incl - c;
#pragma unroll
            for (int u = 0; u < FU; u++) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if (flags & (1u << (u * 4 + j))) {
                        sidx[warp][at] = (u32)((qb + u * 32 + lane) * 4 + j);
                        sval[warp][at] = a[u][j];
                        at++;
                    }
                }
            }
            staged += total;
            __syncwarp();
            if (staged > WBUF - 32 * FU * 4) {
                flush_staged(s, cidx, cval, cap, sidx[warp], sval[warp], staged, lane);
                staged = 0;
            }
        }
    }
    if (staged) flush_staged(s, cidx, cval, cap, sidx[warp], sval[warp], staged, lane);
    if (bad != NONE64) atomicMin(&s->first_bad, bad);
    if (want_stats) {
        for (int o = 16; o > 0; o >>= 1) {
            sum += __shfl_down_sync(FULL, sum, o);
            mx = max(mx, __shfl_down_sync(FULL, mx, o));
        }
        if (lane == 0) {
            wsum[warp] = sum;
            wmax[warp] = mx;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double bs = 0.0;
            u32 bm = 0;
            for (int w = 0; w < FT / 32; w++) {
                bs += wsum[w];
                bm = max(bm, wmax[w]);
            }
            atomicAdd(&s->abs_sum, bs);
            atomicMax(&s->max_bits, bm);
        }
    }
}

// Marks the candidates of class A (bits >= a_bits) in bm[0..words) and of class B
// (b_lo <= bits < a_bits) in bm[words..2 words), by dense index.
extern "C" __global__ void mark_classes(const u32* cidx, const float* cval, const State* s,
                                        u32* bm, u64 words) {
    const u64 n = mn64(s->cand_cap, s->n_cand);
    const u32 a_bits = s->a_bits, b_lo = s->b_lo;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 b = abs_bits(cval[i]);
        const u32 e = cidx[i];
        const u32 bit = 1u << (e & 31);
        if (b >= a_bits) atomicOr(&bm[e >> 5], bit);
        else if (b >= b_lo) atomicOr(&bm[words + (e >> 5)], bit);
    }
}

#define ET 256            // threads of the bitmap emission
#define EW 4              // words per thread
#define ETILE (ET * EW)   // words per tile

// Exclusive block scan of one u32 per thread (ET threads); *total gets the block's sum.
__device__ u32 block_excl_u32(u32 v, u32* wtot, u32* total) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const u32 y = __shfl_up_sync(FULL, incl, o);
        if (lane >= (u32)o) incl += y;
    }
    if (lane == 31) wtot[warp] = incl;
    __syncthreads();
    u32 before = 0, all = 0;
    for (u32 w = 0; w < ET / 32; w++) {
        if (w < warp) before += wtot[w];
        all += wtot[w];
    }
    __syncthreads();
    *total = all;
    return before + incl - v;
}

// Ordered emission from the two class bitmaps (decoupled look-back over tiles of ETILE
// words): every class-A entry and the class-B entries whose rank among B is in
// [b_start, b_start + b_need), in index order, with their values read from x; the words
// read are zeroed, so the bitmaps are clean for the next call. count, total_a and total_b
// are set by the last tile. When the call succeeded, each emitted entry of x is finished
// (zeroed, or left with its wire rounding error). `look`: 1 + 2 * ntiles zeroed words.
extern "C" __global__ void __launch_bounds__(ET) emit_marked(u32* bm, u64 words, float* x,
                                                             State* s, u64* look, u64 ntiles,
                                                             u32* out_idx, float* out_val,
                                                             unsigned short* out16, int wire) {
    __shared__ u64 sh_tile, sh_ex[2];
    __shared__ u32 wtot[ET / 32];
    if (threadIdx.x == 0) sh_tile = atomicAdd(&look[0], 1ull);
    __syncthreads();
    const u64 tile = sh_tile;
    const u64 w0 = tile * ETILE + (u64)threadIdx.x * EW;
    u32 wa[EW], wb[EW];
    u32 ca = 0, cb = 0;
#pragma unroll
    for (int j = 0; j < EW; j++) {
        const u64 w = w0 + j;
        wa[j] = w < words ? bm[w] : 0u;
        wb[j] = w < words ? bm[words + w] : 0u;
        ca += __popc(wa[j]);
        cb += __popc(wb[j]);
        if (wa[j]) bm[w] = 0u;
        if (wb[j]) bm[words + w] = 0u;
    }
    u32 ta, tb;
    const u32 xa = block_excl_u32(ca, wtot, &ta);
    const u32 xb = block_excl_u32(cb, wtot, &tb);
    const u32 warp = threadIdx.x >> 5;
    if (warp < 2) {
        const u64 ex = look_back(look + 1 + (warp == 0 ? 0 : ntiles), tile, warp == 0 ? ta : tb);
        if ((threadIdx.x & 31) == 0) sh_ex[warp] = ex;
    }
    __syncthreads();
    const u64 bstart = s->b_start, bneed = s->b_need, cap = s->out_cap;
    // The emitted count never exceeds out_cap on these paths (the host sizes the output for
    // every candidate, or for k of the k_sel it checks), so the finishing step runs here.
    const bool fin = s->first_bad == NONE64 && s->n_cand <= s->cand_cap && s->n_cand >= s->k_sel;
    u64 ra = sh_ex[0] + xa, rb = sh_ex[1] + xb;
    for (int j = 0; j < EW; j++) {
        u32 m = wa[j] | wb[j];
        while (m) {
            const u32 bit = __ffs(m) - 1;
            m &= m - 1;
            const bool is_a = (wa[j] >> bit) & 1u;
            const u64 b_before = rb > bstart ? mn64(rb - bstart, bneed) : 0;
            const bool take = is_a || (rb >= bstart && rb - bstart < bneed);
            const u64 pos = ra + b_before;
            if (take && pos < cap) {
                const u64 e = (w0 + j) * 32 + bit;
                const float v = x[e];
                out_idx[pos] = (u32)e;
                out_val[pos] = v;
                if (fin) {
                    unsigned short h = 0;
                    x[e] = finish_one(v, wire, &h);
                    if (wire != 0) out16[pos] = h;
                }
            }
            if (is_a) ra++;
            else rb++;
        }
    }
    if (tile == ntiles - 1 && threadIdx.x == 0) {
        const u64 sa = sh_ex[0] + ta, sb = sh_ex[1] + tb;
        s->total_a = sa;
        s->total_b = sb;
        s->count = sa + (sb > bstart ? mn64(sb - bstart, bneed) : 0);
    }
}

// ---------------------------------------------------------------------------------------
// MSTopK (Shi et al., MLSys 2021, Algorithm 1) with the candidate shortcut: one block runs
// the N binary-search rounds. A round whose threshold is below t_low has more than k
// entries above it (every candidate), so only rounds at or above t_low are counted, and
// those only among the candidates. Arithmetic in explicitly rounded double (no FMA
// contraction), so the thresholds equal the CPU's bit for bit given the same mean.

__device__ u64 block_sum(u64 v, u64* wtot) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) wtot[threadIdx.x >> 5] = v;
    __syncthreads();
    u64 t = 0;
    for (u32 w = 0; w < blockDim.x / 32; w++) t += wtot[w];
    return t;
}

__device__ u64 count_band(const float* cv, u64 nc, u32 lo, u32 hi, u64* wtot) {
    u64 c = 0;
    for (u64 i = threadIdx.x; i < nc; i += blockDim.x) {
        const u32 b = abs_bits(cv[i]);
        c += (b >= lo && b < hi) ? 1 : 0;
    }
    return block_sum(c, wtot);
}

extern "C" __global__ void __launch_bounds__(PT) ms_rounds(const float* cv, u64 cap, State* s,
                                                           u64 n_dense, u64 k, int rounds) {
    __shared__ u64 wtot[32];
    const u64 nc = mn64(cap, s->n_cand);
    const u32 t_low = s->t_low;
    const double mean = __ddiv_rn(s->abs_sum, (double)n_dense);
    const double u = (double)__uint_as_float(s->max_bits);
    double l = 0.0, r = 1.0;
    u32 t1 = 0x7fffffffu, t2 = 0;
    for (int it = 0; it < rounds; it++) {
        const double ratio = __dadd_rn(l, __dmul_rn(__dsub_rn(r, l), 0.5));
        const float tf = __double2float_rn(__dadd_rn(mean, __dmul_rn(ratio, __dsub_rn(u, mean))));
        const u32 tb = abs_bits(tf);
        bool more = true;
        u64 nnz = 0;
        if (tb >= t_low) {
            nnz = count_band(cv, nc, tb, 0xffffffffu, wtot);
            more = nnz > k;
        }
        if (!more) {
            r = ratio;
            if (nnz > 0) t1 = tb;
        } else {
            l = ratio;
            t2 = tb;
        }
    }
    const u64 k1 = count_band(cv, nc, t1, 0xffffffffu, wtot);
    const u32 from_cand = t2 >= t_low ? 1u : 0u;
    const u64 len2 = from_cand ? count_band(cv, nc, t2, t1, wtot) : 0;
    if (threadIdx.x == 0) {
        s->t1_bits = t1;
        s->t2_bits = t2;
        s->k1 = k1;
        s->len2 = len2;
        s->from_cand = from_cand;
        s->a_bits = t1;
        s->b_lo = t2;
        s->b_start = 0;
        s->b_need = k - k1;
    }
}

// ExDyna's fallback (Yoon & Oh, CCGrid 2024, Algorithm 4): the largest magnitude of the
// partition, lowest index on ties, as a key in argmax_key.
extern "C" __global__ void part_argmax(const float* x, u64 lo, u64 hi, State* s) {
    u64 best = 0;
    for (u64 i = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < hi;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 key = ((u64)abs_bits(x[i]) << 32) | (u64)(0xffffffffu - (u32)i);
        best = best > key ? best : key;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const u64 y = __shfl_down_sync(FULL, best, o);
        best = best > y ? best : y;
    }
    if ((threadIdx.x & 31) == 0 && best) atomicMax(&s->argmax_key, best);
}

// ---------------------------------------------------------------------------------------
// Finishing: zero the selected residual entries (wire 0, f32), or round the values to the
// wire type and leave the rounding error in the residual (1: f16, 2: bf16; saturating at
// the largest finite value like the CPU's round_saturating). Does nothing when the call
// failed (non-finite input, a buffer overflowed or the sampled bound let through fewer
// than k_sel candidates, and the host will retry), so the
// residual keeps the accumulated values exactly like the CPU path.

extern "C" __global__ void finish(float* r, const u32* idx, const float* val,
                                  unsigned short* out16, const State* s, int wire) {
    if (!call_ok(s)) return;
    const u64 n = s->count;
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (u64)gridDim.x * blockDim.x) {
        const u32 i = idx[j];
        unsigned short h = 0;
        r[i] = finish_one(val[j], wire, &h);
        if (wire != 0) out16[j] = h;
    }
}

// Applies a sparse update on the device: dst[idx[j]] += alpha * val[j] (indices unique).
extern "C" __global__ void scatter_add(float* dst, const u32* idx, const float* val, u64 n,
                                       float alpha) {
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (u64)gridDim.x * blockDim.x)
        dst[idx[j]] = __fadd_rn(dst[idx[j]], __fmul_rn(alpha, val[j]));
}
