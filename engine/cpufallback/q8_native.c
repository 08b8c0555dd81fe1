//go:build cgo && !purego

// Q8_0 products: int8 weights with a float scale per block of 32 (GGUF's
// Q8_0), times activations quantized the same way, each block's integer
// dot product scaled by both scales and summed in float32, as llama.cpp's
// vec_dot_q8_0_q8_0 does.
//
// Layout (q8.go): a panel of 16 output rows keeps, for each block of 32
// inputs, 8 vectors of 64 bytes; vector t holds inputs 4t..4t+3 of the
// block for each of the 16 rows, row j at bytes 4j..4j+3. A row of x
// broadcasts 4 of its bytes against a vector, and one dot-product
// instruction adds them into the 16 rows' sums at once: no horizontal
// sums, and the panel's vectors are read once for up to 4 rows of x.
//
// AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes, so the
// weights go in as w+128 (a flip of the sign bit) and each block's sum
// takes off 128 times the sum of x's block (kept with x's quantization).
// AVX2: |x| times w with x's sign (maddubs), whose int16 pairs cannot
// saturate because the quantizers never write -128.

// The row and panel loops are short and constant (R, 2, 8): unrolled, the
// accumulators stay in registers.
#pragma GCC optimize("O3", "unroll-loops")

#include <immintrin.h>
#include <math.h>

#include "kernels_avx2.h"
#include "q8_native.h"

#define VNNI __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,fma")))
#define AVX2 __attribute__((target("avx2,fma,f16c")))

int ss_q8_level(void) {
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni"))
		return SS_Q8_VNNI;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return SS_Q8_AVX2;
	return SS_Q8_NONE;
}

// A block's 16 weight scales, stored in float16 as Q8_0 keeps them.
VNNI static inline __m512 half16(const unsigned short *d) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d)); }
AVX2 static inline __m256 half8(const unsigned short *d) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d)); }

// The epilogue of outputs o0 up to o1 of one row: the bias, then the
// activation.
static void epilogue(float *y, const float *bias, int o0, int o1, int act) {
	for (int o = o0; o < o1; o++) {
		float v = y[o - o0];
		if (bias) v += bias[o];
		switch (act) {
		case SS_ACT_RELU: v = v < 0 ? 0 : v; break;
		case SS_ACT_GELU: v = 0.5f * v * (1 + erff(v * 0.70710678118654752f)); break;
		case SS_ACT_GELU_TANH: v = v / (1 + expf(-2 * 0.7978845608028654f * (v + 0.044715f * v * v * v))); break;
		}
		y[o - o0] = v;
	}
}

// R rows of x against one panel: the 16 sums of each row into out[i].
#define VNNI_ROWS(R)                                                                                              \
	VNNI static void vnni_panel##R(int kb, const signed char *qx, long ldq, const float *dx, const int *sx,    \
	                               long ldd, const signed char *w, const unsigned short *dw, __m512 *out) {             \
		__m512 f[R];                                                                                          \
		for (int i = 0; i < R; i++) f[i] = _mm512_setzero_ps();                                               \
		const __m512i flip = _mm512_set1_epi8((char)0x80);                                                    \
		for (int b = 0; b < kb; b++) {                                                                        \
			__m512i acc[R];                                                                                   \
			for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_si512();                                      \
			const signed char *wb = w + (long)b * 512;                                                        \
			for (int t = 0; t < 8; t++) {                                                                     \
				__m512i wv = _mm512_xor_si512(_mm512_loadu_si512(wb + t * 64), flip);                         \
				for (int i = 0; i < R; i++) {                                                                 \
					int xa = *(const int *)(qx + i * ldq + (long)b * 32 + t * 4);                             \
					acc[i] = _mm512_dpbusd_epi32(acc[i], wv, _mm512_set1_epi32(xa));                          \
				}                                                                                             \
			}                                                                                                 \
			__m512 s = half16(dw + (long)b * 16);                                                    \
			for (int i = 0; i < R; i++) {                                                                     \
				__m512i dot = _mm512_sub_epi32(acc[i], _mm512_set1_epi32(128 * sx[i * ldd + b]));            \
				f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(dx[i * ldd + b])), f[i]); \
			}                                                                                                 \
		}                                                                                                     \
		for (int i = 0; i < R; i++) out[i] = f[i];                                                            \
	}
VNNI_ROWS(1)
VNNI_ROWS(2)
VNNI_ROWS(3)
VNNI_ROWS(4)
#undef VNNI_ROWS

// R rows of x against two panels at once (32 output rows): each 4 bytes
// of x broadcast once for both, which a panel alone spends on 16 rows.
#define VNNI_ROWS2(R)                                                                                             \
	VNNI static void vnni_pair##R(int kb, const signed char *qx, long ldq, const float *dx, const int *sx,     \
	                              long ldd, const signed char *w, const unsigned short *dw, long pstride, __m512 *out) { \
		__m512 f[R][2];                                                                                       \
		for (int i = 0; i < R; i++) f[i][0] = f[i][1] = _mm512_setzero_ps();                                  \
		const __m512i flip = _mm512_set1_epi8((char)0x80);                                                    \
		const signed char *w1 = w + pstride * 512;                                                            \
		const unsigned short *dw1 = dw + pstride * 16;                                                                 \
		for (int b = 0; b < kb; b++) {                                                                        \
			__m512i acc[R][2];                                                                                \
			for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm512_setzero_si512();                      \
			const signed char *wa = w + (long)b * 512, *wb = w1 + (long)b * 512;                              \
			for (int t = 0; t < 8; t++) {                                                                     \
				__m512i va = _mm512_xor_si512(_mm512_loadu_si512(wa + t * 64), flip);                         \
				__m512i vb = _mm512_xor_si512(_mm512_loadu_si512(wb + t * 64), flip);                         \
				for (int i = 0; i < R; i++) {                                                                 \
					__m512i xa = _mm512_set1_epi32(*(const int *)(qx + i * ldq + (long)b * 32 + t * 4));      \
					acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], va, xa);                                       \
					acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], vb, xa);                                       \
				}                                                                                             \
			}                                                                                                 \
			__m512 sa = half16(dw + (long)b * 16), sb = half16(dw1 + (long)b * 16);         \
			for (int i = 0; i < R; i++) {                                                                     \
				__m512i c = _mm512_set1_epi32(128 * sx[i * ldd + b]);                                         \
				__m512 d = _mm512_set1_ps(dx[i * ldd + b]);                                                   \
				f[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][0], c)), _mm512_mul_ps(sa, d), f[i][0]); \
				f[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][1], c)), _mm512_mul_ps(sb, d), f[i][1]); \
			}                                                                                                 \
		}                                                                                                     \
		for (int i = 0; i < R; i++) out[2 * i] = f[i][0], out[2 * i + 1] = f[i][1];                          \
	}
VNNI_ROWS2(1)
VNNI_ROWS2(2)
VNNI_ROWS2(3)
VNNI_ROWS2(4)
#undef VNNI_ROWS2

// As the VNNI panel, each 64-byte vector as two halves (rows 0-7 and
// 8-15 of the panel): |x| against w with x's sign, int16 pairs summed to
// int32 lanes.
#define AVX2_ROWS(R)                                                                                              \
	AVX2 static void avx2_panel##R(int kb, const signed char *qx, long ldq, const float *dx, long ldd,        \
	                               const signed char *w, const unsigned short *dw, __m256 *out) {                       \
		__m256 f0[R], f1[R];                                                                                  \
		for (int i = 0; i < R; i++) f0[i] = f1[i] = _mm256_setzero_ps();                                      \
		const __m256i ones = _mm256_set1_epi16(1);                                                            \
		for (int b = 0; b < kb; b++) {                                                                        \
			__m256i lo[R], hi[R];                                                                             \
			for (int i = 0; i < R; i++) lo[i] = hi[i] = _mm256_setzero_si256();                              \
			const signed char *wb = w + (long)b * 512;                                                        \
			for (int t = 0; t < 8; t++) {                                                                     \
				__m256i w0 = _mm256_loadu_si256((const __m256i *)(wb + t * 64));                              \
				__m256i w1 = _mm256_loadu_si256((const __m256i *)(wb + t * 64 + 32));                         \
				for (int i = 0; i < R; i++) {                                                                 \
					__m256i xa = _mm256_set1_epi32(*(const int *)(qx + i * ldq + (long)b * 32 + t * 4));      \
					__m256i ax = _mm256_abs_epi8(xa);                                                         \
					lo[i] = _mm256_add_epi32(lo[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xa)), ones)); \
					hi[i] = _mm256_add_epi32(hi[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xa)), ones)); \
				}                                                                                             \
			}                                                                                                 \
			__m256 s0 = half8(dw + (long)b * 16), s1 = half8(dw + (long)b * 16 + 8);      \
			for (int i = 0; i < R; i++) {                                                                     \
				__m256 d = _mm256_set1_ps(dx[i * ldd + b]);                                                   \
				f0[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[i]), _mm256_mul_ps(s0, d), f0[i]);              \
				f1[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[i]), _mm256_mul_ps(s1, d), f1[i]);              \
			}                                                                                                 \
		}                                                                                                     \
		for (int i = 0; i < R; i++) out[2 * i] = f0[i], out[2 * i + 1] = f1[i];                              \
	}
AVX2_ROWS(1)
AVX2_ROWS(2)
AVX2_ROWS(3)
AVX2_ROWS(4)
#undef AVX2_ROWS

// Q4_0 (q4.go): a panel keeps, for each block of 32 inputs, 4 vectors of
// 64 bytes; byte 4j+c of vector t holds row j's input 4t+c in its low
// nibble and input 16+4t+c in its high one, each the weight plus 8 (0 to
// 15). The nibbles go in as unsigned bytes against x's signed ones, and
// each block's sum takes off 8 times the sum of x's block.
#define VNNI_Q4_ROWS(R)                                                                                           \
	VNNI static void vnni_q4_panel##R(int kb, const signed char *qx, long ldq, const float *dx, const int *sx, \
	                                  long ldd, const unsigned char *w, const unsigned short *dw, __m512 *out) { \
		__m512 f[R];                                                                                          \
		for (int i = 0; i < R; i++) f[i] = _mm512_setzero_ps();                                               \
		const __m512i low = _mm512_set1_epi8(0x0f);                                                           \
		for (int b = 0; b < kb; b++) {                                                                        \
			__m512i acc[R];                                                                                   \
			for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_si512();                                      \
			const unsigned char *wb = w + (long)b * 256;                                                      \
			for (int t = 0; t < 4; t++) {                                                                     \
				__m512i v = _mm512_loadu_si512(wb + t * 64);                                                  \
				__m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);    \
				for (int i = 0; i < R; i++) {                                                                 \
					const signed char *xb = qx + i * ldq + (long)b * 32 + t * 4;                              \
					acc[i] = _mm512_dpbusd_epi32(acc[i], lo, _mm512_set1_epi32(*(const int *)xb));            \
					acc[i] = _mm512_dpbusd_epi32(acc[i], hi, _mm512_set1_epi32(*(const int *)(xb + 16)));     \
				}                                                                                             \
			}                                                                                                 \
			__m512 s = half16(dw + (long)b * 16);                                                             \
			for (int i = 0; i < R; i++) {                                                                     \
				__m512i dot = _mm512_sub_epi32(acc[i], _mm512_set1_epi32(8 * sx[i * ldd + b]));              \
				f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, _mm512_set1_ps(dx[i * ldd + b])), f[i]); \
			}                                                                                                 \
		}                                                                                                     \
		for (int i = 0; i < R; i++) out[i] = f[i];                                                            \
	}
VNNI_Q4_ROWS(1)
VNNI_Q4_ROWS(2)
VNNI_Q4_ROWS(3)
VNNI_Q4_ROWS(4)
#undef VNNI_Q4_ROWS

// As the VNNI Q4_0 panel, each vector as two halves (rows 0-7 and 8-15):
// nibble times x in int16 pairs (at most 2*15*127), a block's 8 such
// products summed in int16 (at most 30,480), then to int32 lanes once.
#define AVX2_Q4_ROWS(R)                                                                                           \
	AVX2 static void avx2_q4_panel##R(int kb, const signed char *qx, long ldq, const float *dx, const int *sx, \
	                                  long ldd, const unsigned char *w, const unsigned short *dw, __m256 *out) { \
		__m256 f0[R], f1[R];                                                                                  \
		for (int i = 0; i < R; i++) f0[i] = f1[i] = _mm256_setzero_ps();                                      \
		const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);                              \
		for (int b = 0; b < kb; b++) {                                                                        \
			__m256i lo[R], hi[R];                                                                             \
			for (int i = 0; i < R; i++) lo[i] = hi[i] = _mm256_setzero_si256();                              \
			const unsigned char *wb = w + (long)b * 256;                                                      \
			for (int t = 0; t < 4; t++) {                                                                     \
				__m256i v0 = _mm256_loadu_si256((const __m256i *)(wb + t * 64));                              \
				__m256i v1 = _mm256_loadu_si256((const __m256i *)(wb + t * 64 + 32));                         \
				__m256i l0 = _mm256_and_si256(v0, low), h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low); \
				__m256i l1 = _mm256_and_si256(v1, low), h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low); \
				for (int i = 0; i < R; i++) {                                                                 \
					const signed char *xb = qx + i * ldq + (long)b * 32 + t * 4;                              \
					__m256i xl = _mm256_set1_epi32(*(const int *)xb), xh = _mm256_set1_epi32(*(const int *)(xb + 16)); \
					lo[i] = _mm256_add_epi16(lo[i], _mm256_add_epi16(_mm256_maddubs_epi16(l0, xl), _mm256_maddubs_epi16(h0, xh))); \
					hi[i] = _mm256_add_epi16(hi[i], _mm256_add_epi16(_mm256_maddubs_epi16(l1, xl), _mm256_maddubs_epi16(h1, xh))); \
				}                                                                                             \
			}                                                                                                 \
			__m256 s0 = half8(dw + (long)b * 16), s1 = half8(dw + (long)b * 16 + 8);                          \
			for (int i = 0; i < R; i++) {                                                                     \
				__m256i c = _mm256_set1_epi32(8 * sx[i * ldd + b]);                                           \
				__m256 d = _mm256_set1_ps(dx[i * ldd + b]);                                                   \
				__m256i d0 = _mm256_sub_epi32(_mm256_madd_epi16(lo[i], ones), c);                             \
				__m256i d1 = _mm256_sub_epi32(_mm256_madd_epi16(hi[i], ones), c);                             \
				f0[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(s0, d), f0[i]);                 \
				f1[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(s1, d), f1[i]);                 \
			}                                                                                                 \
		}                                                                                                     \
		for (int i = 0; i < R; i++) out[2 * i] = f0[i], out[2 * i + 1] = f1[i];                              \
	}
AVX2_Q4_ROWS(1)
AVX2_Q4_ROWS(2)
AVX2_Q4_ROWS(3)
AVX2_Q4_ROWS(4)
#undef AVX2_Q4_ROWS

VNNI static void linear_q4_vnni(int m, int n, int kb, const signed char *qx, const float *dx, const int *sx,
                                const unsigned char *w, const unsigned short *dw, float *y, const float *bias, int act,
                                int p0, int p1) {
	long ldq = (long)kb * 32, ldd = kb;
	__m512 out[4];
	for (int p = p0; p < p1; p++) {
		int o0 = p * 16, w16 = n - o0 < 16 ? n - o0 : 16;
		__mmask16 mask = w16 == 16 ? 0xffff : (__mmask16)((1u << w16) - 1);
		const unsigned char *wp = w + (long)p * kb * 256;
		const unsigned short *dp = dw + (long)p * kb * 16;
		for (int i0 = 0; i0 < m; i0 += 4) {
			int r = m - i0 < 4 ? m - i0 : 4;
			const signed char *q = qx + i0 * ldq;
			const float *d = dx + i0 * ldd;
			const int *s = sx + i0 * ldd;
			switch (r) {
			case 1: vnni_q4_panel1(kb, q, ldq, d, s, ldd, wp, dp, out); break;
			case 2: vnni_q4_panel2(kb, q, ldq, d, s, ldd, wp, dp, out); break;
			case 3: vnni_q4_panel3(kb, q, ldq, d, s, ldd, wp, dp, out); break;
			default: vnni_q4_panel4(kb, q, ldq, d, s, ldd, wp, dp, out); break;
			}
			for (int i = 0; i < r; i++) {
				float *yi = y + (long)(i0 + i) * n + o0;
				_mm512_mask_storeu_ps(yi, mask, out[i]);
				if (bias || act != SS_ACT_NONE) epilogue(yi, bias, o0, o0 + w16, act);
			}
		}
	}
}

VNNI static void linear_vnni(int m, int n, int kb, const signed char *qx, const float *dx, const int *sx,
                             const signed char *w, const unsigned short *dw, float *y, const float *bias, int act, int p0, int p1) {
	long ldq = (long)kb * 32, ldd = kb;
	__m512 out[8];
	for (int p = p0; p < p1;) {
		// Two panels at once where two remain; one at a single row, where
		// the weights' reads, not the products, bound the time.
		int np = p + 1 < p1 && m > 1 ? 2 : 1;
		const signed char *wp = w + (long)p * kb * 512;
		const unsigned short *dp = dw + (long)p * kb * 16;
		for (int i0 = 0; i0 < m; i0 += 4) {
			int r = m - i0 < 4 ? m - i0 : 4;
			const signed char *q = qx + i0 * ldq;
			const float *d = dx + i0 * ldd;
			const int *s = sx + i0 * ldd;
			if (np == 2) {
				switch (r) {
				case 1: vnni_pair1(kb, q, ldq, d, s, ldd, wp, dp, kb, out); break;
				case 2: vnni_pair2(kb, q, ldq, d, s, ldd, wp, dp, kb, out); break;
				case 3: vnni_pair3(kb, q, ldq, d, s, ldd, wp, dp, kb, out); break;
				default: vnni_pair4(kb, q, ldq, d, s, ldd, wp, dp, kb, out); break;
				}
			} else {
				__m512 one[4];
				switch (r) {
				case 1: vnni_panel1(kb, q, ldq, d, s, ldd, wp, dp, one); break;
				case 2: vnni_panel2(kb, q, ldq, d, s, ldd, wp, dp, one); break;
				case 3: vnni_panel3(kb, q, ldq, d, s, ldd, wp, dp, one); break;
				default: vnni_panel4(kb, q, ldq, d, s, ldd, wp, dp, one); break;
				}
				for (int i = 0; i < r; i++) out[2 * i] = one[i];
			}
			for (int h = 0; h < np; h++) {
				int o0 = (p + h) * 16, w16 = n - o0 < 16 ? n - o0 : 16;
				__mmask16 mask = w16 == 16 ? 0xffff : (__mmask16)((1u << w16) - 1);
				for (int i = 0; i < r; i++) {
					float *yi = y + (long)(i0 + i) * n + o0;
					_mm512_mask_storeu_ps(yi, mask, out[2 * i + h]);
					if (bias || act != SS_ACT_NONE) epilogue(yi, bias, o0, o0 + w16, act);
				}
			}
		}
		p += np;
	}
}

// The AVX2 products of Q8_0 (bits 8) and Q4_0 (bits 4) weights: a panel's
// blocks take bits*64 bytes.
AVX2 static void linear_avx2(int bits, int m, int n, int kb, const signed char *qx, const float *dx, const int *sx,
                             const signed char *w, const unsigned short *dw, float *y, const float *bias, int act,
                             int p0, int p1) {
	long ldq = (long)kb * 32, ldd = kb;
	__m256 out[8];
	float tmp[16];
	for (int p = p0; p < p1; p++) {
		int o0 = p * 16, w16 = n - o0 < 16 ? n - o0 : 16;
		const signed char *wp = w + (long)p * kb * bits * 64;
		const unsigned char *wp4 = (const unsigned char *)wp;
		const unsigned short *dp = dw + (long)p * kb * 16;
		for (int i0 = 0; i0 < m; i0 += 4) {
			int r = m - i0 < 4 ? m - i0 : 4;
			const signed char *q = qx + i0 * ldq;
			const float *d = dx + i0 * ldd;
			const int *s = sx + i0 * ldd;
			switch (bits == 4 ? r + 4 : r) {
			case 1: avx2_panel1(kb, q, ldq, d, ldd, wp, dp, out); break;
			case 2: avx2_panel2(kb, q, ldq, d, ldd, wp, dp, out); break;
			case 3: avx2_panel3(kb, q, ldq, d, ldd, wp, dp, out); break;
			case 4: avx2_panel4(kb, q, ldq, d, ldd, wp, dp, out); break;
			case 5: avx2_q4_panel1(kb, q, ldq, d, s, ldd, wp4, dp, out); break;
			case 6: avx2_q4_panel2(kb, q, ldq, d, s, ldd, wp4, dp, out); break;
			case 7: avx2_q4_panel3(kb, q, ldq, d, s, ldd, wp4, dp, out); break;
			default: avx2_q4_panel4(kb, q, ldq, d, s, ldd, wp4, dp, out); break;
			}
			for (int i = 0; i < r; i++) {
				float *yi = y + (long)(i0 + i) * n + o0;
				_mm256_storeu_ps(tmp, out[2 * i]);
				_mm256_storeu_ps(tmp + 8, out[2 * i + 1]);
				for (int j = 0; j < w16; j++) yi[j] = tmp[j];
				if (bias || act != SS_ACT_NONE) epilogue(yi, bias, o0, o0 + w16, act);
			}
		}
	}
}

// y[m, n] = act(x . W^T + bias) on the output rows of panels p0 up to p1
// (16 rows a panel), x given quantized: qx [m, kb*32], its scales dx and
// block sums sx [m, kb]; w in Q8_0 (bits 8) or Q4_0 (bits 4). A panel
// (16 x k values) stays in cache while the rows of x go past it four at
// a time.
void ss_linear_q8(int level, int bits, int m, int n, int kb, const signed char *qx, const float *dx, const int *sx,
                  const signed char *w, const unsigned short *dw, float *y, const float *bias, int act, int p0, int p1) {
	if (level != SS_Q8_VNNI)
		linear_avx2(bits, m, n, kb, qx, dx, sx, w, dw, y, bias, act, p0, p1);
	else if (bits == 4)
		linear_q4_vnni(m, n, kb, qx, dx, sx, (const unsigned char *)w, dw, y, bias, act, p0, p1);
	else
		linear_vnni(m, n, kb, qx, dx, sx, w, dw, y, bias, act, p0, p1);
}
