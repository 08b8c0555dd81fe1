//go:build cgo && !purego

// Q8_0 products: int8 weights with a float scale per block of 32 (GGUF's
// Q8_0), times activations quantized the same way, the block's integer
// dot product scaled by both scales and summed in float32, as llama.cpp's
// vec_dot_q8_0_q8_0 does. The layout (q8.go) puts, for each output row,
// 16 blocks in a group of 512 bytes whose 64-byte vector t holds 4 bytes
// (4t..4t+3) of each of the 16 blocks, lane j being block j: a dot
// product instruction then sums each block in a lane of its own, and a
// group ends with one vector of 16 block sums, scaled by 16 scales of each
// side loaded whole.
//
// The integer products take the sign trick: |x| (unsigned) times w with
// x's sign, so no bias or correction is needed; |x| and |w| are at most
// 127 (the quantizers never write -128), which keeps AVX2's pairwise int16
// sums from saturating.

#include <immintrin.h>
#include <math.h>

#include "kernels_avx2.h"
#include "q8_native.h"

#define VNNI __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,fma")))
#define AVX2 __attribute__((target("avx2,fma")))

int ss_q8_level(void) {
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni"))
		return SS_Q8_VNNI;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SS_Q8_AVX2;
	return SS_Q8_NONE;
}

// The epilogue of one output: the bias, then the activation.
static inline float epilogue(float v, const float *bias, int o, int act) {
	if (bias) v += bias[o];
	switch (act) {
	case SS_ACT_RELU: return v < 0 ? 0 : v;
	case SS_ACT_GELU: return 0.5f * v * (1 + erff(v * 0.70710678118654752f));
	case SS_ACT_GELU_TANH: return v / (1 + expf(-2 * 0.7978845608028654f * (v + 0.044715f * v * v * v)));
	}
	return v;
}

// Rows of x (up to 4) against one output row of w: R row sums.
#define VNNI_ROWS(R)                                                                                              \
	VNNI static void vnni_row##R(int kg, const signed char *qx, long ldq, const float *dx, long ldd,           \
	                             const signed char *w, const float *dw, float *out) {                           \
		__m512 f[R];                                                                                          \
		for (int i = 0; i < R; i++) f[i] = _mm512_setzero_ps();                                               \
		const __m512i zero = _mm512_setzero_si512();                                                          \
		for (int g = 0; g < kg; g++) {                                                                        \
			__m512i acc[R];                                                                                   \
			for (int i = 0; i < R; i++) acc[i] = zero;                                                        \
			const signed char *wg = w + (long)g * 512;                                                        \
			for (int t = 0; t < 8; t++) {                                                                     \
				__m512i wv = _mm512_loadu_si512(wg + t * 64);                                                 \
				for (int i = 0; i < R; i++) {                                                                 \
					__m512i a = _mm512_loadu_si512(qx + i * ldq + (long)g * 512 + t * 64);                   \
					__mmask64 neg = _mm512_movepi8_mask(a);                                                   \
					__m512i sw = _mm512_mask_sub_epi8(wv, neg, zero, wv);                                     \
					acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_abs_epi8(a), sw);                             \
				}                                                                                             \
			}                                                                                                 \
			__m512 sw = _mm512_loadu_ps(dw + (long)g * 16);                                                   \
			for (int i = 0; i < R; i++) {                                                                     \
				__m512 s = _mm512_mul_ps(sw, _mm512_loadu_ps(dx + i * ldd + (long)g * 16));                   \
				f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i]), s, f[i]);                                  \
			}                                                                                                 \
		}                                                                                                     \
		for (int i = 0; i < R; i++) out[i] = _mm512_reduce_add_ps(f[i]);                                      \
	}
VNNI_ROWS(1)
VNNI_ROWS(2)
VNNI_ROWS(3)
VNNI_ROWS(4)
#undef VNNI_ROWS

AVX2 static inline float hsum8(__m256 v) {
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

// As the VNNI rows, each 64-byte vector as two halves (blocks 0-7 and
// 8-15 of the group): |x| times signed w in int16 pairs, then pairs summed
// to int32 lanes.
#define AVX2_ROWS(R)                                                                                              \
	AVX2 static void avx2_row##R(int kg, const signed char *qx, long ldq, const float *dx, long ldd,          \
	                             const signed char *w, const float *dw, float *out) {                           \
		__m256 f[R];                                                                                          \
		for (int i = 0; i < R; i++) f[i] = _mm256_setzero_ps();                                               \
		const __m256i ones = _mm256_set1_epi16(1);                                                            \
		for (int g = 0; g < kg; g++) {                                                                        \
			__m256i lo[R], hi[R];                                                                             \
			for (int i = 0; i < R; i++) lo[i] = hi[i] = _mm256_setzero_si256();                              \
			const signed char *wg = w + (long)g * 512;                                                        \
			for (int t = 0; t < 8; t++) {                                                                     \
				__m256i w0 = _mm256_loadu_si256((const __m256i *)(wg + t * 64));                              \
				__m256i w1 = _mm256_loadu_si256((const __m256i *)(wg + t * 64 + 32));                         \
				for (int i = 0; i < R; i++) {                                                                 \
					const signed char *a = qx + i * ldq + (long)g * 512 + t * 64;                             \
					__m256i a0 = _mm256_loadu_si256((const __m256i *)a);                                      \
					__m256i a1 = _mm256_loadu_si256((const __m256i *)(a + 32));                               \
					__m256i p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(a0), _mm256_sign_epi8(w0, a0));         \
					__m256i p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(a1), _mm256_sign_epi8(w1, a1));         \
					lo[i] = _mm256_add_epi32(lo[i], _mm256_madd_epi16(p0, ones));                             \
					hi[i] = _mm256_add_epi32(hi[i], _mm256_madd_epi16(p1, ones));                             \
				}                                                                                             \
			}                                                                                                 \
			__m256 s0 = _mm256_loadu_ps(dw + (long)g * 16), s1 = _mm256_loadu_ps(dw + (long)g * 16 + 8);      \
			for (int i = 0; i < R; i++) {                                                                     \
				const float *d = dx + i * ldd + (long)g * 16;                                                 \
				f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[i]), _mm256_mul_ps(s0, _mm256_loadu_ps(d)), f[i]); \
				f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[i]), _mm256_mul_ps(s1, _mm256_loadu_ps(d + 8)), f[i]); \
			}                                                                                                 \
		}                                                                                                     \
		for (int i = 0; i < R; i++) out[i] = hsum8(f[i]);                                                     \
	}
AVX2_ROWS(1)
AVX2_ROWS(2)
AVX2_ROWS(3)
AVX2_ROWS(4)
#undef AVX2_ROWS

typedef void (*rows_fn)(int, const signed char *, long, const float *, long, const signed char *, const float *, float *);

// y[m, n] = act(x . W^T + bias) on the output rows of panels p0 up to p1
// (16 rows a panel), x given quantized: qx [m, kg*512] in the layout of
// the weights' rows, dx [m, kg*16]. A panel's rows (16 x k bytes) stay in
// cache while the rows of x go past them four at a time.
void ss_linear_q8(int level, int m, int n, int kg, const signed char *qx, const float *dx, const signed char *w,
                  const float *dw, float *y, const float *bias, int act, int p0, int p1) {
	rows_fn fns[5];
	if (level == SS_Q8_VNNI) {
		fns[1] = vnni_row1, fns[2] = vnni_row2, fns[3] = vnni_row3, fns[4] = vnni_row4;
	} else {
		fns[1] = avx2_row1, fns[2] = avx2_row2, fns[3] = avx2_row3, fns[4] = avx2_row4;
	}
	long ldq = (long)kg * 512, ldd = (long)kg * 16;
	int o1 = p1 * 16 < n ? p1 * 16 : n;
	float out[4];
	for (int o0 = p0 * 16; o0 < o1; o0 += 16) {
		int oe = o0 + 16 < o1 ? o0 + 16 : o1;
		for (int i0 = 0; i0 < m; i0 += 4) {
			int r = m - i0 < 4 ? m - i0 : 4;
			for (int o = o0; o < oe; o++) {
				fns[r](kg, qx + i0 * ldq, ldq, dx + i0 * ldd, ldd, w + o * ldq, dw + o * ldd, out);
				for (int i = 0; i < r; i++) y[(long)(i0 + i) * n + o] = epilogue(out[i], bias, o, act);
			}
		}
	}
}
