#pragma once
// The AVX2 element-wise kernels of kernels_avx2.c; see kernels_native.go.

enum { SS_ACT_NONE = 0, SS_ACT_RELU = 1, SS_ACT_GELU = 2, SS_ACT_GELU_TANH = 3 };

int ss_have_avx2(void);
void ss_bias_act(float *y, const float *bias, int rows, int cols, int act);
void ss_add_softmax(float *y, const float *add, int rows, int cols);
void ss_residual_norm(float *x, const float *y, const float *bias, const float *w, const float *b, int rows, int cols, float eps);
void ss_layer_norm(float *x, const float *w, const float *b, int rows, int cols, float eps);
void ss_softmax_rows_unscaled(float *y, const float *add, int rows, int cols, float *inv);
void ss_scale_rows(float *y, int rows, int cols, long ld, const float *s);
void ss_decode_attention(int group, int hd, int from, int to, const float *kv, long blockStride, int bs,
                         int rowStride, long valOff, const int *table, float scale, const float *q, float *out,
                         float *scores);
void ss_silu_mul(float *gate, const float *up, long n);
