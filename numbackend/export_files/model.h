/* A model exported by numbackend (python -m numbackend export): its compiled
   inference plan, called from C.  Link with model.so (-l:model.so or its path).

   Every input and output is a C-contiguous array whose first axis is the batch
   (rows); manifest.json gives each one's shape per row and its type.  The
   caller allocates the outputs.  Functions return 0 on success, else a negative
   error code; numbackend_model_error gives the message of the last failure.

   An output whose size along an axis depends on the data (CTC's greedy
   decodings, which the model pads with -1 to the longest of the batch) has
   "trim": {"axis": A, "pad": P} in manifest.json: the library writes it at
   the size manifest.json gives (its bound: the time steps), each row's
   entries followed by P, a value it holds nowhere else.  The model's result
   is that array cut along axis A after the last position where any row
   holds a value other than P (size 0 where none does), over the whole batch
   however many calls it took; the Python loader cuts it so. */
#ifndef NUMBACKEND_MODEL_H
#define NUMBACKEND_MODEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* error codes */
#define NUMBACKEND_OK 0
#define NUMBACKEND_ERROR_WEIGHTS (-1)   /* the weights file cannot be read or does not fit */
#define NUMBACKEND_ERROR_MEMORY (-2)    /* an allocation failed */
#define NUMBACKEND_ERROR_ARGUMENT (-3)  /* a negative row count, a null array */
#define NUMBACKEND_ERROR_COMPUTE (-4)   /* a check inside the compiled plan failed */
#define NUMBACKEND_ERROR_THREADS (-5)   /* a thread could not be started */

#if defined(__GNUC__)
#define NUMBACKEND_API __attribute__((visibility("default")))
#else
#define NUMBACKEND_API
#endif

typedef struct numbackend_model numbackend_model;

/* The model with the weights of weights_path (the export's weights.bin), or
   NULL: then numbackend_model_error(NULL) says why. */
NUMBACKEND_API numbackend_model *numbackend_model_open(const char *weights_path);

/* outputs[j] = the model's output j for rows rows of inputs[i] (one pointer
   per input and output, in manifest.json's order).  threads: how many threads
   share the batch; 0 takes NUMBACKEND_NUM_THREADS from the environment, else
   the CPUs this process may use (1 in a serial build).  The batch runs in
   chunks of manifest.json's chunk_rows rows, each on one thread, so the
   results do not depend on the thread count. */
NUMBACKEND_API int numbackend_model_predict(numbackend_model *model, int64_t rows, const void *const *inputs,
                             void *const *outputs, int threads);

/* The message of the calling thread's last failure of numbackend_model_open
   or numbackend_model_predict ("" after a predict that succeeded); model may be
   NULL. */
NUMBACKEND_API const char *numbackend_model_error(const numbackend_model *model);

/* Frees the model and its weights. */
NUMBACKEND_API void numbackend_model_close(numbackend_model *model);

/* The matrix products the plan does not run itself go through these CBLAS
   functions (64-bit integer arguments, as OpenBLAS's ILP64 cblas_sgemm64_),
   process-wide; a plain C loop where they are not given (NULL).  The Python
   loader passes NumPy's OpenBLAS. */
typedef void (*numbackend_gemm_s)(int32_t, int32_t, int32_t, int64_t, int64_t, int64_t, float,
                                  const float *, int64_t, const float *, int64_t, float, float *,
                                  int64_t);
typedef void (*numbackend_gemm_d)(int32_t, int32_t, int32_t, int64_t, int64_t, int64_t, double,
                                  const double *, int64_t, const double *, int64_t, double,
                                  double *, int64_t);
typedef void (*numbackend_gemv_s)(int32_t, int32_t, int64_t, int64_t, float, const float *,
                                  int64_t, const float *, int64_t, float, float *, int64_t);
typedef void (*numbackend_gemv_d)(int32_t, int32_t, int64_t, int64_t, double, const double *,
                                  int64_t, const double *, int64_t, double, double *, int64_t);
NUMBACKEND_API void numbackend_model_set_blas(numbackend_gemm_s sgemm, numbackend_gemm_d dgemm,
                               numbackend_gemv_s sgemv, numbackend_gemv_d dgemv);

#ifdef __cplusplus
}
#endif
#endif
