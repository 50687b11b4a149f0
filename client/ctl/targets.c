/* SPDX-License-Identifier: Apache-2.0 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <cjson/cJSON.h>
#include "client/ctl/targets.h"

/* The variables a job's GPUs come from, in the order they are trusted.
 * Slurm's name the GPUs by the node's numbering (the nvidia-smi index, as
 * regend numbers them under CUDA_DEVICE_ORDER=PCI_BUS_ID); inside a step
 * whose cgroup hides GPUs, CUDA_VISIBLE_DEVICES counts only those it sees,
 * so it comes last. NVIDIA_VISIBLE_DEVICES is what the NVIDIA container
 * runtime and the Kubernetes device plugin set: UUIDs. */
static const char *const job_vars[] = {
	"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", NULL,
};

static bool all_digits(const char *s, size_t n)
{
	if (n == 0)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isdigit((unsigned char)s[i]))
			return false;
	return true;
}

/* "N" or "N-M": 1 with the bounds set; 0 when the item is not one. A MIG
 * device by index, "GPU:MIG" (the device plugin's index strategy), is a
 * part of GPU N: N. */
static int index_range(const char *item, long *lo, long *hi)
{
	const char *dash = strchr(item, '-'), *colon = strchr(item, ':');
	size_t n = strlen(item);

	if (all_digits(item, n)) {
		*lo = *hi = strtol(item, NULL, 10);
		return 1;
	}
	if (colon && all_digits(item, (size_t)(colon - item)) && all_digits(colon + 1, strlen(colon + 1))) {
		*lo = *hi = strtol(item, NULL, 10);
		return 1;
	}
	if (dash && all_digits(item, (size_t)(dash - item)) && all_digits(dash + 1, strlen(dash + 1))) {
		*lo = strtol(item, NULL, 10);
		*hi = strtol(dash + 1, NULL, 10);
		return 1;
	}
	return 0;
}

/* domain:bus:device.function, the domain optional (nvidia-smi writes
 * 00000000:65:00.0, lspci and Slurm 0000:65:00.0 or 65:00.0). */
static bool parse_pci(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn)
{
	int end = 0;

	*dom = 0;
	if (sscanf(s, "%x:%x:%x.%x%n", dom, bus, dev, fn, &end) == 4 && s[end] == '\0')
		return true;
	end = 0;
	*dom = 0;
	return sscanf(s, "%x:%x.%x%n", bus, dev, fn, &end) == 3 && s[end] == '\0';
}

static bool same_pci(const char *a, const char *b)
{
	unsigned x[4], y[4];

	return parse_pci(a, &x[0], &x[1], &x[2], &x[3]) && parse_pci(b, &y[0], &y[1], &y[2], &y[3]) &&
	       memcmp(x, y, sizeof(x)) == 0;
}

/* A UUID as Status says it ("GPU-…", "HOST-N"), the "GPU-" optional. */
static bool same_uuid(const char *given, const char *uuid)
{
	if (!uuid || !uuid[0])
		return false;
	if (strcasecmp(given, uuid) == 0)
		return true;
	return strncasecmp(uuid, "GPU-", 4) == 0 && strcasecmp(given, uuid + 4) == 0;
}

/* What may name a device besides an index: a UUID as NVML or the host
 * backend writes it (GPU-…, MIG-…, HOST-N) or bare (8-4-4-4-12 hex), or a
 * PCI bus id. Anything else is a typo, refused before regend is asked. */
static bool looks_like_name(const char *item)
{
	unsigned d[4];
	int end = 0;
	char hex[5][13];

	if (strncasecmp(item, "GPU-", 4) == 0 || strncasecmp(item, "MIG-", 4) == 0 || strncasecmp(item, "HOST-", 5) == 0)
		return item[strcspn(item, "-") + 1] != '\0';
	if (parse_pci(item, &d[0], &d[1], &d[2], &d[3]))
		return true;
	return sscanf(item, "%8[0-9a-fA-F]-%4[0-9a-fA-F]-%4[0-9a-fA-F]-%4[0-9a-fA-F]-%12[0-9a-fA-F]%n", hex[0], hex[1],
		      hex[2], hex[3], hex[4], &end) == 5 && item[end] == '\0';
}

int ctl_targets_check(const char *list, char *msg, size_t len)
{
	const char *p = list;

	if (!list[0]) {
		snprintf(msg, len, "--device: empty list");
		return -EINVAL;
	}
	while (*p) {
		size_t n = strcspn(p, ",");
		char item[128];
		long lo, hi;

		if (n == 0 || n >= sizeof(item)) {
			snprintf(msg, len, "--device: not a device list: '%s'", list);
			return -EINVAL;
		}
		memcpy(item, p, n);
		item[n] = '\0';
		for (size_t i = 0; i < n; i++) {
			if (!isgraph((unsigned char)item[i])) {
				snprintf(msg, len, "--device: not a device list: '%s'", list);
				return -EINVAL;
			}
		}
		if (index_range(item, &lo, &hi) ? lo > hi || hi >= REGEN_DEVICES_MAX : !looks_like_name(item)) {
			snprintf(msg, len, "--device: '%s' is no device index or range below %d, GPU UUID or PCI bus id",
				 item, REGEN_DEVICES_MAX);
			return -EINVAL;
		}
		p += n;
		if (*p == ',' && *++p == '\0') {
			snprintf(msg, len, "--device: not a device list: '%s'", list);
			return -EINVAL;
		}
	}
	return 0;
}

/* The device whose health (io.regen.Device.Health, in the reply as JSON)
 * says `key` is `item`: a MIG device's UUID in mig_devices, a minor number
 * in minor_number. -1 when none. */
static int lookup_health(const regen_status *st, const char *key, const char *item, long number)
{
	char *text = regen_status_to_json(st);
	cJSON *reply = text ? cJSON_Parse(text) : NULL, *d;
	int found = -1;

	free(text);
	cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(reply, "devices")) {
		const cJSON *h = cJSON_GetObjectItemCaseSensitive(d, "health"), *v = cJSON_GetObjectItemCaseSensitive(h, key);
		const cJSON *index = cJSON_GetObjectItemCaseSensitive(d, "index"), *u;
		bool match = false;

		if (item)
			cJSON_ArrayForEach(u, v) match = match || (cJSON_IsString(u) && strcasecmp(u->valuestring, item) == 0);
		else
			match = cJSON_IsNumber(v) && (long)v->valuedouble == number;
		if (match && cJSON_IsNumber(index)) {
			found = (int)index->valuedouble;
			break;
		}
	}
	cJSON_Delete(reply);
	return found;
}

/* The device a UUID, a MIG device's UUID or a PCI bus id names, -1 when
 * none. A MIG device names the GPU it is a part of: regend serves whole
 * GPUs, so its restart is the GPU's. */
static int lookup(const regen_status *st, const char *item)
{
	unsigned d[4];
	bool pci = parse_pci(item, &d[0], &d[1], &d[2], &d[3]);

	if (strncasecmp(item, "MIG-", 4) == 0)
		return lookup_health(st, "mig_devices", item, 0);
	for (int i = 0; i < regen_status_device_count(st); i++) {
		const struct regen_device_info *dev = regen_status_device(st, i);

		if (!REGEN_HAS_FIELD(dev, pci_bus_id) || !dev->has_health)
			continue;
		if (pci ? same_pci(item, dev->pci_bus_id) : same_uuid(item, dev->uuid))
			return dev->index;
	}
	return -1;
}

int ctl_targets_from_list(regen_client *c, const char *list, struct ctl_targets *t, char *msg, size_t len)
{
	regen_status *st = NULL;
	const char *p = list;
	int r = ctl_targets_check(list, msg, len);

	if (r < 0)
		return r;
	memset(t->want, 0, sizeof(t->want));
	t->all = false;
	t->count = 0;
	while (*p) {
		size_t n = strcspn(p, ",");
		char item[128];
		long lo, hi;
		int index;

		memcpy(item, p, n);
		item[n] = '\0';
		p += n + (p[n] == ',');
		if (index_range(item, &lo, &hi)) {
			for (long i = lo; i <= hi; i++) {
				t->count += !t->want[i];
				t->want[i] = true;
			}
			continue;
		}
		if (!st && (r = regen_generation_get(c, &st)) < 0)
			return r;
		index = lookup(st, item);
		if (index < 0 || index >= REGEN_DEVICES_MAX) {
			snprintf(msg, len, strncasecmp(item, "MIG-", 4) == 0 ?
					   "no GPU has the MIG device '%s' ('regenctl --json status' lists them)" :
					   "no device has the UUID or PCI bus id '%s' ('regenctl status' lists them)", item);
			regen_status_free(st);
			return -ENODEV;
		}
		t->count += !t->want[index];
		t->want[index] = true;
	}
	regen_status_free(st);
	return 0;
}

/* The NVIDIA device plugin's volume-mounts strategy: NVIDIA_VISIBLE_DEVICES
 * names a folder (/var/run/nvidia-container-devices) that holds one entry
 * per GPU of the container, named by its UUID (or index, or MIG device).
 * Their names, as a --device list, in list. */
static int list_folder(const char *dir, char *list, size_t size, char *msg, size_t len)
{
	struct dirent **names = NULL;
	int n = scandir(dir, &names, NULL, alphasort), r = 0;
	size_t used = 0;

	if (n < 0) {
		snprintf(msg, len, "cannot read the folder of the job's GPUs %s: %s", dir, strerror(errno));
		return -ENODEV;
	}
	list[0] = '\0';
	for (int i = 0; i < n; i++) {
		const char *name = names[i]->d_name;

		if (name[0] != '.' && r == 0) {
			int w = snprintf(list + used, size - used, "%s%s", used ? "," : "", name);
			if (w < 0 || (size_t)w >= size - used) {
				snprintf(msg, len, "%s lists more GPUs than regenctl takes", dir);
				r = -EINVAL;
			} else {
				used += (size_t)w;
			}
		}
		free(names[i]);
	}
	free(names);
	return r;
}

/* CDI (the device plugin's cdi-annotations and cdi-cri strategies): the
 * container's environment says NVIDIA_VISIBLE_DEVICES=void (the CDI spec
 * sets it, so the older hook does nothing) and the GPUs are the device
 * nodes the spec put in the container, /dev/nvidia<minor>. Those the
 * container has, by minor number, as regend's devices. REGEN_DEV_DIR
 * stands for /dev in tests. 0 with t->count 0 when there is none (the job
 * has no GPU). */
static int from_device_nodes(regen_client *c, struct ctl_targets *t, char *msg, size_t len)
{
	const char *dev = getenv("REGEN_DEV_DIR") && getenv("REGEN_DEV_DIR")[0] ? getenv("REGEN_DEV_DIR") : "/dev";
	regen_status *st = NULL;
	struct dirent **names = NULL;
	int n = scandir(dev, &names, NULL, alphasort), r = 0;
	size_t used = strlen(t->from);

	for (int i = 0; i < n; i++) {
		const char *name = names[i]->d_name;

		if (r == 0 && strncmp(name, "nvidia", 6) == 0 && all_digits(name + 6, strlen(name + 6))) {
			long minor = strtol(name + 6, NULL, 10);
			int index;

			if (!st && (r = regen_generation_get(c, &st)) < 0)
				break;
			index = lookup_health(st, "minor_number", NULL, minor);
			if (index < 0 || index >= REGEN_DEVICES_MAX) {
				snprintf(msg, len, "the container's %s/%s is no GPU regend serves (its minor number %ld is "
					 "none of regenctl --json status's minor_number)", dev, name, minor);
				r = -ENODEV;
			} else {
				t->count += !t->want[index];
				t->want[index] = true;
				used += (size_t)snprintf(t->from + used, used < sizeof(t->from) ? sizeof(t->from) - used : 0,
							 "%s%s/%s", t->count == 1 ? " (CDI): " : ",", dev, name);
				if (used >= sizeof(t->from))
					used = sizeof(t->from) - 1;
			}
		}
		free(names[i]);
	}
	free(names);
	regen_status_free(st);
	return r;
}

int ctl_targets_from_job(regen_client *c, struct ctl_targets *t, char *msg, size_t len)
{
	const char *name = NULL, *value = NULL;

	memset(t, 0, sizeof(*t));
	for (int i = 0; job_vars[i]; i++) {
		value = getenv(job_vars[i]);
		if (value) {
			name = job_vars[i];
			break;
		}
	}
	if (!name) {
		snprintf(t->from, sizeof(t->from), "none of SLURM_STEP_GPUS, SLURM_JOB_GPUS, NVIDIA_VISIBLE_DEVICES, "
			 "CUDA_VISIBLE_DEVICES is set");
		return 0;
	}
	snprintf(t->from, sizeof(t->from), "%s=%.160s", name, value);
	if (strcmp(name, "NVIDIA_VISIBLE_DEVICES") == 0 && strcmp(value, "void") == 0)
		return from_device_nodes(c, t, msg, len);
	if (!value[0] || strcmp(value, "none") == 0 || strcmp(value, "void") == 0 || strcmp(value, "NoDevFiles") == 0)
		return 0;
	if (strcmp(value, "all") == 0) {
		t->all = true;
		return 0;
	}
	if (strcmp(name, "NVIDIA_VISIBLE_DEVICES") == 0 && value[0] == '/') {
		char list[4096];
		int r = list_folder(value, list, sizeof(list), msg, len);

		if (r < 0 || !list[0])
			return r;
		return ctl_targets_from_list(c, list, t, msg, len);
	}
	return ctl_targets_from_list(c, value, t, msg, len);
}
