/* The run-time of a model exported by numbackend (numbackend/export.py): what
   the compiled plan (plan.o, Numba's code for the whole inference plan) needs
   from outside itself, and the C API of model.h around it.

   - Numba's run-time allocation (NRT_*): arrays the plan allocates, with
     malloc, in Numba's MemInfo layout (numba/core/runtime/nrt.cpp);
   - numba_attempt_nocopy_reshape, from Numba's helper library;
   - the BLAS products the plan calls by name (numbackend_sgemm...), through
     the functions numbackend_model_set_blas gives, else a plain loop;
   - the weights file, the batch cut into chunks of CHUNK rows, and threads.

   Build: cc -shared -fPIC -O2 shim.c plan.o -lm -pthread
   (-DNUMBACKEND_SERIAL: no threads; -DNUMBACKEND_PLAN_KEY=<n>: the key the
   weights file must carry). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef NUMBACKEND_SERIAL
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

#include "model.h"

#ifndef NUMBACKEND_PLAN_KEY
#error "NUMBACKEND_PLAN_KEY: the key of the plan this library holds"
#endif

/* ---- Numba's run-time: MemInfo, as numba/core/runtime/nrt.cpp lays it out */

typedef void (*nrt_dtor)(void *data, size_t size, void *info);

typedef struct {
    size_t refct; /* changed by the plan's own NRT_incref/NRT_decref (atomic) */
    nrt_dtor dtor;
    void *dtor_info;
    void *data;
    size_t size;
    void *external_allocator;
} MemInfo;

static MemInfo *meminfo_alloc(size_t size, unsigned align) {
    /* the MemInfo, then the data from the first multiple of align after it */
    char *base = malloc(sizeof(MemInfo) + size + 2 * (size_t)align);
    if (base == NULL)
        return NULL;
    MemInfo *mi = (MemInfo *)base;
    size_t data = (size_t)(base + sizeof(MemInfo));
    if (align > 1 && data % align)
        data += align - data % align;
    mi->refct = 1;
    mi->dtor = NULL;
    mi->dtor_info = NULL;
    mi->data = (void *)data;
    mi->size = size;
    mi->external_allocator = NULL;
    return mi;
}

MemInfo *NRT_MemInfo_alloc_aligned(size_t size, unsigned align) {
    return meminfo_alloc(size, align);
}

MemInfo *NRT_MemInfo_alloc_safe_aligned(size_t size, unsigned align) {
    return meminfo_alloc(size, align);
}

MemInfo *NRT_MemInfo_alloc(size_t size) { return meminfo_alloc(size, 1); }

MemInfo *NRT_MemInfo_alloc_safe(size_t size) { return meminfo_alloc(size, 1); }

void NRT_MemInfo_call_dtor(MemInfo *mi) {
    if (mi->dtor)
        mi->dtor(mi->data, mi->size, mi->dtor_info);
    free(mi);
}

void *NRT_Allocate(size_t size) { return malloc(size); }

void NRT_Free(void *pointer) { free(pointer); }

/* numba/_helperlib.c's numba_attempt_nocopy_reshape (from NumPy's
   _attempt_nocopy_reshape): 1 and the strides of the reshaped view where the
   data need no copy, else 0. */
int numba_attempt_nocopy_reshape(int64_t nd, const int64_t *dims, const int64_t *strides,
                                 int64_t newnd, const int64_t *newdims, int64_t *newstrides,
                                 int64_t itemsize, int is_f_order) {
    int64_t olddims[32], oldstrides[32], np_, op, last_stride;
    int oldnd = 0, oi, oj, ok, ni, nj, nk;
    if (nd > 32)
        return 0;
    for (oi = 0; oi < nd; oi++) {
        if (dims[oi] != 1) {
            olddims[oldnd] = dims[oi];
            oldstrides[oldnd] = strides[oi];
            oldnd++;
        }
    }
    np_ = 1;
    for (ni = 0; ni < newnd; ni++)
        np_ *= newdims[ni];
    op = 1;
    for (oi = 0; oi < oldnd; oi++)
        op *= olddims[oi];
    if (np_ != op)
        return 0;
    if (np_ == 0) {
        for (ni = 0; ni < newnd; ni++)
            newstrides[ni] = itemsize;
        return 1;
    }
    oi = 0;
    oj = 1;
    ni = 0;
    nj = 1;
    while (ni < newnd && oi < oldnd) {
        np_ = newdims[ni];
        op = olddims[oi];
        while (np_ != op) {
            if (np_ < op)
                np_ *= newdims[nj++];
            else
                op *= olddims[oj++];
        }
        for (ok = oi; ok < oj - 1; ok++) {
            if (is_f_order) {
                if (oldstrides[ok + 1] != olddims[ok] * oldstrides[ok])
                    return 0;
            } else if (oldstrides[ok] != olddims[ok + 1] * oldstrides[ok + 1]) {
                return 0;
            }
        }
        if (is_f_order) {
            newstrides[ni] = oldstrides[oi];
            for (nk = ni + 1; nk < nj; nk++)
                newstrides[nk] = newstrides[nk - 1] * newdims[nk - 1];
        } else {
            newstrides[nj - 1] = oldstrides[oj - 1];
            for (nk = nj - 1; nk > ni; nk--)
                newstrides[nk - 1] = newstrides[nk] * newdims[nk];
        }
        ni = nj++;
        oi = oj++;
    }
    last_stride = ni >= 1 ? newstrides[ni - 1] : itemsize;
    if (is_f_order && ni >= 1)
        last_stride *= newdims[ni - 1];
    for (nk = ni; nk < newnd; nk++)
        newstrides[nk] = last_stride;
    return 1;
}

/* ---- BLAS: row-major CBLAS with 64-bit sizes (jit_kernels/blas.py's calls) */

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

static numbackend_gemm_s given_sgemm;
static numbackend_gemm_d given_dgemm;
static numbackend_gemv_s given_sgemv;
static numbackend_gemv_d given_dgemv;

void numbackend_model_set_blas(numbackend_gemm_s sgemm, numbackend_gemm_d dgemm,
                               numbackend_gemv_s sgemv, numbackend_gemv_d dgemv) {
    given_sgemm = sgemm;
    given_dgemm = dgemm;
    given_sgemv = sgemv;
    given_dgemv = dgemv;
}

/* C = alpha op(A) op(B) + beta C, row-major, where no BLAS was given */
#define PLAIN_GEMM(NAME, T)                                                                    \
    static void NAME(int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k, T alpha,         \
                     const T *a, int64_t lda, const T *b, int64_t ldb, T beta, T *c,           \
                     int64_t ldc) {                                                            \
        for (int64_t i = 0; i < m; i++) {                                                      \
            for (int64_t j = 0; j < n; j++)                                                    \
                c[i * ldc + j] = beta == 0 ? 0 : beta * c[i * ldc + j];                        \
            for (int64_t p = 0; p < k; p++) {                                                  \
                T x = alpha * (ta == TRANS ? a[p * lda + i] : a[i * lda + p]);                 \
                if (tb == TRANS)                                                               \
                    for (int64_t j = 0; j < n; j++)                                            \
                        c[i * ldc + j] += x * b[j * ldb + p];                                  \
                else                                                                           \
                    for (int64_t j = 0; j < n; j++)                                            \
                        c[i * ldc + j] += x * b[p * ldb + j];                                  \
            }                                                                                  \
        }                                                                                      \
    }
PLAIN_GEMM(plain_sgemm, float)
PLAIN_GEMM(plain_dgemm, double)

/* y = alpha op(A) x + beta y, row-major, any increments (a negative one walks
   its vector from the end, as BLAS's does), where no BLAS was given */
#define PLAIN_GEMV(NAME, T)                                                                    \
    static void NAME(int32_t ta, int64_t m, int64_t n, T alpha, const T *a, int64_t lda,       \
                     const T *x, int64_t incx, T beta, T *y, int64_t incy) {                   \
        int64_t rows = ta == TRANS ? n : m, cols = ta == TRANS ? m : n;                        \
        const T *x0 = incx < 0 ? x - (cols - 1) * incx : x;                                    \
        T *y0 = incy < 0 ? y - (rows - 1) * incy : y;                                          \
        for (int64_t i = 0; i < rows; i++) {                                                   \
            T sum = 0;                                                                         \
            for (int64_t j = 0; j < cols; j++)                                                 \
                sum += (ta == TRANS ? a[j * lda + i] : a[i * lda + j]) * x0[j * incx];         \
            y0[i * incy] = alpha * sum + (beta == 0 ? 0 : beta * y0[i * incy]);                \
        }                                                                                      \
    }
PLAIN_GEMV(plain_sgemv, float)
PLAIN_GEMV(plain_dgemv, double)

void numbackend_sgemm(int32_t order, int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc) {
    if (given_sgemm)
        given_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        plain_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void numbackend_dgemm(int32_t order, int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k,
                      double alpha, const double *a, int64_t lda, const double *b, int64_t ldb,
                      double beta, double *c, int64_t ldc) {
    if (given_dgemm)
        given_dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        plain_dgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* y = alpha op(A) x + beta y: a product with one column */
void numbackend_sgemv(int32_t order, int32_t ta, int64_t m, int64_t n, float alpha,
                      const float *a, int64_t lda, const float *x, int64_t incx, float beta,
                      float *y, int64_t incy) {
    if (given_sgemv)
        given_sgemv(order, ta, m, n, alpha, a, lda, x, incx, beta, y, incy);
    else
        plain_sgemv(ta, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

void numbackend_dgemv(int32_t order, int32_t ta, int64_t m, int64_t n, double alpha,
                      const double *a, int64_t lda, const double *x, int64_t incx, double beta,
                      double *y, int64_t incy) {
    if (given_dgemv)
        given_dgemv(order, ta, m, n, alpha, a, lda, x, incx, beta, y, incy);
    else
        plain_dgemv(ta, m, n, alpha, a, lda, x, incx, beta, y, incy);
}

/* ---- the plan: Numba's native calling convention (numba/core/callconv.py):
   status = plan(&result, &exception, rows, table address); 0 is success, and
   else exception points to {pickled (class, arguments, location), size...} */

typedef struct {
    const unsigned char *pickle;
    int32_t size;
} ExceptionInfo;

extern int32_t numbackend_export_plan(int64_t *result, ExceptionInfo **exception, int64_t rows,
                                      int64_t table);

/* "Class: message" from a static exception's pickle (protocol 4: the module,
   the class and the first argument are its first three strings) */
static void exception_message(const ExceptionInfo *info, int32_t status, char *out, size_t size) {
    const char *found[3] = {0};
    int64_t lengths[3] = {0};
    int count = 0;
    if (info != NULL && info->pickle != NULL && status > 0) {
        for (int32_t i = 0; i < info->size && count < 3; i++) {
            int64_t length = -1, start = 0;
            if (info->pickle[i] == 0x8c && i + 1 < info->size) { /* SHORT_BINUNICODE */
                length = info->pickle[i + 1];
                start = i + 2;
            } else if (info->pickle[i] == 'X' && i + 4 < info->size) { /* BINUNICODE */
                length = (int64_t)info->pickle[i + 1] | (int64_t)info->pickle[i + 2] << 8 |
                         (int64_t)info->pickle[i + 3] << 16 | (int64_t)info->pickle[i + 4] << 24;
                start = i + 5;
            }
            if (length >= 0 && start + length <= info->size) {
                found[count] = (const char *)info->pickle + start;
                lengths[count++] = length;
                i = (int32_t)(start + length - 1);
            }
        }
    }
    if (count == 3)
        snprintf(out, size, "%.*s: %.*s", (int)lengths[1], found[1], (int)lengths[2], found[2]);
    else if (count == 2)
        snprintf(out, size, "%.*s", (int)lengths[1], found[1]);
    else
        snprintf(out, size, "RuntimeError: the compiled plan failed (status %d)", (int)status);
}

/* ---- the model */

#define MAGIC "NBWEIGHT"
#define VERSION 1
#define MAX_ARRAYS 1024

struct numbackend_model {
    char *weights;       /* the weights file, read whole, 64-byte aligned */
    int64_t inputs, outputs, held, chunk_rows;
    int64_t input_row_bytes[MAX_ARRAYS], output_row_bytes[MAX_ARRAYS];
    int64_t held_offsets[MAX_ARRAYS];
};

/* the calling thread's last failure (numbackend_model_error) */
static _Thread_local char last_error[512];

static numbackend_model *open_failed(numbackend_model *model, FILE *file, const char *format,
                                     const char *path) {
    snprintf(last_error, sizeof last_error, format, path);
    if (file)
        fclose(file);
    if (model) {
        free(model->weights);
        free(model);
    }
    return NULL;
}

numbackend_model *numbackend_model_open(const char *weights_path) {
    FILE *file = fopen(weights_path, "rb");
    if (file == NULL)
        return open_failed(NULL, NULL, "numbackend_model_open: cannot open %s", weights_path);
    numbackend_model *model = calloc(1, sizeof *model);
    if (model == NULL)
        return open_failed(NULL, file, "numbackend_model_open: out of memory for %s",
                           weights_path);
    if (fseek(file, 0, SEEK_END) != 0)
        return open_failed(model, file, "numbackend_model_open: cannot read %s", weights_path);
    long size = ftell(file);
    if (size < 64 || fseek(file, 0, SEEK_SET) != 0)
        return open_failed(model, file, "numbackend_model_open: %s is no weights file",
                           weights_path);
    size_t rounded = ((size_t)size + 63) / 64 * 64;
    model->weights = aligned_alloc(64, rounded);
    if (model->weights == NULL)
        return open_failed(model, file, "numbackend_model_open: out of memory for %s",
                           weights_path);
    if (fread(model->weights, 1, (size_t)size, file) != (size_t)size)
        return open_failed(model, file, "numbackend_model_open: cannot read %s", weights_path);
    fclose(file);
    /* the header: magic, version, plan key, inputs, outputs, held arrays, chunk
       rows, then each input's and output's bytes per row and each held array's
       offset, all int64 */
    const int64_t *header = (const int64_t *)model->weights;
    if (memcmp(model->weights, MAGIC, 8) != 0 || header[1] != VERSION)
        return open_failed(model, NULL, "numbackend_model_open: %s is no weights file",
                           weights_path);
    if ((uint64_t)header[2] != (uint64_t)NUMBACKEND_PLAN_KEY)
        return open_failed(model, NULL,
                           "numbackend_model_open: %s holds the weights of another export",
                           weights_path);
    model->inputs = header[3];
    model->outputs = header[4];
    model->held = header[5];
    model->chunk_rows = header[6];
    int64_t words = 7 + model->inputs + model->outputs + model->held;
    if (model->inputs < 0 || model->outputs < 0 || model->held < 0 ||
        model->inputs > MAX_ARRAYS || model->outputs > MAX_ARRAYS || model->held > MAX_ARRAYS ||
        model->chunk_rows < 1 || words * 8 > size)
        return open_failed(model, NULL, "numbackend_model_open: %s has a damaged header",
                           weights_path);
    const int64_t *numbers = header + 7;
    for (int64_t i = 0; i < model->inputs; i++)
        model->input_row_bytes[i] = *numbers++;
    for (int64_t i = 0; i < model->outputs; i++)
        model->output_row_bytes[i] = *numbers++;
    for (int64_t i = 0; i < model->held; i++) {
        model->held_offsets[i] = *numbers++;
        if (model->held_offsets[i] < words * 8 || model->held_offsets[i] > size)
            return open_failed(model, NULL, "numbackend_model_open: %s has a damaged header",
                               weights_path);
    }
    return model;
}

const char *numbackend_model_error(const numbackend_model *model) {
    (void)model; /* the calling thread's, whichever model failed */
    return last_error;
}

void numbackend_model_close(numbackend_model *model) {
    if (model) {
        free(model->weights);
        free(model);
    }
}

/* A share of one predict call: chunks first, first + step... of the batch */
typedef struct {
    numbackend_model *model;
    int64_t rows, first, step;
    const void *const *inputs;
    void *const *outputs;
    int status;
    char error[512];
} Share;

static void *run_share(void *argument) {
    Share *share = argument;
    numbackend_model *model = share->model;
    int64_t table[3 * MAX_ARRAYS];
    int64_t arrays = model->inputs + model->outputs;
    for (int64_t i = 0; i < model->held; i++)
        table[arrays + i] = (int64_t)(model->weights + model->held_offsets[i]);
    int64_t chunks = (share->rows + model->chunk_rows - 1) / model->chunk_rows;
    for (int64_t chunk = share->first; chunk < chunks; chunk += share->step) {
        int64_t start = chunk * model->chunk_rows;
        int64_t rows = share->rows - start < model->chunk_rows ? share->rows - start
                                                               : model->chunk_rows;
        for (int64_t i = 0; i < model->inputs; i++)
            table[i] = (int64_t)((const char *)share->inputs[i] + start * model->input_row_bytes[i]);
        for (int64_t j = 0; j < model->outputs; j++)
            table[model->inputs + j] =
                (int64_t)((char *)share->outputs[j] + start * model->output_row_bytes[j]);
        int64_t result = 0;
        ExceptionInfo *exception = NULL;
        int32_t status = numbackend_export_plan(&result, &exception, rows, (int64_t)table);
        if (status != 0) {
            exception_message(exception, status, share->error, sizeof share->error);
            share->status = NUMBACKEND_ERROR_COMPUTE;
            break;
        }
    }
    return NULL;
}

static int thread_count(int asked) {
#ifdef NUMBACKEND_SERIAL
    (void)asked;
    return 1;
#else
    if (asked > 0)
        return asked;
    const char *value = getenv("NUMBACKEND_NUM_THREADS");
    if (value != NULL && atoi(value) > 0)
        return atoi(value);
#ifdef CPU_COUNT
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) > 0)
        return CPU_COUNT(&cpus);
#endif
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
#endif
}

int numbackend_model_predict(numbackend_model *model, int64_t rows, const void *const *inputs,
                             void *const *outputs, int threads) {
    if (model == NULL)
        return NUMBACKEND_ERROR_ARGUMENT;
    last_error[0] = 0;
    if (rows < 0 || (rows > 0 && ((model->inputs && inputs == NULL) ||
                                  (model->outputs && outputs == NULL)))) {
        snprintf(last_error, sizeof last_error,
                 "numbackend_model_predict: %lld rows, inputs %p, outputs %p", (long long)rows,
                 (const void *)inputs, (const void *)outputs);
        return NUMBACKEND_ERROR_ARGUMENT;
    }
    int64_t chunks = (rows + model->chunk_rows - 1) / model->chunk_rows;
    int64_t count = thread_count(threads);
    if (count > chunks)
        count = chunks;
    if (count <= 1) {
        Share share = {model, rows, 0, 1, inputs, outputs, 0, {0}};
        run_share(&share);
        if (share.status)
            memcpy(last_error, share.error, sizeof last_error);
        return share.status;
    }
#ifdef NUMBACKEND_SERIAL
    return NUMBACKEND_ERROR_THREADS; /* not reached: thread_count is 1 */
#else
    Share *shares = calloc((size_t)count, sizeof *shares);
    pthread_t *ids = calloc((size_t)count, sizeof *ids);
    if (shares == NULL || ids == NULL) {
        free(shares);
        free(ids);
        snprintf(last_error, sizeof last_error, "numbackend_model_predict: out of memory");
        return NUMBACKEND_ERROR_MEMORY;
    }
    int started = 0, status = 0;
    for (int64_t i = 0; i < count; i++)
        shares[i] = (Share){model, rows, i, count, inputs, outputs, 0, {0}};
    /* share 0 on the calling thread */
    for (int64_t i = 1; i < count; i++) {
        int failure = pthread_create(&ids[i], NULL, run_share, &shares[i]);
        if (failure != 0) {
            status = NUMBACKEND_ERROR_THREADS;
            snprintf(last_error, sizeof last_error,
                     "numbackend_model_predict: cannot start thread %lld (%s)", (long long)i,
                     strerror(failure));
            break;
        }
        started++;
    }
    if (status == 0)
        run_share(&shares[0]);
    for (int i = 1; i <= started; i++)
        pthread_join(ids[i], NULL);
    for (int64_t i = 0; i < count && status == 0; i++) {
        if (shares[i].status) {
            status = shares[i].status;
            memcpy(last_error, shares[i].error, sizeof last_error);
        }
    }
    free(shares);
    free(ids);
    return status;
#endif
}
