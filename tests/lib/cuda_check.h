/* SPDX-License-Identifier: Apache-2.0 */
/* A CUDA runtime or cuBLASLt call in a GPU test, probe or benchmark that
 * must succeed: where it does not, the call, its place and the error on
 * stderr, and the process exits 1. LT_OK needs <cublasLt.h> where it is
 * used. */
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>

#define CUDA_OK(call)                                                                                  \
	do {                                                                                           \
		cudaError_t e_ = (call);                                                               \
		if (e_ != cudaSuccess) {                                                               \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
			exit(1);                                                                       \
		}                                                                                      \
	} while (0)

#define LT_OK(call)                                                                                    \
	do {                                                                                           \
		cublasStatus_t s_ = (call);                                                            \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
			fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #call, (int)s_); \
			exit(1);                                                                       \
		}                                                                                      \
	} while (0)
