// The element-wise math both native files use, for 8 lanes of AVX2 + FMA:
// e^x, and GELU exact and in its tanh approximation. They are the same
// formulas as the Go versions in kernels.go (exp by 2^n * 2^f with a
// degree-5 Taylor polynomial, erf by Abramowitz and Stegun 7.1.26), so the
// products' fused epilogues (gemm_native.c) and the element-wise passes
// (kernels_avx2.c) answer alike.

#ifndef SS_AVX2_MATH_H
#define SS_AVX2_MATH_H

#include <immintrin.h>
#include <math.h>

#ifndef AVX2
#define AVX2 __attribute__((target("avx2,fma")))
#endif

// e^x for 8 lanes; 0 below -87, +Inf above 88, like exp32.
AVX2 static inline __m256 exp8(__m256 x) {
	__m256 lo = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
	__m256 hi = _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_GT_OQ);
	x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
	__m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.442695041f));
	__m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 f = _mm256_sub_ps(t, n);
	__m256 p = _mm256_set1_ps(0.001333355f);
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.009618129f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.05550411f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.2402265f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931472f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
	__m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
	__m256 r = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
	r = _mm256_andnot_ps(lo, r);
	return _mm256_blendv_ps(r, _mm256_set1_ps(INFINITY), hi);
}

// GELU(x) = x/2 * (1 + erf(x/sqrt 2)) for 8 lanes.
AVX2 static inline __m256 gelu8(__m256 v) {
	const __m256 one = _mm256_set1_ps(1.0f);
	__m256 x = _mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f));
	__m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
	__m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
	__m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), ax, one));
	__m256 p = _mm256_set1_ps(1.061405429f);
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
	p = _mm256_mul_ps(p, t);
	__m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(ax, ax)));
	__m256 erf = _mm256_fnmadd_ps(p, e, one);
	erf = _mm256_or_ps(erf, sign);
	return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(one, erf));
}

// GELU's tanh approximation, x / (1 + e^-2u), u = sqrt(2/pi) (x + 0.044715
// x^3), for 8 lanes; e^-2u is +Inf for large negative x, and x/Inf is -0.
AVX2 static inline __m256 gelu_tanh8(__m256 v) {
	__m256 v3 = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
	__m256 u = _mm256_mul_ps(_mm256_set1_ps(-2.0f * 0.7978845608028654f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), v3, v));
	return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(u)));
}

#endif
