#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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

/* "N" or "N-M": 1 with the bounds set; 0 when the item is not one. */
static int index_range(const char *item, long *lo, long *hi)
{
	const char *dash = strchr(item, '-');
	size_t n = strlen(item);

	if (all_digits(item, n)) {
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

/* The device a UUID or PCI bus id names, -1 when none. */
static int lookup(const regen_status *st, const char *item)
{
	unsigned d[4];
	bool pci = parse_pci(item, &d[0], &d[1], &d[2], &d[3]);

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
			snprintf(msg, len, "no device has the UUID or PCI bus id '%s' ('regenctl status' lists them)", item);
			regen_status_free(st);
			return -ENODEV;
		}
		t->count += !t->want[index];
		t->want[index] = true;
	}
	regen_status_free(st);
	return 0;
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
	if (!value[0] || strcmp(value, "none") == 0 || strcmp(value, "void") == 0 || strcmp(value, "NoDevFiles") == 0)
		return 0;
	if (strcmp(value, "all") == 0) {
		t->all = true;
		return 0;
	}
	return ctl_targets_from_list(c, value, t, msg, len);
}
