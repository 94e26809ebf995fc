/* Blocking event calls and signals, as with a kernel device.
 *
 * libibverbs' ibv_get_cq_event and ibv_get_async_event are a read(2) of
 * the channel's fd and of async_fd; librdmacm's rdma_get_cm_event is a
 * write(2) to the channel's fd that waits in the kernel. The kernel waits
 * interruptibly: a signal handler installed without SA_RESTART makes the
 * call return -1 with errno EINTR, one with SA_RESTART has the kernel
 * restart the wait, which then returns the event. A descriptor the program
 * made non-blocking answers -1 with EAGAIN when no event waits. qperf's
 * 10 ms SIGALRM (no SA_RESTART) relies on the EINTR.
 *
 * For each call: a helper thread sends SIGALRM to the waiting thread
 * (pthread_kill) 100 ms into the wait and raises the event 300 ms later:
 *   * without SA_RESTART the call returns -1/EINTR and the event, raised
 *     later, is the next call's;
 *   * with SA_RESTART the handler runs and the call returns the event.
 * Events: a CQ event from a flushed receive (a QP with a posted receive
 * moved to ERR), LAST_WQE_REACHED from a QP on an SRQ moved to ERR, and
 * ADDR_RESOLVED from rdma_resolve_addr.
 *
 * Uses the first device of UROCE_DEVICES. Prints each check, then
 * "eintr: N checks, N failed"; exits 1 on a failure. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq, *plain_cq;
static struct ibv_comp_channel *comp;
static struct ibv_srq *srq;
static struct ibv_mr *mr;
static char buf[64];
static struct rdma_event_channel *cm;
static struct sockaddr_in dev_addr;
static volatile sig_atomic_t handled;

static void on_alarm(int sig) {
	(void)sig;
	handled++;
}

static void handle_alarm(int flags) {
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	MUST(sigaction(SIGALRM, &sa, NULL) == 0);
}

static struct ibv_qp *new_qp(struct ibv_srq *s) {
	struct ibv_qp_init_attr a = {
		.send_cq = plain_cq, .recv_cq = s ? plain_cq : cq, .srq = s,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	MUST(qp);
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	MUST(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				   IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	return qp;
}

static void to_err(struct ibv_qp *qp) {
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_ERR };
	MUST(ibv_modify_qp(qp, &m, IBV_QP_STATE) == 0);
}

/* A flushed receive: one completion on `cq`, hence one CQ event. */
static void raise_cq_event(void) {
	struct ibv_qp *qp = new_qp(NULL);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof buf,
			       .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 },
			   *bad;
	MUST(ibv_post_recv(qp, &wr, &bad) == 0);
	to_err(qp);
}

/* A QP on an SRQ entering ERR: LAST_WQE_REACHED. */
static void raise_async_event(void) {
	to_err(new_qp(srq));
}

/* rdma_resolve_addr of the device's own address: ADDR_RESOLVED. */
static void raise_cm_event(void) {
	struct rdma_cm_id *id;
	MUST(rdma_create_id(cm, &id, NULL, RDMA_PS_TCP) == 0);
	MUST(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dev_addr, 2000) ==
	     0);
}

struct helper {
	pthread_t waiter;
	void (*raise)(void);
};

static void *helper(void *p) {
	struct helper *h = p;
	usleep(100 * 1000);
	pthread_kill(h->waiter, SIGALRM);
	usleep(300 * 1000);
	h->raise();
	return NULL;
}

enum which { CQ_EVENT, ASYNC_EVENT, CM_EVENT };
static const char *names[] = { "ibv_get_cq_event", "ibv_get_async_event",
			       "rdma_get_cm_event" };
static void (*raisers[])(void) = { raise_cq_event, raise_async_event,
				    raise_cm_event };

/* One blocking get; 0 with the event checked, or -1 with errno. */
static int get(enum which w) {
	switch (w) {
	case CQ_EVENT: {
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		if (ibv_get_cq_event(comp, &ev_cq, &ev_ctx))
			return -1;
		CHECK(ev_cq == cq, "the CQ event names the CQ");
		ibv_ack_cq_events(ev_cq, 1);
		MUST(ibv_req_notify_cq(cq, 0) == 0);
		struct ibv_wc wc;
		while (ibv_poll_cq(cq, 1, &wc) > 0)
			;
		return 0;
	}
	case ASYNC_EVENT: {
		struct ibv_async_event ev;
		if (ibv_get_async_event(ctx, &ev))
			return -1;
		CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED,
		      "the async event is LAST_WQE_REACHED (got %d)",
		      ev.event_type);
		ibv_ack_async_event(&ev);
		return 0;
	}
	case CM_EVENT: {
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(cm, &ev))
			return -1;
		CHECK(ev->event == RDMA_CM_EVENT_ADDR_RESOLVED,
		      "the CM event is ADDR_RESOLVED (got %s)",
		      rdma_event_str(ev->event));
		rdma_ack_cm_event(ev);
		return 0;
	}
	}
	return -1;
}

static int fd_of(enum which w) {
	return w == CQ_EVENT ? comp->fd : w == ASYNC_EVENT ? ctx->async_fd
							   : cm->fd;
}

static void run(enum which w) {
	const char *n = names[w];
	struct helper h = { .waiter = pthread_self(), .raise = raisers[w] };
	pthread_t t;

	/* Non-blocking descriptor, nothing queued: EAGAIN. */
	int fl = fcntl(fd_of(w), F_GETFL);
	fcntl(fd_of(w), F_SETFL, fl | O_NONBLOCK);
	errno = 0;
	int r = get(w);
	CHECK(r == -1 && errno == EAGAIN,
	      "%s on a non-blocking fd with no event: -1/EAGAIN (got %d/%s)",
	      n, r, strerror(errno));
	fcntl(fd_of(w), F_SETFL, fl);

	/* Without SA_RESTART: EINTR; the later event is the next call's. */
	handle_alarm(0);
	handled = 0;
	MUST(pthread_create(&t, NULL, helper, &h) == 0);
	errno = 0;
	r = get(w);
	int e = errno;
	CHECK(r == -1 && e == EINTR && handled == 1,
	      "%s interrupted by a handler without SA_RESTART: -1/EINTR "
	      "(got %d/%s, handler ran %d times)",
	      n, r, strerror(e), (int)handled);
	pthread_join(t, NULL);
	if (r == -1) {
		r = get(w);
		CHECK(r == 0, "%s then returns the event raised after the "
			      "signal (got %d/%s)",
		      n, r, strerror(errno));
	}

	/* With SA_RESTART: the handler runs, the wait goes on. */
	handle_alarm(SA_RESTART);
	handled = 0;
	MUST(pthread_create(&t, NULL, helper, &h) == 0);
	errno = 0;
	r = get(w);
	e = errno;
	CHECK(r == 0 && handled == 1,
	      "%s with an SA_RESTART handler keeps waiting and returns the "
	      "event (got %d/%s, handler ran %d times)",
	      n, r, strerror(e), (int)handled);
	pthread_join(t, NULL);
}

/* The address of the first device in UROCE_DEVICES (name=addr,...). */
static void first_device_addr(void) {
	const char *v = getenv("UROCE_DEVICES");
	const char *eq = v ? strchr(v, '=') : NULL;
	char a[64];
	MUST(eq);
	size_t n = strcspn(eq + 1, ",");
	MUST(n < sizeof a);
	memcpy(a, eq + 1, n);
	a[n] = 0;
	dev_addr.sin_family = AF_INET;
	MUST(inet_pton(AF_INET, a, &dev_addr.sin_addr) == 1);
}

int main(void) {
	setvbuf(stdout, NULL, _IONBF, 0);
	first_device_addr();
	struct ibv_device **l = ibv_get_device_list(NULL);
	MUST(l && l[0]);
	MUST(ctx = ibv_open_device(l[0]));
	MUST(pd = ibv_alloc_pd(ctx));
	MUST(mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE));
	MUST(comp = ibv_create_comp_channel(ctx));
	MUST(cq = ibv_create_cq(ctx, 16, NULL, comp, 0));
	MUST(plain_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0));
	MUST(ibv_req_notify_cq(cq, 0) == 0);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	MUST(srq = ibv_create_srq(pd, &sa));
	MUST(cm = rdma_create_event_channel());

	run(CQ_EVENT);
	run(ASYNC_EVENT);
	run(CM_EVENT);

	printf("eintr: %d checks, %d failed\n", passed + failed, failed);
	return failed ? 1 : 0;
}
