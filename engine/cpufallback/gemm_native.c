//go:build cgo && !purego

// The CPU engine's matrix products: register-blocked micro-kernels over B
// packed in panels of the kernel's width, for AVX-512 (8 rows x 32 columns,
// 16 zmm accumulators) and AVX2 + FMA (6 x 16, 12 ymm accumulators), each
// compiled for its instruction set function by function and chosen at
// start-up from cpuid (see gemm_native.go), so one binary runs on any
// x86-64. The resident weights are packed once at load; the attention
// products pack their B (a head's keys or values) into a per-thread scratch
// buffer on the C heap.
//
// Blocking: the K dimension in blocks of KC (a block of A rows and a
// KC x NR sliver of B stay in L1/L2 while the panel's tiles are computed);
// the epilogue (alpha, beta, bias, activation) runs on the tile in
// registers after the last K block, so the output is written once.

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "avx2_math.h"
#include "gemm_native.h"

#define AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma")))
#define AVX2 __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

// A KC x NC block of B (384 KiB) and MC rows of A (MC x KC: 144 KiB) stay
// in L2 while the block's tiles are computed; a KC x NR sliver of B (48
// KiB at AVX-512's 32 columns) streams from L2. KC 384 against 256: 2-3%
// more at 128 rows of MiniLM's products, one K block for its hidden size.
enum { KC = 384, MC = 96, NC = 256 };

int ss_cpu_level(void) {
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
		return SS_ISA_AVX512;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SS_ISA_AVX2;
	return SS_ISA_NONE;
}

int ss_have_avx512bf16(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512bf16");
}

int ss_panel_width(int isa) { return isa == SS_ISA_AVX512 ? 32 : 16; }

// B [k, n] (row stride ldb), or its transpose stored [n, k] when trans, as
// panels of nr columns: panel p is k rows of nr floats, columns p*nr up to
// p*nr+nr, the last panel padded with zeros.
void ss_pack_b(int nr, int k, int n, const float *b, int ldb, int trans, float *out) {
	int panels = (n + nr - 1) / nr;
	for (int p = 0; p < panels; p++) {
		float *dst = out + (long)p * k * nr;
		int j0 = p * nr, w = n - j0 < nr ? n - j0 : nr;
		for (int kk = 0; kk < k; kk++) {
			float *row = dst + (long)kk * nr;
			if (!trans) {
				memcpy(row, b + (long)kk * ldb + j0, sizeof(float) * w);
			} else {
				for (int j = 0; j < w; j++) row[j] = b[(long)(j0 + j) * ldb + kk];
			}
			for (int j = w; j < nr; j++) row[j] = 0;
		}
	}
}

// ---------------------------------------------------------------- AVX-512

// e^x for 16 lanes: the formula of exp32 and exp8 (kernels.go,
// kernels_avx2.c): 2^n * 2^f, f in [-1/2, 1/2], degree-5 polynomial.
AVX512 INLINE __m512 exp16(__m512 x) {
	__mmask16 lo = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
	__mmask16 hi = _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_GT_OQ);
	x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
	__m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.442695041f));
	__m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 f = _mm512_sub_ps(t, n);
	__m512 p = _mm512_set1_ps(0.001333355f);
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.009618129f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05550411f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402265f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931472f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
	__m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
	__m512 r = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
	r = _mm512_maskz_mov_ps(~lo, r);
	return _mm512_mask_mov_ps(r, hi, _mm512_set1_ps(INFINITY));
}

// GELU(x) = x/2 * (1 + erf(x/sqrt 2)), erf by Abramowitz and Stegun 7.1.26
// as gelu8 in kernels_avx2.c.
AVX512 INLINE __m512 gelu16(__m512 v) {
	const __m512 one = _mm512_set1_ps(1.0f);
	const __m512i signbit = _mm512_set1_epi32(0x80000000);
	__m512 x = _mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f));
	__m512i xi = _mm512_castps_si512(x);
	__m512i sign = _mm512_and_si512(xi, signbit);
	__m512 ax = _mm512_castsi512_ps(_mm512_andnot_si512(signbit, xi));
	__m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), ax, one));
	__m512 p = _mm512_set1_ps(1.061405429f);
	p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
	p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
	p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
	p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
	p = _mm512_mul_ps(p, t);
	__m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(ax, ax)));
	__m512 erf = _mm512_fnmadd_ps(p, e, one);
	erf = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(erf), sign));
	return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v), _mm512_add_ps(one, erf));
}

// GELU's tanh approximation, x / (1 + e^-2u), u = sqrt(2/pi) (x +
// 0.044715 x^3), as gelu_tanh8 in kernels_avx2.c.
AVX512 INLINE __m512 gelu_tanh16(__m512 v) {
	__m512 v3 = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
	__m512 u = _mm512_mul_ps(_mm512_set1_ps(-2.0f * 0.7978845608028654f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), v3, v));
	return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(u)));
}

AVX512 INLINE __m512 act16(__m512 v, int act) {
	if (act == SS_ACT_GELU) return gelu16(v);
	if (act == SS_ACT_GELU_TANH) return gelu_tanh16(v);
	if (act == SS_ACT_RELU) return _mm512_max_ps(v, _mm512_setzero_ps());
	return v;
}

// The epilogue of an AVX-512 tile: rows mr of acc (C = alpha*acc +
// beta*C, or C += alpha*acc after the first K block), then on the last K
// block the bias and activation, written once.
AVX512 INLINE void store16x2(__m512 acc[8][2], int mr, float *c, long ldc, __mmask16 m0, __mmask16 m1, float alpha,
                             float beta, int first, int last, const float *bias, int act) {
	__m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
	__m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
	if (last && bias) {
		bias0 = _mm512_maskz_loadu_ps(m0, bias);
		bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
	}
	for (int i = 0; i < mr; i++) {
		float *ci = c + i * ldc;
		__m512 v0, v1;
		if (first) {
			v0 = _mm512_mul_ps(acc[i][0], va);
			v1 = _mm512_mul_ps(acc[i][1], va);
			if (beta != 0) {
				v0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, ci), vb, v0);
				v1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, ci + 16), vb, v1);
			}
		} else {
			v0 = _mm512_fmadd_ps(acc[i][0], va, _mm512_maskz_loadu_ps(m0, ci));
			v1 = _mm512_fmadd_ps(acc[i][1], va, _mm512_maskz_loadu_ps(m1, ci + 16));
		}
		if (last) {
			v0 = act16(_mm512_add_ps(v0, bias0), act);
			v1 = act16(_mm512_add_ps(v1, bias1), act);
		}
		_mm512_mask_storeu_ps(ci, m0, v0);
		_mm512_mask_storeu_ps(ci + 16, m1, v1);
	}
}

// One tile: 8 rows of A from a (row stride lda; the caller pads a short
// block with zero rows) times the kc x 32 sliver bp; rows mr of the tile of
// C (mask: its valid columns) get the result. first: the tile starts from
// beta*C (else it adds to C); last: the epilogue (bias, activation) runs.
AVX512 static void tile16x2(int mr, int kc, const float *a, long lda, const float *bp,
                            float *c, long ldc, __mmask16 m0, __mmask16 m1, float alpha, float beta,
                            int first, int last, const float *bias, int act) {
	__m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
	__m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
	const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
	const float *a4 = a + 4 * lda, *a5 = a + 5 * lda, *a6 = a + 6 * lda, *a7 = a + 7 * lda;
	for (int p = 0; p < kc; p++) {
		__m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
		bp += 32;
#define ROW(i) { __m512 av = _mm512_set1_ps(a##i[p]); c##i##0 = _mm512_fmadd_ps(av, b0, c##i##0); c##i##1 = _mm512_fmadd_ps(av, b1, c##i##1); }
		ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7)
#undef ROW
	}
	__m512 acc[8][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
	store16x2(acc, mr, c, ldc, m0, m1, alpha, beta, first, last, bias, act);
}

// A tile of M rows (1 to 4: a decode step's few sequences), which
// tile16x2 would pad to 8 with zero rows and so spend most of its
// multiplies on zeros: at one row the 8-row tile reads the weights at
// under a third of the machine's bandwidth. Here each row's two
// accumulators are split over U steps of K (U independent chains hide the
// FMA's latency), so a decode step's products stream the weights.
#define SMALL_TILE(M, U)                                                                                          \
	AVX512 static void tile_small##M(int kc, const float *a, long lda, const float *bp, float *c, long ldc,        \
	                                 __mmask16 m0, __mmask16 m1, float alpha, float beta, int first, int last,     \
	                                 const float *bias, int act) {                                                 \
		__m512 acc[M][U][2];                                                                                      \
		for (int i = 0; i < M; i++)                                                                               \
			for (int u = 0; u < U; u++) acc[i][u][0] = acc[i][u][1] = _mm512_setzero_ps();                        \
		int p = 0;                                                                                                \
		for (; p + U <= kc; p += U) {                                                                             \
			for (int u = 0; u < U; u++) {                                                                         \
				__m512 b0 = _mm512_loadu_ps(bp + (p + u) * 32), b1 = _mm512_loadu_ps(bp + (p + u) * 32 + 16);     \
				for (int i = 0; i < M; i++) {                                                                     \
					__m512 av = _mm512_set1_ps(a[i * lda + p + u]);                                               \
					acc[i][u][0] = _mm512_fmadd_ps(av, b0, acc[i][u][0]);                                         \
					acc[i][u][1] = _mm512_fmadd_ps(av, b1, acc[i][u][1]);                                         \
				}                                                                                                 \
			}                                                                                                     \
		}                                                                                                         \
		for (; p < kc; p++) {                                                                                     \
			__m512 b0 = _mm512_loadu_ps(bp + p * 32), b1 = _mm512_loadu_ps(bp + p * 32 + 16);                     \
			for (int i = 0; i < M; i++) {                                                                         \
				__m512 av = _mm512_set1_ps(a[i * lda + p]);                                                       \
				acc[i][0][0] = _mm512_fmadd_ps(av, b0, acc[i][0][0]);                                             \
				acc[i][0][1] = _mm512_fmadd_ps(av, b1, acc[i][0][1]);                                             \
			}                                                                                                     \
		}                                                                                                         \
		__m512 out[8][2];                                                                                         \
		for (int i = 0; i < M; i++) {                                                                             \
			out[i][0] = acc[i][0][0];                                                                             \
			out[i][1] = acc[i][0][1];                                                                             \
			for (int u = 1; u < U; u++) {                                                                         \
				out[i][0] = _mm512_add_ps(out[i][0], acc[i][u][0]);                                               \
				out[i][1] = _mm512_add_ps(out[i][1], acc[i][u][1]);                                               \
			}                                                                                                     \
		}                                                                                                         \
		store16x2(out, M, c, ldc, m0, m1, alpha, beta, first, last, bias, act);                                   \
	}
SMALL_TILE(1, 4)
SMALL_TILE(2, 4)
SMALL_TILE(3, 2)
SMALL_TILE(4, 2)
#undef SMALL_TILE

AVX512 static void tile_small(int mr, int kc, const float *a, long lda, const float *bp, float *c, long ldc,
                              __mmask16 m0, __mmask16 m1, float alpha, float beta, int first, int last,
                              const float *bias, int act) {
	switch (mr) {
	case 1: tile_small1(kc, a, lda, bp, c, ldc, m0, m1, alpha, beta, first, last, bias, act); break;
	case 2: tile_small2(kc, a, lda, bp, c, ldc, m0, m1, alpha, beta, first, last, bias, act); break;
	case 3: tile_small3(kc, a, lda, bp, c, ldc, m0, m1, alpha, beta, first, last, bias, act); break;
	default: tile_small4(kc, a, lda, bp, c, ldc, m0, m1, alpha, beta, first, last, bias, act); break;
	}
}

// The rows of A a short tile reads: the block's last rows copied, zero
// rows after them, so that the micro-kernel always runs whole.
static __thread float tailA[8 * KC];

AVX512 static void gemm_avx512(int m, int n, int k, float alpha, const float *a, int lda, const float *bp,
                               float beta, float *c, int ldc, const float *bias, int act, int p0, int p1) {
	if (m <= 4) {
		// A few rows stay in L1 whatever k is: each panel streams once,
		// whole, which keeps the prefetchers on one run of memory (K
		// blocks would revisit every panel once a block).
		for (int p = p0; p < p1; p++) {
			int j0 = p * 32, w = n - j0;
			__mmask16 m0 = w >= 16 ? 0xffff : (__mmask16)((1u << w) - 1);
			__mmask16 m1 = w >= 32 ? 0xffff : w <= 16 ? 0 : (__mmask16)((1u << (w - 16)) - 1);
			tile_small(m, k, a, lda, bp + (long)p * k * 32, c + j0, ldc, m0, m1, alpha, beta, 1, 1, bias ? bias + j0 : 0, act);
		}
		return;
	}
	for (int q0 = p0; q0 < p1; q0 += NC / 32) {
	int q1 = q0 + NC / 32 < p1 ? q0 + NC / 32 : p1;
	for (int i0 = 0; i0 < m; i0 += MC) {
		int mc = m - i0 < MC ? m - i0 : MC;
		for (int k0 = 0; k0 < k; k0 += KC) {
			int kc = k - k0 < KC ? k - k0 : KC;
			int first = k0 == 0, last = k0 + kc == k;
			int full = mc / 8 * 8, mr = mc - full, small = mr <= 4;
			if (mr && !small) {
				for (int i = 0; i < 8; i++)
					for (int p = 0; p < kc; p++) tailA[i * kc + p] = i < mr ? a[(long)(i0 + full + i) * lda + k0 + p] : 0;
			}
			for (int p = q0; p < q1; p++) {
				int j0 = p * 32, w = n - j0;
				__mmask16 m0 = w >= 16 ? 0xffff : (__mmask16)((1u << w) - 1);
				__mmask16 m1 = w >= 32 ? 0xffff : w <= 16 ? 0 : (__mmask16)((1u << (w - 16)) - 1);
				const float *bs = bp + (long)p * k * 32 + (long)k0 * 32;
				const float *bb = bias ? bias + j0 : 0;
				for (int i = 0; i < full; i += 8)
					tile16x2(8, kc, a + (long)(i0 + i) * lda + k0, lda, bs, c + (long)(i0 + i) * ldc + j0, ldc, m0, m1, alpha, beta, first, last, bb, act);
				if (mr && small)
					tile_small(mr, kc, a + (long)(i0 + full) * lda + k0, lda, bs, c + (long)(i0 + full) * ldc + j0, ldc, m0, m1, alpha, beta, first, last, bb, act);
				else if (mr)
					tile16x2(mr, kc, tailA, kc, bs, c + (long)(i0 + full) * ldc + j0, ldc, m0, m1, alpha, beta, first, last, bb, act);
			}
		}
	}
	}
}

// ---------------------------------------------------------------- AVX2

AVX2 INLINE __m256 act8(__m256 v, int act) {
	if (act == SS_ACT_GELU) return gelu8(v);
	if (act == SS_ACT_GELU_TANH) return gelu_tanh8(v);
	if (act == SS_ACT_RELU) return _mm256_max_ps(v, _mm256_setzero_ps());
	return v;
}

AVX2 INLINE __m256i lanes8(int w) {
	// Lane j is on (all ones) when j < w.
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AVX2 static void tile8x2(int mr, int kc, const float *a, long lda, const float *bp,
                         float *c, long ldc, int w, float alpha, float beta,
                         int first, int last, const float *bias, int act) {
	__m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
	__m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
	const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda, *a4 = a + 4 * lda, *a5 = a + 5 * lda;
	for (int p = 0; p < kc; p++) {
		__m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
		bp += 16;
#define ROW(i) { __m256 av = _mm256_broadcast_ss(a##i + p); c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0); c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1); }
		ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
#undef ROW
	}
	__m256 acc[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
	__m256i m0 = lanes8(w), m1 = lanes8(w - 8);
	__m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
	__m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
	if (last && bias) {
		bias0 = _mm256_maskload_ps(bias, m0);
		bias1 = _mm256_maskload_ps(bias + 8, m1);
	}
	for (int i = 0; i < mr; i++) {
		float *ci = c + i * ldc;
		__m256 v0, v1;
		if (first) {
			v0 = _mm256_mul_ps(acc[i][0], va);
			v1 = _mm256_mul_ps(acc[i][1], va);
			if (beta != 0) {
				v0 = _mm256_fmadd_ps(_mm256_maskload_ps(ci, m0), vb, v0);
				v1 = _mm256_fmadd_ps(_mm256_maskload_ps(ci + 8, m1), vb, v1);
			}
		} else {
			v0 = _mm256_fmadd_ps(acc[i][0], va, _mm256_maskload_ps(ci, m0));
			v1 = _mm256_fmadd_ps(acc[i][1], va, _mm256_maskload_ps(ci + 8, m1));
		}
		if (last) {
			v0 = act8(_mm256_add_ps(v0, bias0), act);
			v1 = act8(_mm256_add_ps(v1, bias1), act);
		}
		_mm256_maskstore_ps(ci, m0, v0);
		_mm256_maskstore_ps(ci + 8, m1, v1);
	}
}

AVX2 static void gemm_avx2(int m, int n, int k, float alpha, const float *a, int lda, const float *bp,
                           float beta, float *c, int ldc, const float *bias, int act, int p0, int p1) {
	for (int q0 = p0; q0 < p1; q0 += NC / 16) {
	int q1 = q0 + NC / 16 < p1 ? q0 + NC / 16 : p1;
	for (int i0 = 0; i0 < m; i0 += MC) {
		int mc = m - i0 < MC ? m - i0 : MC;
		for (int k0 = 0; k0 < k; k0 += KC) {
			int kc = k - k0 < KC ? k - k0 : KC;
			int first = k0 == 0, last = k0 + kc == k;
			int full = mc / 6 * 6, mr = mc - full;
			if (mr) {
				for (int i = 0; i < 6; i++)
					for (int p = 0; p < kc; p++) tailA[i * kc + p] = i < mr ? a[(long)(i0 + full + i) * lda + k0 + p] : 0;
			}
			for (int p = q0; p < q1; p++) {
				int j0 = p * 16, w = n - j0 < 16 ? n - j0 : 16;
				const float *bs = bp + (long)p * k * 16 + (long)k0 * 16;
				const float *bb = bias ? bias + j0 : 0;
				for (int i = 0; i < full; i += 6)
					tile8x2(6, kc, a + (long)(i0 + i) * lda + k0, lda, bs, c + (long)(i0 + i) * ldc + j0, ldc, w, alpha, beta, first, last, bb, act);
				if (mr)
					tile8x2(mr, kc, tailA, kc, bs, c + (long)(i0 + full) * ldc + j0, ldc, w, alpha, beta, first, last, bb, act);
			}
		}
	}
	}
}

// ---------------------------------------------------------------- AVX512_BF16

#define BF16 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,fma")))

// float32 to bfloat16, rounded to nearest even (as vcvtne2ps2bf16 does).
static inline unsigned short bf16_of(float f) {
	unsigned int u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000) return (unsigned short)((u >> 16) | 0x40); // NaN stays NaN
	return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// B [n, k] (torch's [out, in]) with row stride ldb as bfloat16 panels of
// 32 columns for vdpbf16ps: panel p holds, for each pair of k (the last
// padded with zero when k is odd), 32 columns of (B[2q][j], B[2q+1][j]).
void ss_pack_b_bf16(int k, int n, const float *b, int ldb, unsigned short *out) {
	int panels = (n + 31) / 32, kp = (k + 1) / 2;
	for (int p = 0; p < panels; p++) {
		unsigned short *dst = out + (long)p * kp * 64;
		for (int q = 0; q < kp; q++)
			for (int j = 0; j < 32; j++) {
				int col = p * 32 + j;
				for (int h = 0; h < 2; h++) {
					int kk = 2 * q + h;
					dst[(long)q * 64 + 2 * j + h] = col < n && kk < k ? bf16_of(b[(long)col * ldb + kk]) : 0;
				}
			}
	}
}

// A block of MC rows x KC of A in bfloat16, zero rows and columns padding it.
static __thread unsigned short blockA[MC * KC];

BF16 static void tile_bf16(int mr, int kp, const unsigned short *a, long lda, const unsigned short *bp,
                           float *c, long ldc, __mmask16 m0, __mmask16 m1, float alpha, float beta,
                           int first, int last, const float *bias, int act) {
	__m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
	__m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
	const int *a0 = (const int *)a, *a1 = (const int *)(a + lda), *a2 = (const int *)(a + 2 * lda), *a3 = (const int *)(a + 3 * lda);
	const int *a4 = (const int *)(a + 4 * lda), *a5 = (const int *)(a + 5 * lda), *a6 = (const int *)(a + 6 * lda), *a7 = (const int *)(a + 7 * lda);
	for (int q = 0; q < kp; q++) {
		__m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 32);
		bp += 64;
#define ROW(i) { __m512bh av = (__m512bh)_mm512_set1_epi32(a##i[q]); c##i##0 = _mm512_dpbf16_ps(c##i##0, av, b0); c##i##1 = _mm512_dpbf16_ps(c##i##1, av, b1); }
		ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7)
#undef ROW
	}
	__m512 acc[8][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
	store16x2(acc, mr, c, ldc, m0, m1, alpha, beta, first, last, bias, act);
}

// tile_bf16 for M rows (1 to 4), each row's accumulators split over U
// pairs of K, as tile_small is for float32.
#define SMALL_TILE_BF16(M, U)                                                                                     \
	BF16 static void tile_bf16_small##M(int kp, const unsigned short *a, long lda, const unsigned short *bp,       \
	                                    float *c, long ldc, __mmask16 m0, __mmask16 m1, int first, int last,       \
	                                    const float *bias, int act) {                                              \
		__m512 acc[M][U][2];                                                                                      \
		for (int i = 0; i < M; i++)                                                                               \
			for (int u = 0; u < U; u++) acc[i][u][0] = acc[i][u][1] = _mm512_setzero_ps();                        \
		int q = 0;                                                                                                \
		for (; q + U <= kp; q += U) {                                                                             \
			for (int u = 0; u < U; u++) {                                                                         \
				__m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + (q + u) * 64);                                   \
				__m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + (q + u) * 64 + 32);                              \
				for (int i = 0; i < M; i++) {                                                                     \
					__m512bh av = (__m512bh)_mm512_set1_epi32(((const int *)(a + i * lda))[q + u]);              \
					acc[i][u][0] = _mm512_dpbf16_ps(acc[i][u][0], av, b0);                                        \
					acc[i][u][1] = _mm512_dpbf16_ps(acc[i][u][1], av, b1);                                        \
				}                                                                                                 \
			}                                                                                                     \
		}                                                                                                         \
		for (; q < kp; q++) {                                                                                     \
			__m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + q * 64), b1 = (__m512bh)_mm512_loadu_si512(bp + q * 64 + 32); \
			for (int i = 0; i < M; i++) {                                                                         \
				__m512bh av = (__m512bh)_mm512_set1_epi32(((const int *)(a + i * lda))[q]);                      \
				acc[i][0][0] = _mm512_dpbf16_ps(acc[i][0][0], av, b0);                                            \
				acc[i][0][1] = _mm512_dpbf16_ps(acc[i][0][1], av, b1);                                            \
			}                                                                                                     \
		}                                                                                                         \
		__m512 out[8][2];                                                                                         \
		for (int i = 0; i < M; i++) {                                                                             \
			out[i][0] = acc[i][0][0];                                                                             \
			out[i][1] = acc[i][0][1];                                                                             \
			for (int u = 1; u < U; u++) {                                                                         \
				out[i][0] = _mm512_add_ps(out[i][0], acc[i][u][0]);                                               \
				out[i][1] = _mm512_add_ps(out[i][1], acc[i][u][1]);                                               \
			}                                                                                                     \
		}                                                                                                         \
		store16x2(out, M, c, ldc, m0, m1, 1, 0, first, last, bias, act);                                          \
	}
SMALL_TILE_BF16(1, 4)
SMALL_TILE_BF16(2, 4)
SMALL_TILE_BF16(3, 2)
SMALL_TILE_BF16(4, 2)
#undef SMALL_TILE_BF16

// y[m, n] = act(x[m, k] . B + bias) on panels p0 up to p1 of B packed by
// ss_pack_b_bf16: x is rounded to bfloat16 a block at a time, the products
// summed in float32.
BF16 void ss_linear_bf16(int m, int n, int k, const float *x, const unsigned short *bp, float *y,
                         const float *bias, int act, int p0, int p1) {
	int kpAll = (k + 1) / 2;
	if (m <= 4 && (long)m * 2 * kpAll <= MC * KC) {
		// As gemm_avx512's few rows: x in bfloat16 once, each panel whole.
		int ld = 2 * kpAll;
		for (int i = 0; i < m; i++) {
			unsigned short *dst = blockA + (long)i * ld;
			const float *src = x + (long)i * k;
			int p = 0;
			for (; p + 32 <= k; p += 32)
				_mm512_storeu_si512(dst + p, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + p + 16), _mm512_loadu_ps(src + p)));
			for (; p < k; p++) dst[p] = bf16_of(src[p]);
			if (k & 1) dst[k] = 0;
		}
		for (int p = p0; p < p1; p++) {
			int j0 = p * 32, w = n - j0;
			__mmask16 m0 = w >= 16 ? 0xffff : (__mmask16)((1u << w) - 1);
			__mmask16 m1 = w >= 32 ? 0xffff : w <= 16 ? 0 : (__mmask16)((1u << (w - 16)) - 1);
			const unsigned short *bs = bp + (long)p * kpAll * 64;
			const float *bb = bias ? bias + j0 : 0;
			float *yi = y + j0;
			switch (m) {
			case 1: tile_bf16_small1(kpAll, blockA, ld, bs, yi, n, m0, m1, 1, 1, bb, act); break;
			case 2: tile_bf16_small2(kpAll, blockA, ld, bs, yi, n, m0, m1, 1, 1, bb, act); break;
			case 3: tile_bf16_small3(kpAll, blockA, ld, bs, yi, n, m0, m1, 1, 1, bb, act); break;
			default: tile_bf16_small4(kpAll, blockA, ld, bs, yi, n, m0, m1, 1, 1, bb, act); break;
			}
		}
		return;
	}
	for (int q0 = p0; q0 < p1; q0 += NC / 32) {
		int q1 = q0 + NC / 32 < p1 ? q0 + NC / 32 : p1;
		for (int i0 = 0; i0 < m; i0 += MC) {
			int mc = m - i0 < MC ? m - i0 : MC, rows = (mc + 7) / 8 * 8;
			for (int k0 = 0; k0 < k; k0 += KC) {
				int kc = k - k0 < KC ? k - k0 : KC, kp = (kc + 1) / 2, ld = 2 * kp;
				int first = k0 == 0, last = k0 + kc == k;
				for (int i = 0; i < rows; i++) {
					unsigned short *dst = blockA + (long)i * ld;
					if (i >= mc) {
						memset(dst, 0, sizeof(unsigned short) * ld);
						continue;
					}
					const float *src = x + (long)(i0 + i) * k + k0;
					int p = 0;
					for (; p + 32 <= kc; p += 32)
						_mm512_storeu_si512(dst + p, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + p + 16), _mm512_loadu_ps(src + p)));
					for (; p < kc; p++) dst[p] = bf16_of(src[p]);
					if (kc & 1) dst[kc] = 0;
				}
				for (int p = q0; p < q1; p++) {
					int j0 = p * 32, w = n - j0;
					__mmask16 m0 = w >= 16 ? 0xffff : (__mmask16)((1u << w) - 1);
					__mmask16 m1 = w >= 32 ? 0xffff : w <= 16 ? 0 : (__mmask16)((1u << (w - 16)) - 1);
					const unsigned short *bs = bp + (long)p * kpAll * 64 + (long)(k0 / 2) * 64;
					const float *bb = bias ? bias + j0 : 0;
					for (int i = 0; i < mc; i += 8) {
						int mr = mc - i < 8 ? mc - i : 8;
						const unsigned short *ai = blockA + (long)i * ld;
						float *yi = y + (long)(i0 + i) * n + j0;
						switch (mr) {
						case 1: tile_bf16_small1(kp, ai, ld, bs, yi, n, m0, m1, first, last, bb, act); break;
						case 2: tile_bf16_small2(kp, ai, ld, bs, yi, n, m0, m1, first, last, bb, act); break;
						case 3: tile_bf16_small3(kp, ai, ld, bs, yi, n, m0, m1, first, last, bb, act); break;
						case 4: tile_bf16_small4(kp, ai, ld, bs, yi, n, m0, m1, first, last, bb, act); break;
						default: tile_bf16(mr, kp, ai, ld, bs, yi, n, m0, m1, 1, 0, first, last, bb, act);
						}
					}
				}
			}
		}
	}
}

// ---------------------------------------------------------------- entry points

void ss_gemm_packed(int isa, int m, int n, int k, float alpha, const float *a, int lda, const float *bp,
                    float beta, float *c, int ldc, const float *bias, int act, int p0, int p1) {
	if (m <= 0 || n <= 0 || p0 >= p1) return;
	if (k <= 0) {
		// No products: C = beta*C (+ bias, activation) over the panels' columns.
		int nr = ss_panel_width(isa), j0 = p0 * nr, j1 = p1 * nr < n ? p1 * nr : n;
		for (int i = 0; i < m; i++)
			for (int j = j0; j < j1; j++) {
				float v = beta == 0 ? 0 : beta * c[(long)i * ldc + j];
				if (bias) v += bias[j];
				if (act == SS_ACT_RELU && v < 0) v = 0;
				if (act == SS_ACT_GELU) v = 0.5f * v * (1 + erff(v * 0.70710678118654752f));
				if (act == SS_ACT_GELU_TANH) v = v / (1 + expf(-2 * 0.7978845608028654f * (v + 0.044715f * v * v * v)));
				c[(long)i * ldc + j] = v;
			}
		return;
	}
	if (isa == SS_ISA_AVX512)
		gemm_avx512(m, n, k, alpha, a, lda, bp, beta, c, ldc, bias, act, p0, p1);
	else
		gemm_avx2(m, n, k, alpha, a, lda, bp, beta, c, ldc, bias, act, p0, p1);
}

// The scratch a thread packs an unpacked B into, grown as needed and kept
// for the thread's life (the OS threads that run Go's cgo calls are few and
// long-lived).
static __thread float *scratch;
static __thread long scratchLen;

int ss_gemm(int isa, int trans, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
            float beta, float *c, int ldc) {
	int nr = ss_panel_width(isa);
	long need = (long)((n + nr - 1) / nr) * nr * (k > 0 ? k : 1);
	if (need > scratchLen) {
		float *s = aligned_alloc(64, ((need * sizeof(float)) + 63) / 64 * 64);
		if (!s) return -1;
		free(scratch);
		scratch = s;
		scratchLen = need;
	}
	if (k > 0) ss_pack_b(nr, k, n, b, ldb, trans, scratch);
	ss_gemm_packed(isa, m, n, k, alpha, a, lda, scratch, beta, c, ldc, 0, SS_ACT_NONE, 0, (n + nr - 1) / nr);
	return 0;
}

// The reciprocal row sums of an attention head's softmax, grown as needed
// and kept for the thread's life, as scratch is.
static __thread float *invSums;
static __thread long invLen;

// ss_attention_head is one attention head of one sequence of S rows (row
// stride ld): scores = q . k^T * scale + keys (keys NULL: none), its rows'
// softmax, ctx = softmax . v, on the S x S block scores. The softmax is
// left unscaled and ctx's rows (d wide) are scaled by the reciprocal sums
// instead. 0, or -1 out of memory for the packing scratch.
int ss_attention_head(int isa, int S, int d, long ld, float scale, const float *q, const float *k, const float *v,
                      const float *keys, float *ctx, float *scores) {
	if (S <= 0) return 0;
	if (S > invLen) {
		float *s = malloc(sizeof(float) * S);
		if (!s) return -1;
		free(invSums);
		invSums = s;
		invLen = S;
	}
	if (ss_gemm(isa, 1, S, S, d, scale, q, ld, k, ld, 0, scores, S)) return -1;
	ss_softmax_rows_unscaled(scores, keys, S, S, invSums);
	if (ss_gemm(isa, 0, S, d, S, 1, scores, S, v, ld, 0, ctx, ld)) return -1;
	ss_scale_rows(ctx, S, d, ld, invSums);
	return 0;
}
