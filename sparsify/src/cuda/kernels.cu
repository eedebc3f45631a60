// Kernels for sparsify's CUDA path, compiled at run time with NVRTC (no headers needed).
//
// Magnitudes are compared as unsigned integers: for a finite float, bits & 0x7fffffff
// orders like |x|; NaN and infinities map at or above INF_BITS. Every index and count is
// 64-bit, so nothing wraps past 2^32 elements. All selection decisions stay on the device
// in a State struct; the host reads the state once per call and copies only the selected
// (index, value) pairs back.
//
// Passes over the dense vector for exact top-k: one fused pass (r += g, level-0 radix
// histogram, non-finite check: 12 bytes per element) and one ordered compaction of the
// candidates at or above the level-0 bin (4 bytes per element). The two finer radix levels
// and the final ordered emission run on the candidates only.

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
};

__device__ __forceinline__ u32 abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }
__device__ __forceinline__ u64 mn64(u64 a, u64 b) { return a < b ? a : b; }

// Writes the offset of every State field within `s`, in declaration order, then
// sizeof(State) (the layout test on a device).
extern "C" __global__ void state_layout(const State* s, u64* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int i = 0;
#define OFF(f) out[i++] = (u64)((const char*)&s->f - (const char*)s)
    OFF(a_bits); OFF(b_lo); OFF(part_lo); OFF(part_hi); OFF(b_start); OFF(b_need);
    OFF(prefix); OFF(t_low); OFF(k_rem); OFF(first_bad); OFF(n_cand); OFF(cand_cap);
    OFF(count); OFF(out_cap); OFF(total_a); OFF(total_b); OFF(argmax_key); OFF(abs_sum);
    OFF(max_bits); OFF(t1_bits); OFF(t2_bits); OFF(from_cand); OFF(k1); OFF(len2);
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
// fixes the bin that holds the k_rem-th largest entry. mode 1 (level 0): the candidates
// are everything at or above that bin. mode 2 (last level): emission classes of exact
// top-k, A = above the k-th value, B = equal to it (ties: the lower indices).
extern "C" __global__ void __launch_bounds__(PT) radix_pick(const u64* hist, State* s, int shift,
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
    __syncthreads();  // every thread has read k_rem before it changes
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
    }
}

// ---------------------------------------------------------------------------------------
// Ordered compaction with a decoupled look-back scan (one pass, one block per tile, tile
// ids taken in launch order so every predecessor is running or done).

#define FLAG_AGG (1ull << 62)
#define FLAG_PRE (2ull << 62)
#define VAL_MASK (FLAG_AGG - 1)

// Publishes this tile's aggregate, sums the predecessors' until one has its inclusive
// prefix, publishes the inclusive prefix; returns the exclusive prefix.
__device__ u64 look_back(u64* st, u64 tile, u64 agg) {
    if (tile == 0) {
        atomicExch(&st[0], FLAG_PRE | agg);
        return 0;
    }
    atomicExch(&st[tile], FLAG_AGG | agg);
    u64 excl = 0, p = tile - 1;
    for (;;) {
        const u64 w = *((volatile u64*)&st[p]);
        const u64 f = w & ~VAL_MASK;
        if (f == 0) {
            __nanosleep(20);
            continue;
        }
        excl += w & VAL_MASK;
        if (f == FLAG_PRE) break;
        p--;
    }
    atomicExch(&st[tile], FLAG_PRE | (excl + agg));
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
        if (lane == 0) {
            const u64 ex = look_back(st, tile, (u64)agg);
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
// failed (non-finite input, or a buffer overflowed and the host will retry), so the
// residual keeps the accumulated values exactly like the CPU path.

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

extern "C" __global__ void finish(float* r, const u32* idx, const float* val,
                                  unsigned short* out16, const State* s, int wire) {
    if (s->first_bad != NONE64 || s->count > s->out_cap || s->n_cand > s->cand_cap) return;
    const u64 n = s->count;
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (u64)gridDim.x * blockDim.x) {
        const u32 i = idx[j];
        const float v = val[j];
        if (wire == 0) {
            r[i] = 0.0f;
        } else {
            const unsigned short h = wire == 1 ? f32_to_f16_sat(v) : f32_to_bf16_sat(v);
            const float q = wire == 1 ? f16_to_f32(h) : __uint_as_float((u32)h << 16);
            out16[j] = h;
            r[i] = __fsub_rn(v, q);
        }
    }
}

// Applies a sparse update on the device: dst[idx[j]] += alpha * val[j] (indices unique).
extern "C" __global__ void scatter_add(float* dst, const u32* idx, const float* val, u64 n,
                                       float alpha) {
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (u64)gridDim.x * blockDim.x)
        dst[idx[j]] = __fadd_rn(dst[idx[j]], __fmul_rn(alpha, val[j]));
}
