#pragma once
// A step's native threads (crew_native.c); see crew_native.go.

enum { SS_TASK_LINEAR = 1, SS_TASK_ATTENTION = 2, SS_TASK_NORM = 3 };
enum { SS_CREW_MAX = 256 };

// ss_task is one phase of a step: its chunks run on the crew's threads.
typedef struct ss_task {
	int kind, isa;
	// SS_TASK_LINEAR: y[i] = act(x[m, k] . w[i] + bias[i]) for products i <
	// nprod (w packed for isa, or wbf in bfloat16); chunk c of C is panels
	// c*P/C up to (c+1)*P/C of the P counted across the products in order,
	// product i's being first[i] up to first[i+1].
	// SS_TASK_NORM uses per too.
	int m, k, nprod, per, act;
	const float *x;
	int n[3], first[4];
	const float *w[3];
	const unsigned short *wbf[3];
	// Q8_0 and Q4_0 products (wq[i] set, qbits[i] 8 or 4): weights wq/wd and x quantized, qx/dx,
	// kg groups a row, kernels of q8level; 16-row panels.
	const signed char *wq[3];
	const unsigned short *wd[3];
	int qbits[3]; // 8: Q8_0; 4: Q4_0
	const signed char *qx;
	const float *dx;
	const int *sx;
	int kg, q8level;
	float *y[3];
	const float *bias[3];
	// SS_TASK_ATTENTION: one sequence of S rows, chunk h its head h:
	// scores = q_h . k_h^T * scale + keys; ctx_h = softmax(scores) . v_h,
	// on thread t's score block scores[t] (S x S). Row stride H, head
	// width d.
	int S, H, d;
	const float *q, *kv, *v, *keys;
	float *ctx;
	float scale;
	float *scores[SS_CREW_MAX];
	// SS_TASK_NORM: x = LayerNorm(x + y + bias) * g + b on rows, cols
	// wide; chunk c is rows c*per up to (c+1)*per.
	float *nx;
	const float *ny, *nbias, *g, *b;
	int rows, cols;
	float eps;
} ss_task;

typedef struct ss_crew ss_crew;


ss_crew *ss_crew_new(void);
void ss_crew_begin(ss_crew *c, int threads);
void ss_crew_end(ss_crew *c);
long ss_crew_helped(ss_crew *c);
int ss_crew_linear(ss_crew *c, int isa, int chunks, int m, int k, int nprod, int act, const float *x,
                   int n0, int n1, int n2, const float *w0, const float *w1, const float *w2,
                   const unsigned short *wb0, const unsigned short *wb1, const unsigned short *wb2,
                   float *y0, float *y1, float *y2, const float *bias0, const float *bias1, const float *bias2,
                   int q8level, int kg, const signed char *qx, const float *dx, const int *sx, const signed char *wq0,
                   const signed char *wq1, const signed char *wq2, const unsigned short *wd0, const unsigned short *wd1, const unsigned short *wd2,
                   int qb0, int qb1, int qb2);
int ss_crew_attention(ss_crew *c, int isa, int heads, int S, int H, int d, float scale, const float *q, const float *k,
                      const float *v, const float *keys, float *ctx, float *scores, long stride, int threads);
int ss_crew_norm(ss_crew *c, int chunks, int per, float *x, const float *y, const float *bias, const float *g,
                 const float *b, int rows, int cols, float eps);
