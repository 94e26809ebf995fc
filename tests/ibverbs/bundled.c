/* A program that brings its own libibverbs, as a Python wheel does:
 * linked against a renamed copy (auditwheel's `libibverbs-<hash>.so...`)
 * that its RUNPATH finds, which LD_LIBRARY_PATH never reaches. Prints
 * the file ibv_get_device_list is mapped from (/proc/self/maps: the
 * linker's own name for the object may be a path it tried) and the
 * devices it lists; with
 * an argument, also dlopen()s that path (a full path: no search at all)
 * and checks it gives the same library.
 *
 * Under `uroce exec` (tests/ibverbs/audit.sh) the file is uroce's
 * libibverbs.so.1 and the list holds uroce's devices: exit 0 when the
 * first listed device is named as $WANT_DEVICE, 1 otherwise. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* The file /proc/self/maps says `addr` is mapped from ("" if none). */
static const char *mapped_from(const void *addr)
{
	static char file[4096];
	char line[4600];
	FILE *f = fopen("/proc/self/maps", "r");
	file[0] = 0;
	while (f && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %4095s", &lo, &hi, file) == 3 &&
		    (unsigned long)addr >= lo && (unsigned long)addr < hi)
			break;
		file[0] = 0;
	}
	if (f)
		fclose(f);
	return file;
}

int main(int argc, char **argv)
{
	const char *want = getenv("WANT_DEVICE");
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);

	printf("ibv_get_device_list from %s\n", mapped_from((void *)ibv_get_device_list));
	for (int i = 0; i < n; i++)
		printf("device %s\n", ibv_get_device_name(list[i]));
	CHECK(n > 0 && want && !strcmp(ibv_get_device_name(list[0]), want),
	      "%d devices, the first %s (want %s)", n,
	      n > 0 ? ibv_get_device_name(list[0]) : "-", want ? want : "?");
	if (list)
		ibv_free_device_list(list);
	if (argc > 1) {
		void *h = dlopen(argv[1], RTLD_NOW);
		MUST(h);
		CHECK(dlsym(h, "ibv_get_device_list") == (void *)ibv_get_device_list,
		      "dlopen(%s) gives the same library", argv[1]);
	}
	/* A module that needs librdmacm.so.1 by version (as UCX's
	 * libuct_rdmacm does): one file with the libibverbs already loaded. */
	if (argc > 2) {
		void *h = dlopen(argv[2], RTLD_NOW);
		CHECK(h != NULL, "dlopen(%s): %s", argv[2], h ? "loaded" : dlerror());
	}
	printf("bundled.c: %d checks passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
