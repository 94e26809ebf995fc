/* What a program that looks for RDMA devices in sysfs finds under
 * `uroce exec` (its sysfs view): for every device ibv_get_device_list
 * returns, the files UCX, the pyverbs tests and rdma-core's helpers read,
 * agreeing with what the verbs calls say about the same device.
 *
 *   - ibdev_path is /sys/class/infiniband/<name>, dev_path
 *     /sys/class/infiniband_verbs/<dev_name>, as the kernel's;
 *   - ibv_read_sysfs_file: ports/1/state "4: ACTIVE", link_layer
 *     "Ethernet", node_guid = ibv_get_device_guid, gids/<n> =
 *     ibv_query_gid for the whole table, gid_attrs/types/<n> "RoCE v2"
 *     and gid_attrs/ndevs/<n> the interface ibv_query_gid_ex names, for
 *     the populated entries; infiniband_verbs/<dev_name>/ibdev = name;
 *   - fopen reads the same GID type (as UCX's ucs_read_file does with
 *     open(2), and Python with fopen-like calls);
 *   - readdir lists /sys/class/infiniband (every device) and
 *     <dev>/device/net (the GID's interface, as `ls` in the pyverbs tests);
 *   - writing is refused: open(O_WRONLY) fails with EACCES;
 *   - realpath(<ibdev_path>/../..) is the device's parent under
 *     /sys/devices, as Mooncake reads it, its numa_node -1;
 *   - the device node /dev/infiniband/<dev_name> is a character device
 *     through __xstat (what binaries linked before glibc 2.33 call for
 *     stat), __lxstat and statx as well as stat.
 *
 * Run with two or more devices configured, under `uroce exec`. Prints a
 * line per check and "sysfs.c: N checks passed"; exits 1 on a failure.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* glibc exports these (GLIBC_2.2.5) for binaries linked before 2.33,
 * whose stat() and lstat() call them; its headers no longer declare them. */
int __xstat(int ver, const char *path, struct stat *st);
int __lxstat(int ver, const char *path, struct stat *st);

/* rdma-core exports it (IBVERBS_1.0) but declares it only for drivers. */
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

#include "check.h"

/* A sysfs file under dir, newline stripped ("" if it cannot be read). */
static const char *rd(const char *dir, const char *file)
{
	static char buf[256];
	if (ibv_read_sysfs_file(dir, file, buf, sizeof(buf)) < 0)
		snprintf(buf, sizeof(buf), "<%s>", strerror(errno));
	return buf;
}

/* Whether directory `dir` lists `name`. */
static int lists(const char *dir, const char *name)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int found = 0;
	if (!d)
		return 0;
	while ((e = readdir(d)))
		found |= !strcmp(e->d_name, name);
	closedir(d);
	return found;
}

/* A GID as sysfs prints it: eight groups of four hex digits. */
static void gid_str(const union ibv_gid *g, char *out)
{
	for (int i = 0; i < 16; i += 2)
		sprintf(out + i / 2 * 5, "%02x%02x%s", g->raw[i], g->raw[i + 1],
			i < 14 ? ":" : "");
}

static void device(struct ibv_device *dev)
{
	const char *name = ibv_get_device_name(dev);
	char want[256], path[512], file[128];
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_port_attr pa;
	int populated = 0;

	printf("---- %s\n", name);
	snprintf(want, sizeof(want), "/sys/class/infiniband/%s", name);
	CHECK(!strcmp(dev->ibdev_path, want), "ibdev_path %s", dev->ibdev_path);
	snprintf(want, sizeof(want), "/sys/class/infiniband_verbs/%s", dev->dev_name);
	CHECK(!strcmp(dev->dev_path, want), "dev_path %s", dev->dev_path);
	if (!ctx || ibv_query_port(ctx, 1, &pa)) {
		CHECK(0, "open and query port 1");
		return;
	}
	CHECK(!strcmp(rd(dev->ibdev_path, "ports/1/state"), "4: ACTIVE"),
	      "ports/1/state: %s", rd(dev->ibdev_path, "ports/1/state"));
	CHECK(!strcmp(rd(dev->ibdev_path, "ports/1/link_layer"), "Ethernet"),
	      "ports/1/link_layer: %s", rd(dev->ibdev_path, "ports/1/link_layer"));
	unsigned long long guid = be64toh(ibv_get_device_guid(dev));
	snprintf(want, sizeof(want), "%04llx:%04llx:%04llx:%04llx", guid >> 48,
		 (guid >> 32) & 0xffff, (guid >> 16) & 0xffff, guid & 0xffff);
	CHECK(!strcmp(rd(dev->ibdev_path, "node_guid"), want), "node_guid %s",
	      rd(dev->ibdev_path, "node_guid"));
	CHECK(!strcmp(rd(dev->dev_path, "ibdev"), name), "%s/ibdev: %s",
	      dev->dev_path, rd(dev->dev_path, "ibdev"));

	for (int i = 0; i < pa.gid_tbl_len; i++) {
		union ibv_gid gid;
		struct ibv_gid_entry entry;
		char g[48], ifname[IF_NAMESIZE] = "";
		int ok = 1;
		if (ibv_query_gid(ctx, 1, i, &gid)) {
			CHECK(0, "ibv_query_gid %d", i);
			continue;
		}
		gid_str(&gid, g);
		snprintf(file, sizeof(file), "ports/1/gids/%d", i);
		ok &= !strcmp(rd(dev->ibdev_path, file), g);
		if (ibv_query_gid_ex(ctx, 1, i, &entry, 0) == 0) {
			populated++;
			snprintf(file, sizeof(file), "ports/1/gid_attrs/types/%d", i);
			ok &= !strcmp(rd(dev->ibdev_path, file),
				      entry.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1");
			snprintf(file, sizeof(file), "ports/1/gid_attrs/ndevs/%d", i);
			ok &= if_indextoname(entry.ndev_ifindex, ifname) &&
			      !strcmp(rd(dev->ibdev_path, file), ifname);
			/* device/net/<ifname>, as `ls` in the pyverbs tests lists it */
			snprintf(path, sizeof(path), "%s/device/net", dev->ibdev_path);
			ok &= lists(path, ifname);
			CHECK(ok, "GID %d %s: gids, types (%s), ndevs and device/net (%s)", i, g,
			      rd(dev->ibdev_path, "ports/1/gid_attrs/types/1"), ifname);
		} else if (!ok) {
			CHECK(0, "empty GID %d: gids/%d reads %s", i, i, rd(dev->ibdev_path, file));
		}
	}
	CHECK(populated > 0, "%d populated GID entries", populated);

	/* fopen, as Python and stdio readers do */
	snprintf(path, sizeof(path), "%s/ports/1/gid_attrs/types/1", dev->ibdev_path);
	FILE *f = fopen(path, "r");
	char line[64] = "";
	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
	}
	CHECK(!strcmp(line, "RoCE v2\n"), "fopen %s: %.7s", path, f ? line : strerror(errno));
	CHECK(lists("/sys/class/infiniband", name), "readdir /sys/class/infiniband lists %s", name);
	struct stat st;
	CHECK(stat(dev->ibdev_path, &st) == 0 && S_ISDIR(st.st_mode), "stat %s: a directory",
	      dev->ibdev_path);
	snprintf(path, sizeof(path), "%s/ports/1/state", dev->ibdev_path);
	int fd = open(path, O_WRONLY);
	CHECK(fd < 0 && errno == EACCES, "open(%s, O_WRONLY): EACCES", path);
	if (fd >= 0)
		close(fd);

	/* Mooncake: realpath of <dev>/../.. is the NIC's PCI device, whose
	 * numa_node it reads. */
	char resolved[PATH_MAX];
	snprintf(path, sizeof(path), "%s/../..", dev->ibdev_path);
	snprintf(want, sizeof(want), "/sys/devices/virtual/uroce/%s", name);
	CHECK(realpath(path, resolved) && !strcmp(resolved, want), "realpath %s: %s", path,
	      realpath(path, resolved) ? resolved : strerror(errno));
	CHECK(!strcmp(rd(want, "numa_node"), "-1"), "%s/numa_node: %s", want, rd(want, "numa_node"));
	snprintf(path, sizeof(path), "%s/device", dev->ibdev_path);
	CHECK(realpath(path, resolved) && !strcmp(resolved, want), "realpath %s: the same", path);

	/* The device node, through each name of stat. */
	struct statx stx;
	snprintf(path, sizeof(path), "/dev/infiniband/%s", dev->dev_name);
	CHECK(__xstat(1, path, &st) == 0 && S_ISCHR(st.st_mode), "__xstat %s: a character device",
	      path);
	CHECK(__lxstat(1, path, &st) == 0 && S_ISCHR(st.st_mode), "__lxstat %s", path);
	CHECK(stat(path, &st) == 0 && S_ISCHR(st.st_mode), "stat %s", path);
	CHECK(statx(AT_FDCWD, path, 0, STATX_BASIC_STATS, &stx) == 0 && S_ISCHR(stx.stx_mode),
	      "statx %s", path);
	CHECK(access(path, R_OK | W_OK) == 0, "access %s", path);
	ibv_close_device(ctx);
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		printf("FAIL  no devices\n");
		return 1;
	}
	CHECK(lists("/sys/class/infiniband_verbs", "abi_version"),
	      "readdir /sys/class/infiniband_verbs lists abi_version");
	for (int i = 0; i < n; i++)
		device(list[i]);
	ibv_free_device_list(list);
	printf("sysfs.c: %d checks passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
