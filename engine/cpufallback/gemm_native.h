// The matrix-product kernels of gemm_native.c; see gemm_native.go.

#include "kernels_avx2.h"

enum { SS_ISA_NONE = 0, SS_ISA_AVX2 = 1, SS_ISA_AVX512 = 2 };

int ss_cpu_level(void);
int ss_have_avx512bf16(void);
int ss_panel_width(int isa);
void ss_pack_b(int nr, int k, int n, const float *b, int ldb, int trans, float *out);
void ss_gemm_packed(int isa, int m, int n, int k, float alpha, const float *a, int lda, const float *bp,
                    float beta, float *c, int ldc, const float *bias, int act, int p0, int p1);
int ss_gemm(int isa, int trans, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
            float beta, float *c, int ldc);
void ss_pack_b_bf16(int k, int n, const float *b, int ldb, unsigned short *out);
void ss_linear_bf16(int m, int n, int k, const float *x, const unsigned short *bp, float *y,
                    const float *bias, int act, int p0, int p1);
int ss_attention_head(int isa, int S, int d, long ld, float scale, const float *q, const float *k, const float *v,
                      const float *keys, float *ctx, float *scores);
