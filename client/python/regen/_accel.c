/* SPDX-License-Identifier: Apache-2.0 */
/* regen._accel: regen.torch's chained call encoded onto a lane's ring in C.
 *
 * One call of queue_tensors() does what Runtime._queue_chained's loop over
 * the operands and Client.queue_encoded do in Python for a run's chained
 * call: per operand, its dtype code, device, shape and strides, its place in
 * a kept pool chunk and that chunk buffer's index in the lane's id table;
 * then the record, written whole into the ring, and the submission counter
 * published. On the H200 machine those Python steps were most of the 20 µs
 * a call cost the rank. Whatever the fast path does not cover (a tensor
 * outside the kept chunks, an id the lane has not bound, an unknown dtype,
 * another device, rank 0 or over 4) makes it return -1 having written nothing,
 * and the Python path takes the call, as it does where this module is
 * missing (pip without a compiler, REGEN_PY_ACCEL=none).
 *
 * The record layout is proto/ring.h's (struct rp_ring_record), repeated here
 * because `pip install ./client/python` builds this file without the rest of
 * the tree; test_accel.py compares its bytes with the Python encoder's,
 * which the worker's own tests hold to proto/ring.h.
 *
 * The stable ABI (Py_LIMITED_API 3.7): one build loads in every CPython from
 * 3.7 on, as the GPU machine's differs from the build machine's. */
#define Py_LIMITED_API 0x03070000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define RING_HEADER_SIZE 4096
#define RECORD_SIZE 1024
#define SLOTS 11
#define INDEX_NONE 0xFFFFFFFFu
#define RANK_MAX 4
/* Header words (proto/ring.h's struct rp_ring_header) as uint32_t indexes. */
#define SQ_TAIL_WORD (64 / 4)
#define SQ_SLEEPING_WORD (132 / 4)

struct operand {
	uint32_t index;
	uint8_t dtype;
	uint8_t rank;
	uint16_t reserved;
	uint64_t offset;
	int64_t shape[4];
	int64_t strides[4];
};

struct record {
	uint64_t tag;
	uint16_t op;
	uint16_t flags;
	uint8_t epilogue;
	uint8_t compute;
	uint8_t alignment;
	uint8_t reserved0;
	uint32_t wait_event, signal_event;
	uint32_t deadline_ms;
	uint32_t reserved1;
	double alpha, beta;
	double scale;
	uint64_t reserved2;
	struct operand operands[SLOTS];
	uint8_t pad[RECORD_SIZE - 64 - SLOTS * sizeof(struct operand)];
};

_Static_assert(sizeof(struct operand) == 80, "operand layout");
_Static_assert(sizeof(struct record) == RECORD_SIZE, "record layout");

static PyObject *s_data_ptr, *s_get_device, *s_stride, *s_shape, *s_dtype, *s_id;

/* 1: the value fits; 0: it does not (the caller falls back); -1: an
 * exception is set. */
static int as_int64(PyObject *o, int64_t *out)
{
	int overflow = 0;
	long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
	if (v == -1 && PyErr_Occurred())
		return -1;
	if (overflow)
		return 0;
	*out = (int64_t)v;
	return 1;
}

static int item_int64(PyObject *seq, Py_ssize_t i, int64_t *out)
{
	PyObject *o = PySequence_GetItem(seq, i);
	if (!o)
		return -1;
	int r = as_int64(o, out);
	Py_DECREF(o);
	return r;
}

/* Field i (0: start, 1: end) of a kept span (start, end, buffer): 1 read,
 * 0 not such a span (the caller falls back), -1 error. */
static int span_field(PyObject *entry, Py_ssize_t i, unsigned long long *out)
{
	if (!entry || !PyTuple_Check(entry) || PyTuple_Size(entry) != 3) {
		PyErr_Clear();
		return 0;
	}
	unsigned long long v = PyLong_AsUnsignedLongLong(PyTuple_GetItem(entry, i));
	if (v == (unsigned long long)-1 && PyErr_Occurred())
		return -1;
	*out = v;
	return 1;
}

static PyObject *call0(PyObject *obj, PyObject *name)
{
	return PyObject_CallMethodObjArgs(obj, name, NULL);
}

/* One operand's slot from tensor t: 1 written, 0 not covered, -1 error. */
static int encode_operand(struct operand *op, PyObject *t, long local, PyObject *kept, PyObject *bound,
			  PyObject *dtypes)
{
	PyObject *o, *shape = NULL, *strides = NULL;
	int r = 0;

	o = PyObject_GetAttr(t, s_dtype);
	if (!o)
		return -1;
	PyObject *code = PyDict_GetItem(dtypes, o);   /* borrowed */
	Py_DECREF(o);
	if (!code)
		return 0;
	long dtype = PyLong_AsLong(code);
	if (dtype == -1 && PyErr_Occurred())
		return -1;
	if (dtype < 0 || dtype > 255)
		return 0;

	o = call0(t, s_get_device);
	if (!o)
		return -1;
	long dev = PyLong_AsLong(o);
	Py_DECREF(o);
	if (dev == -1 && PyErr_Occurred())
		return -1;
	if (dev != local)
		return 0;

	shape = PyObject_GetAttr(t, s_shape);
	if (!shape)
		return -1;
	Py_ssize_t rank = PySequence_Size(shape);
	if (rank < 0) {
		r = -1;
		goto out;
	}
	/* Rank 0 and past 4: the Python path's (its refusal, or regend's, by
	 * name). */
	if (rank < 1 || rank > RANK_MAX)
		goto out;

	o = call0(t, s_data_ptr);
	if (!o) {
		r = -1;
		goto out;
	}
	unsigned long long ptr = PyLong_AsUnsignedLongLong(o);
	Py_DECREF(o);
	if (ptr == (unsigned long long)-1 && PyErr_Occurred()) {
		r = -1;
		goto out;
	}

	/* The span holding ptr: kept is sorted by start (its spans do not
	 * overlap), so the last one starting at or below ptr, found by
	 * bisection. */
	PyObject *buffer = NULL;
	unsigned long long start = 0;
	Py_ssize_t lo = 0, hi = PyList_Size(kept);
	if (hi < 0) {
		r = -1;
		goto out;
	}
	while (lo < hi) {
		Py_ssize_t mid = lo + (hi - lo) / 2;
		unsigned long long s;
		int k = span_field(PyList_GetItem(kept, mid), 0, &s);
		if (k <= 0) {
			r = k;
			goto out;
		}
		if (s <= ptr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo > 0) {
		PyObject *entry = PyList_GetItem(kept, lo - 1);
		unsigned long long s, e;
		int k = span_field(entry, 0, &s);
		if (k > 0)
			k = span_field(entry, 1, &e);
		if (k <= 0) {
			r = k;
			goto out;
		}
		if (ptr < e) {
			buffer = PyTuple_GetItem(entry, 2);
			start = s;
		}
	}
	if (!buffer)
		goto out;
	/* The buffer as a Buffer object or its id text (libregen's pool hands
	 * ids). */
	if (PyUnicode_Check(buffer)) {
		o = buffer;
		Py_INCREF(o);
	} else if (!(o = PyObject_GetAttr(buffer, s_id))) {
		PyErr_Clear();
		goto out;
	}
	PyObject *index = PyDict_GetItem(bound, o);   /* borrowed */
	Py_DECREF(o);
	if (!index)
		goto out;
	unsigned long idx = PyLong_AsUnsignedLong(index);
	if (idx == (unsigned long)-1 && PyErr_Occurred()) {
		r = -1;
		goto out;
	}
	if (idx >= INDEX_NONE)
		goto out;

	strides = call0(t, s_stride);
	if (!strides) {
		r = -1;
		goto out;
	}
	if (PySequence_Size(strides) != rank) {
		if (PyErr_Occurred())
			r = -1;
		goto out;
	}
	op->index = (uint32_t)idx;
	op->dtype = (uint8_t)dtype;
	op->rank = (uint8_t)rank;
	op->offset = ptr - start;
	for (Py_ssize_t i = 0; i < rank; i++) {
		int k = item_int64(shape, i, &op->shape[i]);
		if (k <= 0) {
			r = k;
			goto out;
		}
		k = item_int64(strides, i, &op->strides[i]);
		if (k <= 0) {
			r = k;
			goto out;
		}
	}
	/* A dimension of size 1 may have any stride in torch; regend wants the
	 * row-major one there (regen.torch's _strides). */
	int64_t step = 1;
	for (Py_ssize_t i = rank - 1; i >= 0; i--) {
		if (op->shape[i] == 1)
			op->strides[i] = step;
		step *= op->shape[i] > 1 ? op->shape[i] : 1;
	}
	r = 1;
out:
	Py_XDECREF(shape);
	Py_XDECREF(strides);
	return r;
}

/* queue_tensors(ring_address, entries, tail, tag, op, scalars, signal,
 *               names, tensors, local, kept, bound, dtypes) -> int
 *
 * ring_address: the mapped ring's first byte (the caller keeps the mapping
 * and checked the ring is not full); scalars: ring.scalars_record()'s tuple
 * (flags, epilogue, compute, alignment, alpha, beta, scale, deadline_ms);
 * signal: the signal event's index or NONE; names: the op's operand slots
 * in order; tensors: name -> tensor or None; local: the tensors' device
 * (get_device(), -1 for host memory); kept: [(start, end, buffer)] spans of
 * memory (pool chunks, imported storages) sorted by start, not overlapping
 * (a tensor in a span it does not find goes the Python way); bound: the
 * lane's id -> index; dtypes: torch dtype -> ring code.
 *
 * Returns -1 with nothing written where the fast path does not cover the
 * call, else whether the worker sleeps (ring the doorbell): the record is
 * then in slot tail and the submission counter at tail + 1. */
static PyObject *queue_tensors(PyObject *self, PyObject *args)
{
	unsigned long long addr, tag;
	unsigned int entries, tail, signal;
	unsigned short opcode;
	unsigned short flags;
	unsigned char epilogue, compute, alignment;
	double alpha, beta, scale;
	unsigned int deadline;
	PyObject *names, *tensors, *kept, *bound, *dtypes;
	long local;
	(void)self;

	if (!PyArg_ParseTuple(args, "KIIKH(HbbbdddI)IOOlOOO", &addr, &entries, &tail, &tag, &opcode, &flags, &epilogue,
			      &compute, &alignment, &alpha, &beta, &scale, &deadline, &signal, &names, &tensors, &local,
			      &kept, &bound, &dtypes))
		return NULL;
	if (!addr || entries == 0 || (entries & (entries - 1)) != 0) {
		PyErr_SetString(PyExc_ValueError, "queue_tensors: no ring");
		return NULL;
	}
	if (!PyTuple_Check(names) || !PyDict_Check(tensors) || !PyList_Check(kept) || !PyDict_Check(bound) ||
	    !PyDict_Check(dtypes)) {
		PyErr_SetString(PyExc_TypeError, "queue_tensors: names a tuple; tensors, bound, dtypes dicts; kept a list");
		return NULL;
	}
	Py_ssize_t nslots = PyTuple_Size(names);
	if (nslots > SLOTS) {
		PyErr_SetString(PyExc_ValueError, "queue_tensors: more operands than a record holds");
		return NULL;
	}

	/* Every member not named here zero (the reserved fields and the pad,
	 * as the worker requires; the layout has no implicit padding). */
	struct record rec = { .tag = tag, .op = opcode, .flags = flags, .epilogue = epilogue, .compute = compute,
			       .alignment = alignment, .wait_event = INDEX_NONE, .signal_event = signal,
			       .deadline_ms = deadline, .alpha = alpha, .beta = beta, .scale = scale };
	for (Py_ssize_t i = 0; i < SLOTS; i++)
		rec.operands[i].index = INDEX_NONE;
	for (Py_ssize_t i = 0; i < nslots; i++) {
		PyObject *t = PyDict_GetItem(tensors, PyTuple_GetItem(names, i));   /* borrowed */
		if (!t || t == Py_None)
			continue;
		int r = encode_operand(&rec.operands[i], t, local, kept, bound, dtypes);
		if (r < 0)
			return NULL;
		if (r == 0)
			return PyLong_FromLong(-1);
	}

	void *base = (void *)(uintptr_t)addr;
	memcpy((char *)base + RING_HEADER_SIZE + (size_t)(tail & (entries - 1)) * RECORD_SIZE, &rec, sizeof(rec));
	uint32_t *words = base;
	/* Publish the record (release), then look at the worker's sleeping flag
	 * after a full fence: the store-then-load order the worker's own
	 * fence pairs with (proto/ring.h). */
	__atomic_store_n(&words[SQ_TAIL_WORD], tail + 1, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	uint32_t sleeping = __atomic_load_n(&words[SQ_SLEEPING_WORD], __ATOMIC_ACQUIRE);
	return PyLong_FromLong(sleeping != 0);
}

static PyMethodDef methods[] = {
	{ "queue_tensors", queue_tensors, METH_VARARGS,
	  "Encodes a chained call's record from its tensors onto a lane's ring and publishes it; -1 (nothing "
	  "written) where the Python path must take it, else whether the worker sleeps." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "regen._accel",
	"regen.torch's chained calls encoded onto a lane's ring in C (optional; regen/_accel.c).", -1, methods,
	NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__accel(void);

PyMODINIT_FUNC PyInit__accel(void)
{
	s_data_ptr = PyUnicode_InternFromString("data_ptr");
	s_get_device = PyUnicode_InternFromString("get_device");
	s_stride = PyUnicode_InternFromString("stride");
	s_shape = PyUnicode_InternFromString("shape");
	s_dtype = PyUnicode_InternFromString("dtype");
	s_id = PyUnicode_InternFromString("id");
	if (!s_data_ptr || !s_get_device || !s_stride || !s_shape || !s_dtype || !s_id)
		return NULL;
	return PyModule_Create(&module);
}
