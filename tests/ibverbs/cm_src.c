/* rdma_resolve_addr with an explicit source address on an id that is not
 * bound yet, as rping -I and sideway's cmtime -b call it, and what
 * librdmacm and the kernel's CMA answer for the source addresses that do
 * not work:
 *
 *   - a source on a device: ADDR_RESOLVED, the id bound to that address
 *     (rdma_get_local_addr) and on that device (id->verbs);
 *   - a source of family 0 (AF_UNSPEC): -1/EINVAL, as rdma-core's
 *     rdma_resolve_addr answers ("if (src_addr && !src_len) return
 *     ERR(EINVAL)"). This is what sideway 0.4.3's cmtime -b hands over
 *     when built with optimisations: its resolve_addr passes a pointer to
 *     a temporary sockaddr that is gone by the time of the call, so the
 *     EINVAL it reports is rdma-core's answer too, not uroce's fault;
 *   - a source of the other family than the destination: -1/EINVAL at
 *     once (the kernel's resolve_prepare_src), the id left bound to it;
 *   - a source no device has (and not loopback): -1/EADDRNOTAVAIL.
 *
 * Run with two devices, uroce0 and uroce1, on the addresses given as the
 * first two arguments. Prints a line per check and "cm_src.c: N checks
 * passed"; exits 1 on a failure.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static struct sockaddr_in v4(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", ip);
		exit(2);
	}
	return a;
}

/* The next event's type, or -1. */
static int next_event(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev;
	int t;
	if (rdma_get_cm_event(ch, &ev))
		return -1;
	t = ev->event;
	rdma_ack_cm_event(ev);
	return t;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s IP-OF-uroce0 IP-OF-uroce1\n", argv[0]);
		return 2;
	}
	const char *ip0 = argv[1], *ip1 = argv[2];
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in src, dst = v4(ip1, 7471);
	char got[64];
	int rc;

	if (!ch) {
		printf("FAIL  rdma_create_event_channel: %s\n", strerror(errno));
		return 1;
	}

	/* A source on a device, the id not bound: resolved from there. */
	for (int i = 0; i < 2; i++) {
		const char *sip = i ? ip1 : ip0, *dev = i ? "uroce1" : "uroce0";
		rdma_create_id(ch, &id, NULL, RDMA_PS_TCP);
		src = v4(sip, 0);
		dst = v4(i ? ip0 : ip1, 7471);
		rc = rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000);
		int ev = rc ? -1 : next_event(ch);
		struct sockaddr_in *l = (struct sockaddr_in *)rdma_get_local_addr(id);
		inet_ntop(AF_INET, &l->sin_addr, got, sizeof(got));
		CHECK(rc == 0 && ev == RDMA_CM_EVENT_ADDR_RESOLVED && !strcmp(got, sip) &&
			      id->verbs && !strcmp(ibv_get_device_name(id->verbs->device), dev),
		      "resolve_addr from %s:0 (not bound): %s, bound to %s, on %s", sip,
		      rc ? strerror(errno) : rdma_event_str(ev), got,
		      id->verbs ? ibv_get_device_name(id->verbs->device) : "no device");
		rdma_destroy_id(id);
	}

	/* A source of family 0 (what a dangling sockaddr often reads as). */
	rdma_create_id(ch, &id, NULL, RDMA_PS_TCP);
	memset(&src, 0, sizeof(src));
	rc = rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000);
	CHECK(rc == -1 && errno == EINVAL, "resolve_addr from family 0: -1/EINVAL (got %d, %s)",
	      rc, strerror(errno));
	rdma_destroy_id(id);

	/* A source of the other family: EINVAL at once, the id left bound. */
	struct sockaddr_in6 s6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	rdma_create_id(ch, &id, NULL, RDMA_PS_TCP);
	rc = rdma_resolve_addr(id, (struct sockaddr *)&s6, (struct sockaddr *)&dst, 2000);
	int e = errno;
	CHECK(rc == -1 && e == EINVAL, "resolve_addr from [::1] to IPv4: -1/EINVAL (got %d, %s)",
	      rc, strerror(e));
	/* ...and the id stays bound to [::1]: without a source, the same */
	rc = rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000);
	CHECK(rc == -1 && errno == EINVAL, "again without a source, the id bound to [::1]: -1/EINVAL");
	rdma_destroy_id(id);

	/* A source no device has. */
	rdma_create_id(ch, &id, NULL, RDMA_PS_TCP);
	src = v4("192.0.2.77", 0);
	rc = rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000);
	CHECK(rc == -1 && errno == EADDRNOTAVAIL,
	      "resolve_addr from 192.0.2.77 (no device): -1/EADDRNOTAVAIL (got %d, %s)", rc,
	      strerror(errno));
	rdma_destroy_id(id);

	rdma_destroy_event_channel(ch);
	printf("cm_src.c: %d checks passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
