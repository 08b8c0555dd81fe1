//go:build cgo && !purego

// The element-wise passes of a step (bias, activations, softmax, layer
// norm) in AVX2 + FMA, 8 floats at a time. They are the same formulas as
// the Go versions in kernels.go (exp by 2^n * 2^f with a degree-5 Taylor
// polynomial, erf by Abramowitz and Stegun 7.1.26), so both builds answer
// alike to within float32 rounding. Compiled for AVX2 function by function
// and chosen at start-up only where the CPU has AVX2 and FMA.

#include <immintrin.h>
#include <math.h>

#include "avx2_math.h"
#include "kernels_avx2.h"

#define AVX2 __attribute__((target("avx2,fma")))

int ss_have_avx2(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The scalar tails run the same lane code on a padded copy, so that a
// column count that is not a multiple of 8 answers exactly as the rest.
AVX2 static inline __m256 load_tail(const float *p, int n) {
	float buf[8] = {0};
	for (int i = 0; i < n; i++) buf[i] = p[i];
	return _mm256_loadu_ps(buf);
}

AVX2 static inline void store_tail(float *p, __m256 v, int n) {
	float buf[8];
	_mm256_storeu_ps(buf, v);
	for (int i = 0; i < n; i++) p[i] = buf[i];
}

AVX2 void ss_bias_act(float *y, const float *bias, int rows, int cols, int act) {
	for (int r = 0; r < rows; r++) {
		float *row = y + (long)r * cols;
		int j = 0;
		for (; j + 8 <= cols; j += 8) {
			__m256 v = _mm256_add_ps(_mm256_loadu_ps(row + j), _mm256_loadu_ps(bias + j));
			if (act == SS_ACT_GELU) v = gelu8(v);
			else if (act == SS_ACT_GELU_TANH) v = gelu_tanh8(v);
			else if (act == SS_ACT_RELU) v = _mm256_max_ps(v, _mm256_setzero_ps());
			_mm256_storeu_ps(row + j, v);
		}
		if (j < cols) {
			int n = cols - j;
			__m256 v = _mm256_add_ps(load_tail(row + j, n), load_tail(bias + j, n));
			if (act == SS_ACT_GELU) v = gelu8(v);
			else if (act == SS_ACT_GELU_TANH) v = gelu_tanh8(v);
			else if (act == SS_ACT_RELU) v = _mm256_max_ps(v, _mm256_setzero_ps());
			store_tail(row + j, v, n);
		}
	}
}

AVX2 static inline float hsum8(__m256 v) {
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

AVX2 static inline float hmax8(__m256 v) {
	__m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_max_ps(s, _mm_movehl_ps(s, s));
	s = _mm_max_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

// softmax_row_unscaled makes row (cols wide) e^(row + add - max), add
// NULL for none, and returns the reciprocal of its sum.
AVX2 static inline float softmax_row_unscaled(float *row, const float *add, int cols) {
	__m256 mx0 = _mm256_set1_ps(-INFINITY), mx1 = mx0;
	int j = 0;
	if (add) {
		for (; j + 8 <= cols; j += 8) {
			__m256 v = _mm256_add_ps(_mm256_loadu_ps(row + j), _mm256_loadu_ps(add + j));
			_mm256_storeu_ps(row + j, v);
			mx0 = _mm256_max_ps(mx0, v);
		}
	} else {
		for (; j + 16 <= cols; j += 16) {
			mx0 = _mm256_max_ps(mx0, _mm256_loadu_ps(row + j));
			mx1 = _mm256_max_ps(mx1, _mm256_loadu_ps(row + j + 8));
		}
		for (; j + 8 <= cols; j += 8) mx0 = _mm256_max_ps(mx0, _mm256_loadu_ps(row + j));
	}
	float m = hmax8(_mm256_max_ps(mx0, mx1));
	for (; j < cols; j++) {
		if (add) row[j] += add[j];
		if (row[j] > m) m = row[j];
	}
	__m256 vm = _mm256_set1_ps(m), sum0 = _mm256_setzero_ps(), sum1 = sum0, sum2 = sum0, sum3 = sum0;
	// Four vectors at a time: exp8 is a chain of dependent steps, and
	// four chains keep the FMA units busy where one waits on latency.
	for (j = 0; j + 32 <= cols; j += 32) {
		__m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
		__m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j + 8), vm));
		__m256 e2 = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j + 16), vm));
		__m256 e3 = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j + 24), vm));
		_mm256_storeu_ps(row + j, e0);
		_mm256_storeu_ps(row + j + 8, e1);
		_mm256_storeu_ps(row + j + 16, e2);
		_mm256_storeu_ps(row + j + 24, e3);
		sum0 = _mm256_add_ps(sum0, e0);
		sum1 = _mm256_add_ps(sum1, e1);
		sum2 = _mm256_add_ps(sum2, e2);
		sum3 = _mm256_add_ps(sum3, e3);
	}
	sum0 = _mm256_add_ps(sum0, sum2);
	sum1 = _mm256_add_ps(sum1, sum3);
	for (; j + 8 <= cols; j += 8) {
		__m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
		_mm256_storeu_ps(row + j, e);
		sum0 = _mm256_add_ps(sum0, e);
	}
	float tail = 0;
	if (j < cols) {
		int n = cols - j;
		float buf[8];
		_mm256_storeu_ps(buf, exp8(_mm256_sub_ps(load_tail(row + j, n), vm)));
		for (int i = 0; i < n; i++) {
			row[j + i] = buf[i];
			tail += buf[i];
		}
	}
	return 1.0f / (hsum8(_mm256_add_ps(sum0, sum1)) + tail);
}

AVX2 void ss_add_softmax(float *y, const float *add, int rows, int cols) {
	for (int r = 0; r < rows; r++) {
		float *row = y + (long)r * cols;
		float s = softmax_row_unscaled(row, add, cols);
		__m256 inv = _mm256_set1_ps(s);
		int j = 0;
		for (; j + 8 <= cols; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
		for (; j < cols; j++) row[j] *= s;
	}
}

// ss_softmax_rows_unscaled is ss_add_softmax without its last pass: each
// row of y becomes e^(y + add - max), add NULL for none, and inv[r] the
// reciprocal of row r's sum, for the caller to scale what it makes of the
// row (an attention head scales its context rows, S/d times fewer floats
// than the scores).
AVX2 void ss_softmax_rows_unscaled(float *y, const float *add, int rows, int cols, float *inv) {
	for (int r = 0; r < rows; r++) inv[r] = softmax_row_unscaled(y + (long)r * cols, add, cols);
}

// ss_scale_rows multiplies row r of y (cols wide, row stride ld) by s[r].
AVX2 void ss_scale_rows(float *y, int rows, int cols, long ld, const float *s) {
	for (int r = 0; r < rows; r++) {
		float *row = y + r * ld;
		__m256 v = _mm256_set1_ps(s[r]);
		int j = 0;
		for (; j + 8 <= cols; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), v));
		for (; j < cols; j++) row[j] *= s[r];
	}
}

// One row of LayerNorm, two passes for the statistics (mean, then the
// squared deviations) as the Go version does in float64.
AVX2 static inline void norm_row(float *row, const float *w, const float *b, int cols, float eps) {
	__m256 acc = _mm256_setzero_ps();
	int j = 0;
	for (; j + 8 <= cols; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(row + j));
	float sum = hsum8(acc);
	for (; j < cols; j++) sum += row[j];
	float mean = sum / cols;
	__m256 vm = _mm256_set1_ps(mean);
	acc = _mm256_setzero_ps();
	for (j = 0; j + 8 <= cols; j += 8) {
		__m256 d = _mm256_sub_ps(_mm256_loadu_ps(row + j), vm);
		acc = _mm256_fmadd_ps(d, d, acc);
	}
	float ss = hsum8(acc);
	for (; j < cols; j++) ss += (row[j] - mean) * (row[j] - mean);
	float inv = 1.0f / sqrtf(ss / cols + eps);
	__m256 vi = _mm256_set1_ps(inv);
	for (j = 0; j + 8 <= cols; j += 8) {
		__m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm), vi);
		_mm256_storeu_ps(row + j, _mm256_fmadd_ps(d, _mm256_loadu_ps(w + j), _mm256_loadu_ps(b + j)));
	}
	for (; j < cols; j++) row[j] = (row[j] - mean) * inv * w[j] + b[j];
}

AVX2 void ss_residual_norm(float *x, const float *y, const float *bias, const float *w, const float *b, int rows, int cols, float eps) {
	for (int r = 0; r < rows; r++) {
		float *row = x + (long)r * cols;
		const float *add = y + (long)r * cols;
		int j = 0;
		for (; j + 8 <= cols; j += 8) {
			__m256 v = _mm256_add_ps(_mm256_loadu_ps(add + j), _mm256_loadu_ps(bias + j));
			_mm256_storeu_ps(row + j, _mm256_add_ps(_mm256_loadu_ps(row + j), v));
		}
		for (; j < cols; j++) row[j] += add[j] + bias[j];
		norm_row(row, w, b, cols, eps);
	}
}

AVX2 void ss_layer_norm(float *x, const float *w, const float *b, int rows, int cols, float eps) {
	for (int r = 0; r < rows; r++) norm_row(x + (long)r * cols, w, b, cols, eps);
}

// One decode token's attention for the group query heads that share a
// key/value head, over its sequence's cache: keys and values are read in
// place through the block table (position j is at kv + table[j/bs] *
// blockStride + (j%bs) * rowStride, its value valOff further), so the
// cache is read once for the group. q and out hold the group's heads, hd
// apart; scores holds group x (to-from) floats. hd is a multiple of 8.
// Scores first (each key loaded once for every head of the group), then an
// exact softmax (max, e^(s - max), sum), then the weighted values.
AVX2 void ss_decode_attention(int group, int hd, int from, int to, const float *kv, long blockStride, int bs,
                              int rowStride, long valOff, const int *table, float scale, const float *q, float *out,
                              float *scores) {
	int P = to - from;
	// Block by block: position j's row is the block's base plus
	// (j - the block's first position) rows, no division per key.
	for (int b = from / bs, j = from; j < to; b++) {
		const float *base = kv + (long)table[b] * blockStride;
		int end = (b + 1) * bs < to ? (b + 1) * bs : to;
		for (; j < end; j++) {
			const float *k = base + (long)(j - b * bs) * rowStride;
			for (int h = 0; h < group; h++) {
				const float *qh = q + (long)h * hd;
				__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
				int i = 0;
				for (; i + 16 <= hd; i += 16) {
					a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), _mm256_loadu_ps(k + i), a0);
					a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i + 8), _mm256_loadu_ps(k + i + 8), a1);
				}
				if (i < hd) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), _mm256_loadu_ps(k + i), a0);
				scores[h * P + (j - from)] = hsum8(_mm256_add_ps(a0, a1)) * scale;
			}
		}
	}
	for (int h = 0; h < group; h++) {
		float *s = scores + (long)h * P;
		__m256 vm = _mm256_set1_ps(-INFINITY);
		int j = 0;
		for (; j + 8 <= P; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
		float m = hmax8(vm);
		for (; j < P; j++) m = s[j] > m ? s[j] : m;
		__m256 vsum = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
		for (j = 0; j + 8 <= P; j += 8) {
			__m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
			_mm256_storeu_ps(s + j, e);
			vsum = _mm256_add_ps(vsum, e);
		}
		float sum = hsum8(vsum);
		for (; j < P; j++) {
			s[j] = _mm256_cvtss_f32(exp8(_mm256_set1_ps(s[j] - m)));
			sum += s[j];
		}
		__m256 inv = _mm256_set1_ps(1 / sum);
		for (j = 0; j + 8 <= P; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
		for (; j < P; j++) s[j] *= 1 / sum;
	}
	// out_h = sum_j p_h[j] v_j, 32 columns of a head at a time in four
	// accumulators.
	for (int h = 0; h < group; h++) {
		const float *s = scores + (long)h * P;
		float *o = out + (long)h * hd;
		for (int i = 0; i < hd; i += 32) {
			int w = hd - i < 32 ? hd - i : 32;
			__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
			for (int b = from / bs, j = from; j < to; b++) {
				const float *base = kv + valOff + (long)table[b] * blockStride + i;
				int end = (b + 1) * bs < to ? (b + 1) * bs : to;
				for (; j < end; j++) {
					const float *v = base + (long)(j - b * bs) * rowStride;
					__m256 p = _mm256_set1_ps(s[j - from]);
					a0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v), a0);
					if (w > 8) a1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8), a1);
					if (w > 16) a2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 16), a2);
					if (w > 24) a3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 24), a3);
				}
			}
			_mm256_storeu_ps(o + i, a0);
			if (w > 8) _mm256_storeu_ps(o + i + 8, a1);
			if (w > 16) _mm256_storeu_ps(o + i + 16, a2);
			if (w > 24) _mm256_storeu_ps(o + i + 24, a3);
		}
	}
}

// ss_silu_mul makes gate[i] = silu(gate[i]) * up[i] (SwiGLU), n floats.
AVX2 void ss_silu_mul(float *gate, const float *up, long n) {
	const __m256 one = _mm256_set1_ps(1.0f);
	long i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 g = _mm256_loadu_ps(gate + i);
		__m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
		_mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
	}
	for (; i < n; i++) {
		float e = _mm256_cvtss_f32(exp8(_mm256_set1_ps(-gate[i])));
		gate[i] = gate[i] / (1 + e) * up[i];
	}
}
