#pragma once
// Q8_0 and Q4_0 products of q8_native.c; see q8.go and q4.go for the
// layouts.

enum { SS_Q8_NONE = 0, SS_Q8_AVX2 = 1, SS_Q8_VNNI = 2 };

int ss_q8_level(void);
void ss_linear_q8(int level, int bits, int m, int n, int kb, const signed char *qx, const float *dx, const int *sx,
                  const signed char *w, const unsigned short *dw, float *y, const float *bias, int act, int p0, int p1);
