/* The IPv4 and IPv6 wildcards on one port, as tgtd's iSER portal binds
 * them (issue 24, item 10): answered as the kernel's CMA answers.
 *
 *   * 0.0.0.0:P, then [::]:P without RDMA_OPTION_ID_AFONLY: the IPv6 id
 *     takes IPv4 too (net.ipv6.bindv6only=0), EADDRNOTAVAIL;
 *   * the same IPv6 id with AFONLY set: binds, and both listen;
 *   * AFONLY with a wrong length: EINVAL; after listen: EINVAL.
 *
 * Prints each check, then "bind6: N checks, N failed"; exits 1 on a
 * failure. Uses the devices of UROCE_DEVICES (the wildcard binds all). */
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

int main(void) {
	int port = 3260;
	struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons(port),
				   .sin6_addr = IN6ADDR_ANY_INIT };
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id4, *id6;
	if (!ch || rdma_create_id(ch, &id4, NULL, RDMA_PS_TCP) ||
	    rdma_create_id(ch, &id6, NULL, RDMA_PS_TCP)) {
		perror("rdma_create_id");
		return 1;
	}
	FILE *f = fopen("/proc/sys/net/ipv6/bindv6only", "r");
	int v6only = f && fgetc(f) == '1';
	if (f)
		fclose(f);

	int rc = rdma_bind_addr(id4, (struct sockaddr *)&a4);
	CHECK(rc == 0, "bind 0.0.0.0:%d: %s", port, rc ? strerror(errno) : "ok");
	errno = 0;
	rc = rdma_bind_addr(id6, (struct sockaddr *)&a6);
	if (v6only)
		CHECK(rc == 0, "bind [::]:%d (bindv6only=1): %s", port, rc ? strerror(errno) : "ok");
	else
		CHECK(rc == -1 && errno == EADDRNOTAVAIL,
		      "bind [::]:%d without AFONLY: EADDRNOTAVAIL, as the kernel (%s)", port,
		      rc ? strerror(errno) : "ok");
	if (rc != 0) {
		int one = 1;
		char byte = 1;
		errno = 0;
		rc = rdma_set_option(id6, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &byte, 1);
		CHECK(rc == -1 && errno == EINVAL, "AFONLY of one byte: EINVAL (%s)",
		      rc ? strerror(errno) : "ok");
		rc = rdma_set_option(id6, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof one);
		CHECK(rc == 0, "rdma_set_option AFONLY: %s", rc ? strerror(errno) : "ok");
		rc = rdma_bind_addr(id6, (struct sockaddr *)&a6);
		CHECK(rc == 0, "bind [::]:%d with AFONLY: %s", port, rc ? strerror(errno) : "ok");
	}
	rc = rdma_listen(id4, 8);
	CHECK(rc == 0, "listen on 0.0.0.0: %s", rc ? strerror(errno) : "ok");
	rc = rdma_listen(id6, 8);
	CHECK(rc == 0, "listen on [::]: %s", rc ? strerror(errno) : "ok");
	int zero = 0;
	errno = 0;
	rc = rdma_set_option(id6, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &zero, sizeof zero);
	CHECK(rc == -1 && errno == EINVAL, "AFONLY after listen: EINVAL (%s)",
	      rc ? strerror(errno) : "ok");
	rdma_destroy_id(id6);
	rdma_destroy_id(id4);
	rdma_destroy_event_channel(ch);
	printf("bind6: %d checks, %d failed\n", passed + failed, failed);
	return failed != 0;
}
