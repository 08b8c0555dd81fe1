//go:build cgo && !purego

// A step's threads in C: a crew of POSIX threads that a step of few
// sequences holds while it runs, to split each product's panels, each
// layer's attention heads and each layer norm's rows among CPUs. See
// crew_native.go for why they are not goroutines.
//
// The calling thread posts a phase (a task and its chunk count) and runs
// chunks itself; the crew's threads, spinning between phases for as long
// as the step holds the crew, take chunks from the same counter. Phase k
// runs on jobs[k % 2], whose generation is k while it is live: a thread
// late for phase k (descheduled between reading the phase and taking a
// chunk) finds either phase k and its chunks left, or a generation it
// was not told of, and leaves; the caller reuses a job only once no
// thread is inside it. Nothing allocates per phase.

#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crew_native.h"
#include "q8_native.h"
#include "gemm_native.h"

typedef struct {
	_Atomic long next, done;
	_Atomic unsigned long gen;
	_Atomic int refs, failed;
	long chunks;
	ss_task task;
} ss_job;

struct ss_crew {
	_Atomic unsigned long phase;   // phases posted
	_Atomic unsigned long session; // steps begun; odd while one holds the crew
	_Atomic int inside;            // threads inside a session
	_Atomic long helped;           // chunks the crew's threads ran (tests)
	_Atomic int want;              // threads asked for by the session
	int started;                   // threads created
	int cannot;                    // a thread could not be created: try no more
	pthread_mutex_t mu;
	pthread_cond_t cv;
	ss_job jobs[2];
	ss_task staged; // the next phase's task, filled by the caller
};

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
	_mm_pause();
#endif
}

static int run_chunk(const ss_task *t, long c, long chunks, int tid) {
	switch (t->kind) {
	case SS_TASK_LINEAR: {
		// Chunk c's panels: the same count for every chunk, give or take one.
		long panels = t->first[t->nprod];
		int lo = (int)(c * panels / chunks), hi = (int)((c + 1) * panels / chunks);
		for (int i = 0; i < t->nprod; i++) {
			int p0 = lo > t->first[i] ? lo : t->first[i], p1 = hi < t->first[i + 1] ? hi : t->first[i + 1];
			if (p0 >= p1) continue;
			p0 -= t->first[i];
			p1 -= t->first[i];
			if (t->wq[i])
				ss_linear_q8(t->q8level, t->qbits[i], t->m, t->n[i], t->kg, t->qx, t->dx, t->sx, t->wq[i], t->wd[i], t->y[i], t->bias[i], t->act, p0, p1);
			else if (t->wbf[i])
				ss_linear_bf16(t->m, t->n[i], t->k, t->x, t->wbf[i], t->y[i], t->bias[i], t->act, p0, p1);
			else
				ss_gemm_packed(t->isa, t->m, t->n[i], t->k, 1, t->x, t->k, t->w[i], 0, t->y[i], t->n[i], t->bias[i], t->act, p0, p1);
		}
		return 0;
	}
	case SS_TASK_ATTENTION: {
		int off = (int)c * t->d;
		return ss_attention_head(t->isa, t->S, t->d, t->H, t->scale, t->q + off, t->kv + off, t->v + off, t->keys,
		                         t->ctx + off, t->scores[tid]);
	}
	case SS_TASK_NORM: {
		int r0 = (int)c * t->per, r1 = r0 + t->per < t->rows ? r0 + t->per : t->rows;
		long o = (long)r0 * t->cols;
		ss_residual_norm(t->nx + o, t->ny + o, t->nbias, t->g, t->b, r1 - r0, t->cols, t->eps);
		return 0;
	}
	}
	return -1;
}

static long work(ss_job *j, int tid) {
	long n = 0;
	for (;; n++) {
		long i = atomic_fetch_add(&j->next, 1);
		if (i >= j->chunks) return n;
		if (run_chunk(&j->task, i, j->chunks, tid)) atomic_store(&j->failed, 1);
		atomic_fetch_add(&j->done, 1);
	}
}

typedef struct {
	ss_crew *c;
	int tid;
} ss_member;

// How long a thread spins for the next step once one ended, before it
// sleeps: steps come back to back under load, and waking a sleeping thread
// costs tens of microseconds on a virtual machine.
enum { LINGER_NS = 50 * 1000 };

static long now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void *member(void *arg) {
	ss_member m = *(ss_member *)arg;
	free(arg);
	ss_crew *c = m.c;
	unsigned long last = 0; // the session last served
	for (;;) {
		// Wait for a session that wants this thread: spin a while, then sleep.
		unsigned long s;
		long since = now_ns();
		for (unsigned spins = 1;; spins++) {
			s = atomic_load(&c->session);
			if ((s & 1) && s != last && m.tid <= c->want) break;
			if (spins % 64 != 0 || now_ns() - since < LINGER_NS) {
				cpu_relax();
				if (spins % 64 == 0) sched_yield();
				continue;
			}
			pthread_mutex_lock(&c->mu);
			while (!((s = atomic_load(&c->session)) & 1) || s == last || m.tid > c->want)
				pthread_cond_wait(&c->cv, &c->mu);
			pthread_mutex_unlock(&c->mu);
			break;
		}
		atomic_fetch_add(&c->inside, 1);
		if (atomic_load(&c->session) != s) { // ended meanwhile
			atomic_fetch_sub(&c->inside, 1);
			continue;
		}
		last = s;
		unsigned long seen = atomic_load(&c->phase);
		// A phase posted before this thread arrived may still have chunks.
		seen = seen ? seen - 1 : 0;
		unsigned spins = 0;
		while (atomic_load(&c->session) == s) {
			unsigned long ph = atomic_load(&c->phase);
			if (ph != seen) {
				seen = ph;
				ss_job *j = &c->jobs[ph & 1];
				atomic_fetch_add(&j->refs, 1);
				if (atomic_load(&j->gen) == ph) atomic_fetch_add(&c->helped, work(j, m.tid));
				atomic_fetch_sub(&j->refs, 1);
				spins = 0;
				continue;
			}
			cpu_relax();
			if (++spins % 256 == 0) sched_yield();
		}
		atomic_fetch_sub(&c->inside, 1);
	}
	return 0;
}

ss_crew *ss_crew_new(void) {
	ss_crew *c = calloc(1, sizeof *c);
	if (!c) return 0;
	pthread_mutex_init(&c->mu, 0);
	pthread_cond_init(&c->cv, 0);
	return c;
}

// ss_crew_begin holds the crew for a step on threads threads (the caller
// among them), starting the threads it lacks; fewer run if they cannot be
// started.
void ss_crew_begin(ss_crew *c, int threads) {
	if (threads > SS_CREW_MAX) threads = SS_CREW_MAX;
	pthread_mutex_lock(&c->mu);
	while (!c->cannot && c->started < threads - 1) {
		ss_member *m = malloc(sizeof *m);
		if (!m) {
			c->cannot = 1;
			break;
		}
		m->c = c;
		m->tid = c->started + 1;
		pthread_t th;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		// The kernels' thread-local blocks (about 86 KiB) live in the stack's
		// allocation too.
		pthread_attr_setstacksize(&attr, 1 << 20);
		int err = pthread_create(&th, &attr, member, m);
		pthread_attr_destroy(&attr);
		if (err) {
			free(m);
			c->cannot = 1;
			break;
		}
		c->started++;
	}
	atomic_store(&c->want, threads - 1 < c->started ? threads - 1 : c->started);
	atomic_fetch_add(&c->session, 1); // odd: held
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

// run runs the staged task's chunks 0 up to chunks as the next phase and
// returns once all are done: 0, or -1 when a chunk failed (out of memory
// for a packing scratch).
static int run(ss_crew *c, int chunks) {
	unsigned long ph = atomic_load(&c->phase) + 1;
	ss_job *j = &c->jobs[ph & 1];
	for (unsigned spins = 1; atomic_load(&j->refs) != 0; spins++) { // a thread late for phase ph-2
		cpu_relax();
		if (spins % 256 == 0) sched_yield();
	}
	j->task = c->staged;
	j->chunks = chunks;
	atomic_store(&j->next, 0);
	atomic_store(&j->done, 0);
	atomic_store(&j->failed, 0);
	atomic_store(&j->gen, ph);
	atomic_store(&c->phase, ph);
	work(j, 0);
	for (unsigned spins = 0; atomic_load(&j->done) != chunks;) {
		cpu_relax();
		if (++spins % 256 == 0) sched_yield();
	}
	atomic_store(&j->gen, 0); // retired
	// The task's pointers are the Go caller's, for this call only.
	memset(&j->task, 0, sizeof j->task);
	memset(&c->staged, 0, sizeof c->staged);
	return atomic_load(&j->failed) ? -1 : 0;
}

long ss_crew_helped(ss_crew *c) { return atomic_load(&c->helped); }

// ss_crew_end lets the crew's threads go (they linger a while, then sleep)
// and returns once none is inside the step.
void ss_crew_end(ss_crew *c) {
	atomic_fetch_add(&c->session, 1); // even: free
	for (unsigned spins = 1; atomic_load(&c->inside) != 0; spins++) {
		cpu_relax();
		if (spins % 256 == 0) sched_yield();
	}
}

// The phases. Their pointers are the Go caller's, valid for the call: the
// crew's threads use them only until the phase's last chunk is done, which
// is before the call returns.

int ss_crew_linear(ss_crew *c, int isa, int chunks, int m, int k, int nprod, int act, const float *x,
                   int n0, int n1, int n2, const float *w0, const float *w1, const float *w2,
                   const unsigned short *wb0, const unsigned short *wb1, const unsigned short *wb2,
                   float *y0, float *y1, float *y2, const float *bias0, const float *bias1, const float *bias2,
                   int q8level, int kg, const signed char *qx, const float *dx, const int *sx, const signed char *wq0,
                   const signed char *wq1, const signed char *wq2, const unsigned short *wd0, const unsigned short *wd1, const unsigned short *wd2,
                   int qb0, int qb1, int qb2) {
	const signed char *wq[3] = {wq0, wq1, wq2};
	const unsigned short *wd[3] = {wd0, wd1, wd2};
	int qb[3] = {qb0, qb1, qb2};
	ss_task *t = &c->staged;
	t->kind = SS_TASK_LINEAR;
	t->isa = isa;
	t->m = m;
	t->k = k;
	t->nprod = nprod;
	t->act = act;
	t->x = x;
	const float *w[3] = {w0, w1, w2}, *bias[3] = {bias0, bias1, bias2};
	const unsigned short *wb[3] = {wb0, wb1, wb2};
	float *y[3] = {y0, y1, y2};
	int n[3] = {n0, n1, n2};
	int width = ss_panel_width(isa);
	t->first[0] = 0;
	for (int i = 0; i < 3; i++) {
		t->n[i] = i < nprod ? n[i] : 0;
		t->w[i] = w[i];
		t->wbf[i] = wb[i];
		t->y[i] = y[i];
		t->bias[i] = bias[i];
		t->wq[i] = i < nprod ? wq[i] : 0;
		t->wd[i] = i < nprod ? wd[i] : 0;
		t->qbits[i] = i < nprod ? qb[i] : 0;
		int panels = t->wq[i] ? (n[i] + 15) / 16 : wb[i] ? (n[i] + 31) / 32 : (n[i] + width - 1) / width;
		t->first[i + 1] = t->first[i] + (i < nprod ? panels : 0);
	}
	t->qx = qx;
	t->dx = dx;
	t->sx = sx;
	t->kg = kg;
	t->q8level = q8level;
	return run(c, chunks);
}

int ss_crew_attention(ss_crew *c, int isa, int heads, int S, int H, int d, float scale, const float *q, const float *k,
                      const float *v, const float *keys, float *ctx, float *scores, long stride, int threads) {
	ss_task *t = &c->staged;
	t->kind = SS_TASK_ATTENTION;
	t->isa = isa;
	t->S = S;
	t->H = H;
	t->d = d;
	t->scale = scale;
	t->q = q;
	t->kv = k;
	t->v = v;
	t->keys = keys;
	t->ctx = ctx;
	for (int i = 0; i < threads && i < SS_CREW_MAX; i++) t->scores[i] = scores + i * stride;
	return run(c, heads);
}

int ss_crew_norm(ss_crew *c, int chunks, int per, float *x, const float *y, const float *bias, const float *g,
                 const float *b, int rows, int cols, float eps) {
	ss_task *t = &c->staged;
	t->kind = SS_TASK_NORM;
	t->per = per;
	t->nx = x;
	t->ny = y;
	t->nbias = bias;
	t->g = g;
	t->b = b;
	t->rows = rows;
	t->cols = cols;
	t->eps = eps;
	return run(c, chunks);
}
