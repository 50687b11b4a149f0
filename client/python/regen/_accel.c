/* SPDX-License-Identifier: Apache-2.0 */
/* regen._accel: the Python client's lanes over libregen's ring.
 *
 * A thin binding: it loads libregen (the path regen.pool finds; the pool
 * and the lanes share the one library of the process), holds a regen_client
 * per Python client, and hands libregen each call and Run in the ring
 * record's terms (regen_record_submit, regen_record_run_submit: include/
 * regen.h), its buffers, events and program named by id. The ring itself,
 * its id table, doorbells, waits and errors are libregen's (client/lane.c).
 *
 * Two ways in for a call: submit() takes its operands as Python already
 * holds them (buffer, dtype code, offset, shape, strides); submit_tensors()
 * reads them from torch tensors that lie in known spans of memory (pool
 * chunks, imported storages: regen.torch's chained calls), and answers 0
 * with nothing queued where a tensor is not covered (outside every span,
 * an unknown dtype, another device, rank 0 or over 4), so that the caller
 * takes the call the other way.
 *
 * Failures come back as a negative errno; error() then says what
 * libregen's client recorded (regend's error name and parameters where it
 * has one). -ERANGE from submit() and run(): a value a record cannot hold
 * (rank outside 1 to 4, strides of another rank, an integer past its
 * field), which the caller names.
 *
 * The stable ABI (Py_LIMITED_API 3.7): one build loads in every CPython from
 * 3.7 on, as the GPU machine's differs from the build machine's. */
#define Py_LIMITED_API 0x03070000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "regen.h"

#define CAPSULE "regen._accel.client"
#define RANK_MAX 4

/* libregen's entry points, found by load(). */
static struct {
	int (*connect)(const char *, regen_client **);
	void (*destroy)(regen_client *);
	void (*set_timeout)(regen_client *, double);
	int (*set_job)(regen_client *, const char *);
	int (*set_transport)(regen_client *, enum regen_transport);
	int (*record_submit)(regen_client *, int, const struct regen_record_call *, uint64_t *);
	int (*record_run_submit)(regen_client *, int, const struct regen_record_run *, uint64_t *);
	int (*wait)(regen_client *, int, uint64_t);
	uint64_t (*last_elapsed_us)(const regen_client *, int);
	int (*last_timing)(const regen_client *, int, struct regen_call_timing *);
	const char *(*error_name)(const regen_client *);
	const char *(*error_message)(const regen_client *);
	const char *(*error_parameters)(const regen_client *);
	uint64_t (*error_ticket)(const regen_client *);
	int (*tickets)(const regen_client *, int, uint64_t *, uint64_t *);
	uint64_t (*doorbells)(const regen_client *);
} lib;
static void *lib_handle;

static PyObject *s_data_ptr, *s_get_device, *s_stride, *s_shape, *s_dtype, *s_id;

static PyObject *load(PyObject *self, PyObject *args)
{
	const char *path;
	void *h;
	(void)self;

	if (!PyArg_ParseTuple(args, "s", &path))
		return NULL;
	if (lib_handle != NULL)
		Py_RETURN_NONE;
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		PyErr_Format(PyExc_ImportError, "cannot load %s: %s", path, dlerror());
		return NULL;
	}
#define FIND(field, symbol)                                                                                    \
	do {                                                                                                   \
		*(void **)&lib.field = dlsym(h, symbol);                                                       \
		if (lib.field == NULL) {                                                                       \
			PyErr_Format(PyExc_ImportError, "%s has no %s (an older libregen)", path, symbol);    \
			dlclose(h);                                                                            \
			memset(&lib, 0, sizeof(lib));                                                          \
			return NULL;                                                                           \
		}                                                                                              \
	} while (0)
	FIND(connect, "regen_client_connect");
	FIND(destroy, "regen_client_destroy");
	FIND(set_timeout, "regen_client_set_timeout");
	FIND(set_job, "regen_client_set_job");
	FIND(set_transport, "regen_client_set_transport");
	FIND(record_submit, "regen_record_submit");
	FIND(record_run_submit, "regen_record_run_submit");
	FIND(wait, "regen_wait");
	FIND(last_elapsed_us, "regen_client_last_elapsed_us");
	FIND(last_timing, "regen_client_last_timing");
	FIND(error_name, "regen_client_error_name");
	FIND(error_message, "regen_client_error_message");
	FIND(error_parameters, "regen_client_error_parameters");
	FIND(error_ticket, "regen_client_error_ticket");
	FIND(tickets, "regen_client_tickets");
	FIND(doorbells, "regen_client_doorbells");
#undef FIND
	lib_handle = h;
	Py_RETURN_NONE;
}

static void client_free(PyObject *capsule)
{
	regen_client *c = PyCapsule_GetPointer(capsule, CAPSULE);

	if (c != NULL && lib.destroy != NULL)
		lib.destroy(c);
}

static regen_client *client_of(PyObject *capsule)
{
	if (lib_handle == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "regen._accel: libregen is not loaded (load())");
		return NULL;
	}
	return PyCapsule_GetPointer(capsule, CAPSULE);
}

/* connect(socket, timeout_s, job) -> client: a libregen client whose lanes
 * take the ring only (the Python client speaks Varlink itself). OSError
 * with the errno where it cannot connect. */
static PyObject *connect_(PyObject *self, PyObject *args)
{
	const char *socket, *job;
	double timeout;
	regen_client *c = NULL;
	int r;
	(void)self;

	if (!PyArg_ParseTuple(args, "sdz", &socket, &timeout, &job))
		return NULL;
	if (lib_handle == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "regen._accel: libregen is not loaded (load())");
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	r = lib.connect(socket, &c);
	if (r == 0) {
		lib.set_timeout(c, timeout);
		lib.set_transport(c, REGEN_TRANSPORT_RING);
		if (job != NULL)
			r = lib.set_job(c, job);
	}
	Py_END_ALLOW_THREADS
	if (r < 0) {
		if (c != NULL)
			lib.destroy(c);
		errno = -r;
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	PyObject *capsule = PyCapsule_New(c, CAPSULE, client_free);
	if (capsule == NULL)
		lib.destroy(c);
	return capsule;
}

/* 1: the value fits; 0: it does not; -1: an exception is set. */
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

static int as_uint64(PyObject *o, uint64_t *out)
{
	unsigned long long v = PyLong_AsUnsignedLongLong(o);

	if (v == (unsigned long long)-1 && PyErr_Occurred()) {
		if (!PyErr_ExceptionMatches(PyExc_OverflowError))
			return -1;
		PyErr_Clear();
		return 0;
	}
	*out = (uint64_t)v;
	return 1;
}

/* Item i of a shape or strides: a tuple's or a list's borrowed (torch's
 * shapes and strides are tuples, Operands' lists), any other sequence's
 * through the sequence protocol. */
static int item_int64(PyObject *seq, Py_ssize_t i, int64_t *out)
{
	PyObject *o;
	int r;

	if (PyTuple_Check(seq) || PyList_Check(seq)) {
		o = PyTuple_Check(seq) ? PyTuple_GetItem(seq, i) : PyList_GetItem(seq, i);
		return o != NULL ? as_int64(o, out) : -1;
	}
	o = PySequence_GetItem(seq, i);
	if (o == NULL)
		return -1;
	r = as_int64(o, out);
	Py_DECREF(o);
	return r;
}

/* The UTF-8 of the ids seen lately, by their str object: a run of calls
 * names the same few buffers again and again (the stable ABI has no
 * borrowed UTF-8 of a str before 3.10, and a bytes object made per
 * operand was a measurable part of a call). Each entry holds its str, so
 * no other str can take its address while it is here. */
#define ID_CACHE 64
static struct {
	PyObject *text, *bytes;
} id_cache[ID_CACHE];

/* A new reference to the UTF-8 of str `text`. */
static PyObject *utf8_of(PyObject *text)
{
	size_t slot = ((uintptr_t)text >> 4) % ID_CACHE;
	PyObject *b;

	if (id_cache[slot].text == text) {
		Py_INCREF(id_cache[slot].bytes);
		return id_cache[slot].bytes;
	}
	b = PyUnicode_AsUTF8String(text);
	if (b == NULL)
		return NULL;
	Py_XDECREF(id_cache[slot].text);
	Py_XDECREF(id_cache[slot].bytes);
	Py_INCREF(text);
	Py_INCREF(b);
	id_cache[slot].text = text;
	id_cache[slot].bytes = b;
	return b;
}

/* The UTF-8 of an id: a str, or an object's .id (a Buffer, an Event);
 * NULL with an exception set. The bytes object holds the text. */
static PyObject *id_bytes(PyObject *o)
{
	PyObject *text, *b;

	if (PyUnicode_Check(o))
		return utf8_of(o);
	text = PyObject_GetAttr(o, s_id);
	if (text == NULL) {
		if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
			PyErr_Clear();
			PyErr_SetString(PyExc_TypeError, "an id is a str, or an object whose .id is one");
		}
		return NULL;
	}
	b = PyUnicode_Check(text) ? utf8_of(text) : NULL;
	if (b == NULL && !PyErr_Occurred())
		PyErr_SetString(PyExc_TypeError, "an id is a str, or an object whose .id is one");
	Py_DECREF(text);
	return b;
}

/* What the record's ids point into, released after the call. */
struct held {
	PyObject *o[REGEN_RECORD_OPERANDS + 3];
	int n;
};

static void held_release(struct held *h)
{
	while (h->n > 0)
		Py_DECREF(h->o[--h->n]);
}

static const char *hold_id(struct held *h, PyObject *o)
{
	PyObject *b = id_bytes(o);

	if (b == NULL)
		return NULL;
	h->o[h->n++] = b;
	return PyBytes_AsString(b);
}

/* None or an id: NULL for None (no exception), else the text. */
static int optional_id(struct held *h, PyObject *o, const char **out)
{
	*out = NULL;
	if (o == Py_None)
		return 0;
	*out = hold_id(h, o);
	return *out != NULL ? 0 : -1;
}

/* A slot (buffer, dtype code, offset, shape, strides or None: row-major
 * contiguous) into an operand: 1 done, 0 a value a record cannot hold,
 * -1 an exception. */
static int slot_operand(struct held *h, PyObject *slot, struct regen_record_operand *op)
{
	PyObject *buffer, *dtype, *offset, *shape, *strides;
	Py_ssize_t rank;
	uint64_t u;
	int r;

	if (!PyArg_ParseTuple(slot, "OOOOO", &buffer, &dtype, &offset, &shape, &strides))
		return -1;
	op->buffer = hold_id(h, buffer);
	if (op->buffer == NULL)
		return -1;
	if ((r = as_uint64(dtype, &u)) <= 0)
		return r;
	op->dtype = u > 255 ? 255 : (enum regen_dtype)u;
	if ((r = as_uint64(offset, &op->offset)) <= 0)
		return r;
	rank = PySequence_Size(shape);
	if (rank < 0)
		return -1;
	if (rank < 1 || rank > RANK_MAX)
		return 0;
	op->rank = (uint32_t)rank;
	for (Py_ssize_t i = 0; i < rank; i++)
		if ((r = item_int64(shape, i, &op->shape[i])) <= 0)
			return r;
	if (strides == Py_None) {
		int64_t step = 1;

		for (Py_ssize_t i = rank - 1; i >= 0; i--) {
			op->strides[i] = step;
			step *= op->shape[i] > 0 ? op->shape[i] : 1;
		}
		return 1;
	}
	Py_ssize_t n = PySequence_Size(strides);
	if (n < 0)
		return -1;
	if (n != rank)
		return 0;
	for (Py_ssize_t i = 0; i < rank; i++)
		if ((r = item_int64(strides, i, &op->strides[i])) <= 0)
			return r;
	return 1;
}

static int parse_scalars(PyObject *record, struct regen_record_call *call)
{
	return PyArg_ParseTuple(record, "IIIIdddI", &call->flags, &call->epilogue, &call->compute, &call->alignment,
				&call->alpha, &call->beta, &call->scale, &call->deadline_ms) ? 0 : -1;
}

static PyObject *queue(regen_client *c, int device, struct regen_record_call *call, struct held *h)
{
	uint64_t ticket = 0;
	int r;

	Py_BEGIN_ALLOW_THREADS
	r = lib.record_submit(c, device, call, &ticket);
	Py_END_ALLOW_THREADS
	held_release(h);
	return PyLong_FromLongLong(r < 0 ? r : (long long)ticket);
}

/* submit(client, device, op, record, wait_event, signal_event, slots) ->
 * ticket, or -errno. record: (flags, epilogue, compute, alignment, alpha,
 * beta, scale, deadline_ms); events: ids or None; slots: the op's operand
 * slots in order, each None or (buffer, dtype code, offset, shape,
 * strides). */
static PyObject *submit(PyObject *self, PyObject *args)
{
	PyObject *capsule, *record, *wait, *signal, *slots;
	struct regen_record_call call = { 0 };
	struct held h = { .n = 0 };
	regen_client *c;
	int device, r;
	(void)self;

	if (!PyArg_ParseTuple(args, "OiIOOOO", &capsule, &device, &call.op, &record, &wait, &signal, &slots) ||
	    (c = client_of(capsule)) == NULL || parse_scalars(record, &call) < 0)
		return NULL;
	if (!PyTuple_Check(slots) && !PyList_Check(slots)) {
		PyErr_SetString(PyExc_TypeError, "submit: slots is a tuple or a list");
		return NULL;
	}
	Py_ssize_t n = PySequence_Size(slots);
	if (n > REGEN_RECORD_OPERANDS) {
		PyErr_SetString(PyExc_ValueError, "submit: more operands than a record holds");
		return NULL;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *slot = PySequence_GetItem(slots, i);

		if (slot == NULL)
			goto fail;
		r = slot == Py_None ? 1 : slot_operand(&h, slot, &call.operands[i]);
		Py_DECREF(slot);
		if (r < 0)
			goto fail;
		if (r == 0) {
			held_release(&h);
			return PyLong_FromLong(-ERANGE);
		}
	}
	if (optional_id(&h, wait, &call.wait_event) < 0 || optional_id(&h, signal, &call.signal_event) < 0)
		goto fail;
	return queue(c, device, &call, &h);
fail:
	held_release(&h);
	return NULL;
}

/* An address (a span's start or end, a tensor's data_ptr()): an int of
 * 64 bits, read by the mask (the exact conversion goes through a byte
 * array for every int past 2^30, a measurable part of a call for the
 * dozen a call reads); one that is not an int is refused. 1 read, -1
 * error. */
static int address_of(PyObject *o, unsigned long long *out)
{
	if (o == NULL || !PyLong_Check(o)) {
		if (o != NULL)
			PyErr_SetString(PyExc_TypeError, "an address is an int");
		return -1;
	}
	*out = PyLong_AsUnsignedLongLongMask(o);
	return *out == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 1;
}

/* Field i (0: start, 1: end) of a span (start, end, buffer): 1 read, 0 not
 * such a span (not covered), -1 error. */
static int span_field(PyObject *entry, Py_ssize_t i, unsigned long long *out)
{
	if (!entry || !PyTuple_Check(entry) || PyTuple_Size(entry) != 3) {
		PyErr_Clear();
		return 0;
	}
	return address_of(PyTuple_GetItem(entry, i), out);
}

static PyObject *call0(PyObject *obj, PyObject *name)
{
	return PyObject_CallMethodObjArgs(obj, name, NULL);
}

/* One operand from tensor t: 1 written, 0 not covered, -1 error. */
static int tensor_operand(struct held *h, struct regen_record_operand *op, PyObject *t, long local, PyObject *kept,
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
	/* A compute call's dtypes (f64, i64 and u8 are programs' alone). */
	if (dtype < 0 || (dtype > REGEN_I32 && dtype != REGEN_E4M3 && dtype != REGEN_E5M2))
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
	/* Rank 0 and past 4: the other way's (its refusal, or regend's, by
	 * name). */
	if (rank < 1 || rank > RANK_MAX)
		goto out;

	o = call0(t, s_data_ptr);
	if (!o) {
		r = -1;
		goto out;
	}
	unsigned long long ptr;
	int got = address_of(o, &ptr);
	Py_DECREF(o);
	if (got < 0) {
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
	op->dtype = (enum regen_dtype)dtype;
	op->rank = (uint32_t)rank;
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
	/* The buffer as a Buffer object or its id text (libregen's pool hands
	 * ids). */
	op->buffer = hold_id(h, buffer);
	r = op->buffer != NULL ? 1 : -1;
out:
	Py_XDECREF(shape);
	Py_XDECREF(strides);
	return r;
}

/* submit_tensors(client, device, op, record, signal_event, names, tensors,
 * local, kept, dtypes) -> ticket, 0 (nothing queued: a tensor is not
 * covered) or -errno.
 *
 * names: the op's operand slots in order; tensors: name -> tensor or None;
 * local: the tensors' device (get_device(), -1 for host memory); kept:
 * [(start, end, buffer)] spans of memory sorted by start, not overlapping;
 * dtypes: torch dtype -> dtype code. */
static PyObject *submit_tensors(PyObject *self, PyObject *args)
{
	PyObject *capsule, *record, *signal, *names, *tensors, *kept, *dtypes;
	struct regen_record_call call = { 0 };
	struct held h = { .n = 0 };
	regen_client *c;
	long local;
	int device;
	(void)self;

	if (!PyArg_ParseTuple(args, "OiIOOOOlOO", &capsule, &device, &call.op, &record, &signal, &names, &tensors,
			      &local, &kept, &dtypes) ||
	    (c = client_of(capsule)) == NULL || parse_scalars(record, &call) < 0)
		return NULL;
	if (!PyTuple_Check(names) || !PyDict_Check(tensors) || !PyList_Check(kept) || !PyDict_Check(dtypes)) {
		PyErr_SetString(PyExc_TypeError, "submit_tensors: names a tuple; tensors, dtypes dicts; kept a list");
		return NULL;
	}
	Py_ssize_t nslots = PyTuple_Size(names);
	if (nslots > REGEN_RECORD_OPERANDS) {
		PyErr_SetString(PyExc_ValueError, "submit_tensors: more operands than a record holds");
		return NULL;
	}
	for (Py_ssize_t i = 0; i < nslots; i++) {
		PyObject *t = PyDict_GetItem(tensors, PyTuple_GetItem(names, i));   /* borrowed */
		int r;

		if (!t || t == Py_None)
			continue;
		r = tensor_operand(&h, &call.operands[i], t, local, kept, dtypes);
		if (r <= 0) {
			held_release(&h);
			return r < 0 ? NULL : PyLong_FromLong(0);
		}
	}
	if (optional_id(&h, signal, &call.signal_event) < 0) {
		held_release(&h);
		return NULL;
	}
	return queue(c, device, &call, &h);
}

/* run(client, device, program, bindings, scalars, wait_event, signal_event,
 * deadline_ms, journal, journal_offset, seq, retry, journal_marks) ->
 * ticket, or -errno. bindings: [(bound position, name, buffer, offset)];
 * scalars: [(bound position, name, value)]; journal: a buffer or None. */
static PyObject *run(PyObject *self, PyObject *args)
{
	PyObject *capsule, *program, *bindings, *scalars, *wait, *signal, *journal, *journal_offset, *seq;
	struct regen_record_run rr = { 0 };
	struct regen_record_binding *bind = NULL;
	struct regen_record_scalar *sc = NULL;
	PyObject **keep = NULL;
	Py_ssize_t nkeep = 0, nb, ns;
	struct held h = { .n = 0 };
	uint64_t ticket = 0;
	regen_client *c;
	PyObject *out = NULL;
	int device, retry, marks, r;
	(void)self;

	if (!PyArg_ParseTuple(args, "OiOOOOOIOOOpp", &capsule, &device, &program, &bindings, &scalars, &wait, &signal,
			      &rr.deadline_ms, &journal, &journal_offset, &seq, &retry, &marks) ||
	    (c = client_of(capsule)) == NULL)
		return NULL;
	if (!PyList_Check(bindings) || !PyList_Check(scalars)) {
		PyErr_SetString(PyExc_TypeError, "run: bindings and scalars are lists");
		return NULL;
	}
	nb = PyList_Size(bindings);
	ns = PyList_Size(scalars);
	bind = PyMem_Calloc((size_t)nb + 1, sizeof(*bind));
	sc = PyMem_Calloc((size_t)ns + 1, sizeof(*sc));
	keep = PyMem_Calloc((size_t)(2 * nb + ns) + 1, sizeof(*keep));
	if (bind == NULL || sc == NULL || keep == NULL) {
		PyErr_NoMemory();
		goto done;
	}
	for (Py_ssize_t i = 0; i < nb; i++) {
		PyObject *name, *buffer, *offset, *nb_bytes, *id;

		if (!PyArg_ParseTuple(PyList_GetItem(bindings, i), "IOOO", &bind[i].bound, &name, &buffer, &offset))
			goto done;
		if ((nb_bytes = PyUnicode_AsUTF8String(name)) == NULL)
			goto done;
		keep[nkeep++] = nb_bytes;
		if ((id = id_bytes(buffer)) == NULL)
			goto done;
		keep[nkeep++] = id;
		bind[i].name = PyBytes_AsString(nb_bytes);
		bind[i].buffer = PyBytes_AsString(id);
		if ((r = as_uint64(offset, &bind[i].offset)) <= 0) {
			if (r == 0)
				out = PyLong_FromLong(-ERANGE);
			goto done;
		}
	}
	for (Py_ssize_t i = 0; i < ns; i++) {
		PyObject *name, *nb_bytes;

		if (!PyArg_ParseTuple(PyList_GetItem(scalars, i), "IOd", &sc[i].bound, &name, &sc[i].value))
			goto done;
		if ((nb_bytes = PyUnicode_AsUTF8String(name)) == NULL)
			goto done;
		keep[nkeep++] = nb_bytes;
		sc[i].name = PyBytes_AsString(nb_bytes);
	}
	if ((rr.program = hold_id(&h, program)) == NULL || optional_id(&h, wait, &rr.wait_event) < 0 ||
	    optional_id(&h, signal, &rr.signal_event) < 0 || optional_id(&h, journal, &rr.journal) < 0)
		goto done;
	if ((r = as_uint64(journal_offset, &rr.journal_offset)) <= 0 || (r = as_uint64(seq, &rr.seq)) <= 0) {
		if (r == 0)
			out = PyLong_FromLong(-ERANGE);
		goto done;
	}
	rr.bind = bind;
	rr.nbind = (size_t)nb;
	rr.scalars = sc;
	rr.nscalars = (size_t)ns;
	rr.retry = retry != 0;
	rr.journal_marks = marks != 0;
	Py_BEGIN_ALLOW_THREADS
	r = lib.record_run_submit(c, device, &rr, &ticket);
	Py_END_ALLOW_THREADS
	out = PyLong_FromLongLong(r < 0 ? r : (long long)ticket);
done:
	held_release(&h);
	for (Py_ssize_t i = 0; i < nkeep; i++)
		Py_DECREF(keep[i]);
	PyMem_Free(bind);
	PyMem_Free(sc);
	PyMem_Free(keep);
	return out;
}

/* wait(client, device, ticket) -> elapsed_us of the last call answered, or
 * -errno. */
static PyObject *wait_(PyObject *self, PyObject *args)
{
	PyObject *capsule;
	unsigned long long ticket;
	regen_client *c;
	int device, r;
	(void)self;

	if (!PyArg_ParseTuple(args, "OiK", &capsule, &device, &ticket) || (c = client_of(capsule)) == NULL)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	r = lib.wait(c, device, ticket);
	Py_END_ALLOW_THREADS
	if (r < 0)
		return PyLong_FromLong(r);
	return PyLong_FromUnsignedLongLong(lib.last_elapsed_us(c, device));
}

static PyObject *text_or_none(const char *s)
{
	if (s == NULL)
		Py_RETURN_NONE;
	return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

/* error(client) -> (name, parameters as JSON text, message, ticket): what
 * the last failure left (None where it has none). */
static PyObject *error(PyObject *self, PyObject *args)
{
	PyObject *capsule;
	regen_client *c;
	(void)self;

	if (!PyArg_ParseTuple(args, "O", &capsule) || (c = client_of(capsule)) == NULL)
		return NULL;
	return Py_BuildValue("(NNNK)", text_or_none(lib.error_name(c)), text_or_none(lib.error_parameters(c)),
			     text_or_none(lib.error_message(c)), (unsigned long long)lib.error_ticket(c));
}

/* tickets(client, device) -> (handed out, answered). */
static PyObject *tickets(PyObject *self, PyObject *args)
{
	PyObject *capsule;
	uint64_t submitted = 0, completed = 0;
	regen_client *c;
	int device;
	(void)self;

	if (!PyArg_ParseTuple(args, "Oi", &capsule, &device) || (c = client_of(capsule)) == NULL)
		return NULL;
	lib.tickets(c, device, &submitted, &completed);
	return Py_BuildValue("(KK)", (unsigned long long)submitted, (unsigned long long)completed);
}

/* timing(client, device) -> (submitted, taken, launched, finished,
 * published, completed) ns of the device's last answered call. */
static PyObject *timing(PyObject *self, PyObject *args)
{
	PyObject *capsule;
	struct regen_call_timing t = { 0 };
	regen_client *c;
	int device;
	(void)self;

	if (!PyArg_ParseTuple(args, "Oi", &capsule, &device) || (c = client_of(capsule)) == NULL)
		return NULL;
	lib.last_timing(c, device, &t);
	return Py_BuildValue("(KKKKKK)", (unsigned long long)t.submitted_ns, (unsigned long long)t.taken_ns,
			     (unsigned long long)t.launched_ns, (unsigned long long)t.finished_ns,
			     (unsigned long long)t.published_ns, (unsigned long long)t.completed_ns);
}

static PyObject *doorbells(PyObject *self, PyObject *args)
{
	PyObject *capsule;
	regen_client *c;
	(void)self;

	if (!PyArg_ParseTuple(args, "O", &capsule) || (c = client_of(capsule)) == NULL)
		return NULL;
	return PyLong_FromUnsignedLongLong(lib.doorbells(c));
}

/* set_job(client, job or None) -> 0 or -errno. */
static PyObject *set_job(PyObject *self, PyObject *args)
{
	PyObject *capsule;
	const char *job;
	regen_client *c;
	int r;
	(void)self;

	if (!PyArg_ParseTuple(args, "Oz", &capsule, &job) || (c = client_of(capsule)) == NULL)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	r = lib.set_job(c, job);
	Py_END_ALLOW_THREADS
	return PyLong_FromLong(r);
}

static PyMethodDef methods[] = {
	{ "load", load, METH_VARARGS, "Loads libregen from a path." },
	{ "connect", connect_, METH_VARARGS, "A libregen client whose lanes take the ring." },
	{ "submit", submit, METH_VARARGS, "Queues a call in the record's terms: its ticket, or -errno." },
	{ "submit_tensors", submit_tensors, METH_VARARGS,
	  "Queues a call whose operands are tensors in known spans: its ticket, 0 where one is not covered, or -errno." },
	{ "run", run, METH_VARARGS, "Queues a program Run in the record's terms: its ticket, or -errno." },
	{ "wait", wait_, METH_VARARGS, "Waits for a ticket: the last elapsed_us, or -errno." },
	{ "error", error, METH_VARARGS, "(name, parameters, message, ticket) of the last failure." },
	{ "tickets", tickets, METH_VARARGS, "(handed out, answered) on a device's lane." },
	{ "timing", timing, METH_VARARGS, "The stage times of a device's last answered call." },
	{ "doorbells", doorbells, METH_VARARGS, "Doorbells rung on the lanes' rings." },
	{ "set_job", set_job, METH_VARARGS, "States the client's job: 0 or -errno." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "regen._accel",
	"The Python client's lanes over libregen's ring (optional; regen/_accel.c).", -1, methods,
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
