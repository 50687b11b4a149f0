/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "daemon/supervisor/kept_programs.h"

void rd_sv_kept_programs_init(struct rd_sv_kept_programs *k)
{
	memset(k, 0, sizeof(*k));
}

static void kept_free(struct rd_sv_kept_program *p)
{
	free(p->message);
	free(p);
}

void rd_sv_kept_programs_finish(struct rd_sv_kept_programs *k)
{
	struct rd_sv_kept_program *p, *next;

	for (p = k->head; p; p = next) {
		next = p->next;
		kept_free(p);
	}
	rd_sv_kept_programs_init(k);
}

static bool same_owner(const struct rd_sv_program_owner *a, const struct rd_sv_program_owner *b)
{
	return a->pid == b->pid && a->uid == b->uid && a->gid == b->gid && a->start_time == b->start_time &&
	       a->pidfs_inode == b->pidfs_inode;
}

void rd_sv_kept_programs_forget(struct rd_sv_kept_programs *k, const char *id)
{
	for (struct rd_sv_kept_program **pp = &k->head; *pp; pp = &(*pp)->next) {
		if (strcmp((*pp)->id, id) == 0) {
			struct rd_sv_kept_program *p = *pp;
			*pp = p->next;
			k->count--;
			kept_free(p);
			return;
		}
	}
}

int rd_sv_kept_programs_add(struct rd_sv_kept_programs *k, const char *id, const struct rd_sv_program_owner *owner,
			    unsigned nodes, const char *message, size_t len, const struct rd_options *o)
{
	uint64_t process_nodes = nodes, uid_nodes = nodes;
	unsigned process_programs = 1, uid_programs = 1;
	struct rd_sv_kept_program *p, **tail;

	rd_sv_kept_programs_forget(k, id);
	for (p = k->head; p; p = p->next) {
		if (p->owner.uid != owner->uid)
			continue;
		uid_programs++;
		uid_nodes += p->nodes;
		if (same_owner(&p->owner, owner)) {
			process_programs++;
			process_nodes += p->nodes;
		}
	}
	if (process_programs > o->max_programs || process_nodes > o->max_program_nodes ||
	    uid_programs > o->max_uid_programs || uid_nodes > o->max_uid_program_nodes)
		return -E2BIG;
	p = calloc(1, sizeof(*p));
	if (!p || !(p->message = malloc(len + 1))) {
		free(p);
		return -ENOMEM;
	}
	snprintf(p->id, sizeof(p->id), "%s", id);
	p->owner = *owner;
	p->nodes = nodes;
	memcpy(p->message, message, len);
	p->message[len] = '\0';
	p->len = len;
	/* In the order they came: the next worker defines them in it. */
	for (tail = &k->head; *tail; tail = &(*tail)->next)
		;
	*tail = p;
	k->count++;
	return 0;
}

static char *record(const struct rd_sv_kept_program *p)
{
	cJSON *o = cJSON_CreateObject();
	char number[24];
	char *text;

	cJSON_AddStringToObject(o, "program", p->id);
	cJSON_AddNumberToObject(o, "pid", p->owner.pid);
	cJSON_AddNumberToObject(o, "uid", p->owner.uid);
	cJSON_AddNumberToObject(o, "gid", p->owner.gid);
	snprintf(number, sizeof(number), "%" PRIu64, p->owner.start_time);
	cJSON_AddStringToObject(o, "start_time", number);
	snprintf(number, sizeof(number), "%" PRIu64, p->owner.pidfs_inode);
	cJSON_AddStringToObject(o, "pidfs_inode", number);
	cJSON_AddStringToObject(o, "message", p->message);
	text = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return text;
}

static int write_all(int fd, const char *buf, size_t n)
{
	while (n) {
		ssize_t w = write(fd, buf, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf += w;
		n -= (size_t)w;
	}
	return 0;
}

int rd_sv_kept_programs_memfd(const struct rd_sv_kept_programs *k)
{
	int fd = memfd_create("regen-kept-programs", MFD_CLOEXEC | MFD_ALLOW_SEALING), r = 0;

	if (fd < 0)
		return -errno;
	for (const struct rd_sv_kept_program *p = k->head; p && r == 0; p = p->next) {
		char *text = record(p);
		r = text ? write_all(fd, text, strlen(text) + 1) : -ENOMEM;
		free(text);
	}
	if (r == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
		r = -errno;
	if (r == 0 && lseek(fd, 0, SEEK_SET) < 0)
		r = -errno;
	if (r < 0) {
		close(fd);
		return r;
	}
	return fd;
}
