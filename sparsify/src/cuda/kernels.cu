// Kernels for sparsify's CUDA path, compiled at run time with NVRTC.
//
// Magnitudes are compared as unsigned integers: for a finite float, bits & 0x7fffffff
// orders like |x|; NaN and infinities map above every finite value (>= 0x7f800000).
// All selection decisions stay on the device in a State struct; the host only reads the
// final count and the selected entries.

#define INF_BITS 0x7f800000u
#define TILE_THREADS 256
#define TILE_ITEMS 16
#define TILE (TILE_THREADS * TILE_ITEMS)

struct State {
    // Radix select (exact top-k).
    unsigned int prefix;          // magnitude bits fixed so far
    unsigned long long k_rem;     // entries still to take at the current prefix
    // Emission classes: A = bits >= a_bits (always), B = b_lo <= bits < a_bits
    // (taken when their rank among B is in [b_start, b_start + b_need)).
    unsigned int a_bits;
    unsigned int b_lo;
    unsigned long long b_start;
    unsigned long long b_need;
    unsigned long long rand;      // host-drawn random number for MSTopK's offset
    int random_offset;            // 1: b_start = rand % (total_b - b_need + 1)
    unsigned long long total_a;
    unsigned long long total_b;
    unsigned long long count;     // entries emitted
    // Non-finite detection and MSTopK statistics.
    unsigned int first_bad;       // smallest index of a NaN/inf (0xffffffff: none)
    unsigned int max_bits;
    double abs_sum;
    // MSTopK binary search.
    double lo, hi;                // ratio bounds l, r
    unsigned int cur_bits;        // threshold of the current round
    unsigned long long nnz;       // count of the current round
    unsigned int t1_bits;         // last round with 1 <= nnz <= k (0xffffffff: unset)
    unsigned int t2_bits;         // last round with nnz > k (0: unset)
};

__device__ __forceinline__ unsigned int abs_bits(float x) {
    return __float_as_uint(x) & 0x7fffffffu;
}

__device__ __forceinline__ void note_bad(State* s, unsigned int bits, unsigned int i) {
    if (bits >= INF_BITS) atomicMin(&s->first_bad, i);
}

// acc = r + g written into r; level-0 histogram of bits >> 20 (2048 bins); stats.
extern "C" __global__ void ef_accumulate(float* r, const float* g, unsigned int n,
                                         State* s, unsigned int* hist, int want_hist,
                                         int want_stats) {
    __shared__ unsigned int sh[2048];
    __shared__ double ssum[TILE_THREADS];
    __shared__ unsigned int smax[TILE_THREADS];
    if (want_hist) for (int b = threadIdx.x; b < 2048; b += blockDim.x) sh[b] = 0;
    __syncthreads();
    double local = 0.0;
    unsigned int mx = 0;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += gridDim.x * blockDim.x) {
        float a = r[i] + g[i];
        r[i] = a;
        unsigned int b = abs_bits(a);
        note_bad(s, b, i);
        if (want_hist) atomicAdd(&sh[b >> 20], 1u);
        if (want_stats) { local += (double)fabsf(a); mx = max(mx, b); }
    }
    ssum[threadIdx.x] = local;
    smax[threadIdx.x] = mx;
    __syncthreads();
    if (want_hist)
        for (int b = threadIdx.x; b < 2048; b += blockDim.x)
            if (sh[b]) atomicAdd(&hist[b], sh[b]);
    if (want_stats) {
        for (int w = blockDim.x / 2; w > 0; w >>= 1) {
            if (threadIdx.x < w) {
                ssum[threadIdx.x] += ssum[threadIdx.x + w];
                smax[threadIdx.x] = max(smax[threadIdx.x], smax[threadIdx.x + w]);
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            atomicAdd(&s->abs_sum, ssum[0]);
            atomicMax(&s->max_bits, smax[0]);
        }
    }
}

// Histogram of the bits below `shift + width` for entries whose higher bits match prefix.
extern "C" __global__ void radix_hist(const float* r, unsigned int n, const State* s,
                                      unsigned int* hist, int shift, int width) {
    __shared__ unsigned int sh[2048];
    unsigned int nb = 1u << width;
    for (unsigned int b = threadIdx.x; b < nb; b += blockDim.x) sh[b] = 0;
    __syncthreads();
    int top = shift + width;
    unsigned int pre = s->prefix >> top;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += gridDim.x * blockDim.x) {
        unsigned int b = abs_bits(r[i]);
        if ((b >> top) == pre) atomicAdd(&sh[(b >> shift) & (nb - 1)], 1u);
    }
    __syncthreads();
    for (unsigned int b = threadIdx.x; b < nb; b += blockDim.x)
        if (sh[b]) atomicAdd(&hist[b], sh[b]);
}

// One thread: walk the bins from the top, fix the bin holding the k_rem-th largest.
// After the last level, sets the emission classes for exact top-k (ties: lower index).
extern "C" __global__ void radix_pick(unsigned int* hist, State* s, int shift, int width,
                                      int last) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned int nb = 1u << width;
    unsigned long long above = 0;
    unsigned int b = nb - 1;
    for (;;) {
        unsigned long long c = hist[b];
        if (above + c >= s->k_rem || b == 0) break;
        above += c;
        b--;
    }
    s->k_rem -= above;
    s->prefix |= b << shift;
    for (unsigned int i = 0; i < nb; i++) hist[i] = 0;
    if (last) {
        s->a_bits = s->prefix + 1;
        s->b_lo = s->prefix;
        s->b_start = 0;
        s->b_need = s->k_rem;
        s->random_offset = 0;
    }
}

// MSTopK round, Algorithm 1 lines 8-9 of paper 001: the threshold of this round.
extern "C" __global__ void ms_threshold(State* s, unsigned long long n) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double mean = s->abs_sum / (double)n;
    double u = (double)__uint_as_float(s->max_bits);
    double ratio = s->lo + (s->hi - s->lo) / 2.0;
    float t = (float)(mean + ratio * (u - mean));
    s->cur_bits = abs_bits(t);
    s->nnz = 0;
}

// MSTopK round, line 10: nnz = count(|x| >= thres).
extern "C" __global__ void ms_count(const float* r, unsigned int n, State* s) {
    __shared__ unsigned int c;
    if (threadIdx.x == 0) c = 0;
    __syncthreads();
    unsigned int t = s->cur_bits;
    unsigned int local = 0;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += gridDim.x * blockDim.x)
        local += abs_bits(r[i]) >= t;
    atomicAdd(&c, local);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(&s->nnz, (unsigned long long)c);
}

// MSTopK round, lines 11-23: move a bound, record the thresholds.
extern "C" __global__ void ms_decide(State* s, unsigned long long k) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double ratio = s->lo + (s->hi - s->lo) / 2.0;
    if (s->nnz <= k) {
        s->hi = ratio;
        if (s->nnz > 0) s->t1_bits = s->cur_bits;
    } else {
        s->lo = ratio;
        s->t2_bits = s->cur_bits;
    }
}

// MSTopK lines 25-28: class A = |x| >= thres1, class B = thres2 <= |x| < thres1.
extern "C" __global__ void ms_classes(State* s, unsigned long long k) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    s->a_bits = s->t1_bits;  // 0xffffffff when unset: selects nothing
    s->b_lo = s->t2_bits;
    s->b_need = k;           // reduced by total_a in scan_blocks
    s->random_offset = 1;
}

__device__ __forceinline__ int class_of(unsigned int b, const State* s) {
    if (b >= s->a_bits) return 1;
    if (b >= s->b_lo) return 2;
    return 0;
}

// Per-tile counts of class A and class B entries (tile = TILE contiguous elements).
extern "C" __global__ void count_tiles(const float* r, unsigned int n, const State* s,
                                       unsigned int* ta, unsigned int* tb) {
    __shared__ unsigned int ca, cb;
    if (threadIdx.x == 0) { ca = 0; cb = 0; }
    __syncthreads();
    unsigned int base = blockIdx.x * TILE;
    unsigned int la = 0, lb = 0;
    for (int j = 0; j < TILE_ITEMS; j++) {
        unsigned int i = base + j * TILE_THREADS + threadIdx.x;
        if (i < n) {
            int c = class_of(abs_bits(r[i]), s);
            la += c == 1;
            lb += c == 2;
        }
    }
    atomicAdd(&ca, la);
    atomicAdd(&cb, lb);
    __syncthreads();
    if (threadIdx.x == 0) { ta[blockIdx.x] = ca; tb[blockIdx.x] = cb; }
}

// One block: exclusive prefix sums of the tile counts (in place), totals, and the final
// class-B window.
extern "C" __global__ void scan_tiles(unsigned int* ta, unsigned int* tb,
                                      unsigned int tiles, State* s) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned long long a = 0, b = 0;
    for (unsigned int t = 0; t < tiles; t++) {
        unsigned int x = ta[t], y = tb[t];
        ta[t] = (unsigned int)a;
        tb[t] = (unsigned int)b;
        a += x;
        b += y;
    }
    s->total_a = a;
    s->total_b = b;
    if (s->random_offset) {
        unsigned long long need = s->b_need > a ? s->b_need - a : 0;
        s->b_need = need;
        unsigned long long span = b >= need ? b - need + 1 : 1;
        s->b_start = s->rand % span;
    }
    unsigned long long takeb = b > s->b_start ? b - s->b_start : 0;
    if (takeb > s->b_need) takeb = s->b_need;
    s->count = a + takeb;
}

// Ordered emission: entries of class A, and of class B with rank in the window, written
// in index order; their residual entries are zeroed.
extern "C" __global__ void emit_tiles(float* r, unsigned int n, const State* s,
                                      const unsigned int* ta, const unsigned int* tb,
                                      unsigned int* out_idx, float* out_val) {
    __shared__ unsigned int wa[TILE_THREADS / 32], wb[TILE_THREADS / 32];
    __shared__ unsigned int run_a, run_b;
    if (threadIdx.x == 0) { run_a = 0; run_b = 0; }
    __syncthreads();
    unsigned int base = blockIdx.x * TILE;
    unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned long long bstart = s->b_start, bend = s->b_start + s->b_need;
    for (int j = 0; j < TILE_ITEMS; j++) {
        unsigned int i = base + j * TILE_THREADS + threadIdx.x;
        float v = 0.0f;
        int c = 0;
        if (i < n) { v = r[i]; c = class_of(abs_bits(v), s); }
        unsigned int ma = __ballot_sync(0xffffffffu, c == 1);
        unsigned int mb = __ballot_sync(0xffffffffu, c == 2);
        if (lane == 0) { wa[warp] = __popc(ma); wb[warp] = __popc(mb); }
        __syncthreads();
        unsigned int pa = 0, pb = 0, sa = 0, sb = 0;
        for (unsigned int w = 0; w < TILE_THREADS / 32; w++) {
            if (w < warp) { pa += wa[w]; pb += wb[w]; }
            sa += wa[w]; sb += wb[w];
        }
        unsigned int lt = (1u << lane) - 1u;
        unsigned long long ra = (unsigned long long)ta[blockIdx.x] + run_a + pa + __popc(ma & lt);
        unsigned long long rb = (unsigned long long)tb[blockIdx.x] + run_b + pb + __popc(mb & lt);
        if (c == 1 || (c == 2 && rb >= bstart && rb < bend)) {
            // Position among emitted: A entries before + B entries in window before.
            unsigned long long before_b = rb > bstart ? rb - bstart : 0;
            if (before_b > s->b_need) before_b = s->b_need;
            unsigned long long pos = ra + before_b;
            out_idx[pos] = i;
            out_val[pos] = v;
            r[i] = 0.0f;
        }
        __syncthreads();
        if (threadIdx.x == 0) { run_a += sa; run_b += sb; }
        __syncthreads();
    }
}
