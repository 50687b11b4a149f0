/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in for an NVIDIA driver older than the CUDA runtime: a
 * libcuda.so.1 that reports CUDA 12.4. The CUDA runtime finds the driver's
 * entry points through cuGetProcAddress; given this one's version it
 * refuses to start (cudaErrorInsufficientDriver), which is what a node with
 * a driver from before CUDA 13.0 does. test_unsupported puts its folder
 * first on LD_LIBRARY_PATH.
 */
#include <stdint.h>
#include <string.h>

#define OLD_DRIVER_VERSION 12040	/* CUDA 12.4: driver 550 */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_FOUND 500
/* The project builds with -fvisibility=hidden: these are the driver's API. */
#define DRIVER_API __attribute__((visibility("default")))

DRIVER_API int cuDriverGetVersion(int *version);
DRIVER_API int cuInit(unsigned int flags);
DRIVER_API int cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags);
DRIVER_API int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, void *status);

int cuDriverGetVersion(int *version)
{
	*version = OLD_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

int cuInit(unsigned int flags)
{
	(void)flags;
	return CUDA_SUCCESS;
}

int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, void *status)
{
	void (*fn)(void) = NULL;

	(void)version;
	(void)flags;
	(void)status;
	if (strcmp(symbol, "cuDriverGetVersion") == 0)
		fn = (void (*)(void))cuDriverGetVersion;
	else if (strcmp(symbol, "cuInit") == 0)
		fn = (void (*)(void))cuInit;
	else if (strcmp(symbol, "cuGetProcAddress") == 0)
		fn = (void (*)(void))cuGetProcAddress_v2;
	/* ISO C has no cast from a function pointer to void *: copy it. */
	memcpy(pfn, &fn, sizeof(fn));
	return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

int cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags)
{
	return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
