/* Contexts and their asynchronous events, as a kernel device has them
 * (issue 24, items 4 and 11, and opening a taken address).
 *
 *   * Opening a device queues no event: a kernel device raises
 *     PORT_ACTIVE only when the port changes state, so a program's first
 *     ibv_get_async_event is the event it waits for.
 *   * Two contexts of one device (as two UCX contexts open it) have
 *     descriptors of their own (UCX keys its async handlers by async_fd),
 *     and an event about a QP goes to the context that created the QP.
 *   * A device whose address another socket holds fails to open with
 *     EADDRINUSE.
 *
 * Uses the first device of UROCE_DEVICES (any address). Prints each check,
 * then "contexts: N checks, N failed"; exits 1 on a failure. */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static void nonblocking(int fd) {
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static int readable(int fd, int ms) {
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* The address of the first device in UROCE_DEVICES (name=addr,...). */
static int first_device_addr(struct in_addr *out) {
	const char *v = getenv("UROCE_DEVICES");
	const char *eq = v ? strchr(v, '=') : NULL;
	char buf[64];
	if (!eq)
		return -1;
	size_t n = strcspn(eq + 1, ",");
	if (n >= sizeof buf)
		return -1;
	memcpy(buf, eq + 1, n);
	buf[n] = 0;
	return inet_pton(AF_INET, buf, out) == 1 ? 0 : -1;
}

int main(void) {
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST(list && n > 0);

	/* ---- a taken address: EADDRINUSE (while a socket holds it) */
	struct in_addr addr;
	if (first_device_addr(&addr) == 0) {
		int s = socket(AF_INET, SOCK_DGRAM, 0);
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_port = htons(4791),
					  .sin_addr = addr };
		MUST(s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof sa) == 0);
		errno = 0;
		struct ibv_context *c = ibv_open_device(list[0]);
		CHECK(!c && errno == EADDRINUSE,
		      "open with the address taken: %s, errno %d (%s)",
		      c ? "opened" : "NULL", errno, strerror(errno));
		if (c)
			ibv_close_device(c);
		close(s);
	}

	struct ibv_context *a = ibv_open_device(list[0]);
	struct ibv_context *b = ibv_open_device(list[0]);
	MUST(a && b);
	CHECK(a->async_fd >= 0 && b->async_fd >= 0 && a->async_fd != b->async_fd,
	      "two contexts, two async_fds (%d, %d)", a->async_fd, b->async_fd);

	/* ---- no event at open */
	struct ibv_async_event ev;
	nonblocking(a->async_fd);
	nonblocking(b->async_fd);
	CHECK(!readable(a->async_fd, 100) && !readable(b->async_fd, 0),
	      "no event waits after open (async_fd not readable)");
	errno = 0;
	int rc = ibv_get_async_event(a, &ev);
	CHECK(rc == -1 && errno == EAGAIN,
	      "first ibv_get_async_event: -1, EAGAIN (got %d, %s)", rc,
	      rc == 0 ? ibv_event_type_str(ev.event_type) : strerror(errno));
	if (rc == 0)
		ibv_ack_async_event(&ev);

	/* ---- an event about b's QP reaches b only: a QP on an SRQ that
	 * enters ERR reports LAST_WQE_REACHED */
	struct ibv_pd *pd = ibv_alloc_pd(b);
	struct ibv_cq *cq = ibv_create_cq(b, 4, NULL, NULL, 0);
	MUST(pd && cq);
	struct ibv_srq_init_attr sia = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sia);
	MUST(srq);
	struct ibv_qp_init_attr qia = { .send_cq = cq, .recv_cq = cq, .srq = srq,
					.cap = { .max_send_wr = 4, .max_send_sge = 1 },
					.qp_type = IBV_QPT_RC };
	struct ibv_qp *qp = ibv_create_qp(pd, &qia);
	MUST(qp);
	MUST(ibv_modify_qp(qp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_ERR },
			   IBV_QP_STATE) == 0);
	CHECK(readable(b->async_fd, 5000), "the QP's context: async_fd readable");
	rc = ibv_get_async_event(b, &ev);
	CHECK(rc == 0 && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
		      ev.element.qp == qp,
	      "the QP's context gets %s on its QP",
	      rc == 0 ? ibv_event_type_str(ev.event_type) : strerror(errno));
	if (rc == 0)
		ibv_ack_async_event(&ev);
	CHECK(!readable(a->async_fd, 200), "the other context hears nothing");

	/* Completion channels are each their own too. */
	struct ibv_comp_channel *c1 = ibv_create_comp_channel(a);
	struct ibv_comp_channel *c2 = ibv_create_comp_channel(b);
	MUST(c1 && c2);
	CHECK(c1->fd != c2->fd, "completion channels: fds %d, %d", c1->fd, c2->fd);
	ibv_destroy_comp_channel(c1);
	ibv_destroy_comp_channel(c2);

	MUST(ibv_destroy_qp(qp) == 0);
	MUST(ibv_destroy_srq(srq) == 0);
	MUST(ibv_destroy_cq(cq) == 0);
	MUST(ibv_dealloc_pd(pd) == 0);
	/* Closing one context leaves the other working. */
	MUST(ibv_close_device(a) == 0);
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(b, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE,
	      "the other context after a close: port active");
	MUST(ibv_close_device(b) == 0);
	ibv_free_device_list(list);
	printf("contexts: %d checks, %d failed\n", passed + failed, failed);
	return failed != 0;
}
