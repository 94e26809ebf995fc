/*
 * Objects, lists and limits as a kernel device checks them, through the C
 * API on uroce's libibverbs.so.1 (issue #24, items 1, 2, 3 and 6):
 *
 *  - a stale object (destroyed already) or a garbled one (its `handle` or
 *    `context` overwritten) passed to a destroy, modify, query or create
 *    call is refused with an error, never used (the kernel looks every
 *    object up by handle in its context's table); so is an object of
 *    another context;
 *  - a work request list that loops back on itself (ibv_post_send,
 *    ibv_post_recv, ibv_post_srq_recv) or an ibv_wr_* batch longer than
 *    the send queue stops at the queue's capacity with ENOMEM and *bad_wr
 *    set: the address space is capped (RLIMIT_AS), so a regression fails
 *    here instead of exhausting the machine;
 *  - each object limit ibv_query_device advertises (max_pd, max_cq,
 *    max_srq, max_qp, max_ah, max_mr, max_mw) holds: one more is ENOMEM;
 *  - a QP may take its receives from an SRQ of another PD, and those
 *    receive WRs' L_Keys are checked against the SRQ's PD.
 *
 * Two devices in one process: UROCE_DEVICES names them (the matrix sets
 * 127.101.1.1 and 127.101.1.2). Prints one line per check and
 * "N passed, N failed".
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

enum { BUF = 4096, DEPTH = 16 };

static struct ibv_context *ctx, *ctx2, *other;
static char *buf;
static union ibv_gid gid;

static struct ibv_qp *new_qp(struct ibv_pd *pd, struct ibv_cq *cq,
			     struct ibv_srq *srq, enum ibv_qp_type t)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.srq = srq,
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = t,
	};
	return ibv_create_qp(pd, &a);
}

static struct ibv_srq *new_srq(struct ibv_pd *pd, int max_wr)
{
	struct ibv_srq_init_attr a = { .attr = { .max_wr = max_wr,
						 .max_sge = 1 } };
	return ibv_create_srq(pd, &a);
}

static struct ibv_ah *new_ah(struct ibv_pd *pd)
{
	struct ibv_ah_attr a = { .is_global = 1, .port_num = 1,
				 .grh = { .dgid = gid, .hop_limit = 1 } };
	return ibv_create_ah(pd, &a);
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = 0x11111111 };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	mask |= qp->qp_type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
	return ibv_modify_qp(qp, &a, mask);
}

static int rc_connect(struct ibv_qp *qp, uint32_t dqpn)
{
	struct ibv_qp_attr r = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = dqpn, .max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = gid, .hop_limit = 1 } },
	};
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .timeout = 14,
				 .retry_cnt = 7, .rnr_retry = 7,
				 .max_rd_atomic = 1 };
	if (to_init(qp))
		return -1;
	if (ibv_modify_qp(qp, &r,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER))
		return -1;
	return ibv_modify_qp(qp, &s,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

static int ud_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	if (to_init(qp) || ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return -1;
	a.qp_state = IBV_QPS_RTS;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

/* Waits up to 5 s for one completion. */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	time_t end = time(NULL) + 5;
	while (time(NULL) < end) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
	}
	return 0;
}

/* ---------------------------------------------------------------- item 1 */

/* Each destroy: refused while the object's handle is garbled, done once
 * it is restored, refused the second time. */
#define STALE_DESTROY(name, obj, destroy)                                      \
	do {                                                                   \
		uint32_t h = (obj)->handle;                                    \
		(obj)->handle = h ^ 0x5a5a;                                    \
		int r1 = destroy(obj);                                         \
		(obj)->handle = h;                                             \
		int r2 = destroy(obj);                                         \
		int r3 = destroy(obj);                                         \
		CHECK(r1 != 0 && r2 == 0 && r3 != 0,                           \
		      "%s: garbled handle refused (%d), destroyed (%d), "      \
		      "destroyed again refused (%d)",                          \
		      name, r1, r2, r3);                                       \
	} while (0)

static void stale_handles(void)
{
	struct ibv_pd *pd, *pd2;
	struct ibv_cq *cq, *cq2;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	uint32_t h;

	MUST(pd = ibv_alloc_pd(ctx));
	STALE_DESTROY("ibv_dealloc_pd", pd, ibv_dealloc_pd);

	MUST(cq = ibv_create_cq(ctx, 8, NULL, NULL, 0));
	STALE_DESTROY("ibv_destroy_cq", cq, ibv_destroy_cq);
	{
		struct ibv_cq_init_attr_ex a = { .cqe = 8,
						 .wc_flags = IBV_WC_STANDARD_FLAGS };
		struct ibv_cq_ex *x;
		MUST(x = ibv_create_cq_ex(ctx, &a));
		cq = ibv_cq_ex_to_cq(x);
		STALE_DESTROY("ibv_destroy_cq (extended CQ)", cq,
			      ibv_destroy_cq);
	}

	MUST(pd = ibv_alloc_pd(ctx));
	MUST(cq = ibv_create_cq(ctx, 8, NULL, NULL, 0));
	{
		struct ibv_mr *mr;
		MUST(mr = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE));
		STALE_DESTROY("ibv_dereg_mr", mr, ibv_dereg_mr);
	}
	{
		struct ibv_mw *mw;
		MUST(mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2));
		STALE_DESTROY("ibv_dealloc_mw", mw, ibv_dealloc_mw);
	}
	MUST(srq = new_srq(pd, 8));
	STALE_DESTROY("ibv_destroy_srq", srq, ibv_destroy_srq);
	{
		struct ibv_ah *ah;
		MUST(ah = new_ah(pd));
		STALE_DESTROY("ibv_destroy_ah", ah, ibv_destroy_ah);
	}

	/* modify and query of a garbled QP, then its destroys. */
	MUST(qp = new_qp(pd, cq, NULL, IBV_QPT_RC));
	h = qp->handle;
	qp->handle = h ^ 0x5a5a;
	memset(&qa, 0, sizeof(qa));
	qa.qp_state = IBV_QPS_INIT;
	qa.port_num = 1;
	int rm = ibv_modify_qp(qp, &qa,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS);
	int rq = ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi);
	qp->handle = h;
	CHECK(rm != 0 && rq != 0 && qp->state == IBV_QPS_RESET,
	      "ibv_modify_qp/ibv_query_qp: garbled QP refused (%d, %d)", rm,
	      rq);
	CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) == 0,
	      "ibv_query_qp: the restored QP answers");
	STALE_DESTROY("ibv_destroy_qp", qp, ibv_destroy_qp);
	MUST(qp = new_qp(pd, cq, NULL, IBV_QPT_RC));
	MUST(ibv_destroy_qp(qp) == 0);
	errno = 0;
	CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) != 0,
	      "ibv_query_qp: a destroyed QP refused");

	/* Constructors given a garbled PD, CQ or SRQ: NULL + errno. */
	MUST(srq = new_srq(pd, 8));
	h = pd->handle;
	pd->handle = h ^ 0x5a5a;
	errno = 0;
	void *o1 = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	int e1 = errno;
	void *o2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	void *o3 = new_srq(pd, 8);
	void *o4 = new_qp(pd, cq, NULL, IBV_QPT_RC);
	void *o5 = new_ah(pd);
	pd->handle = h;
	CHECK(!o1 && e1 && !o2 && !o3 && !o4 && !o5,
	      "ibv_reg_mr/alloc_mw/create_srq/create_qp/create_ah with a "
	      "garbled PD: NULL (errno %d)",
	      e1);
	h = cq->handle;
	cq->handle = h ^ 0x5a5a;
	o1 = new_qp(pd, cq, NULL, IBV_QPT_RC);
	cq->handle = h;
	h = srq->handle;
	srq->handle = h ^ 0x5a5a;
	o2 = new_qp(pd, cq, srq, IBV_QPT_RC);
	srq->handle = h;
	CHECK(!o1 && !o2, "ibv_create_qp with a garbled CQ or SRQ: NULL");
	MUST(qp = new_qp(pd, cq, srq, IBV_QPT_RC));
	CHECK(ibv_destroy_qp(qp) == 0,
	      "ibv_create_qp with the restored PD, CQ and SRQ");

	/* Another context's objects (a second context of the same device,
	 * and a context of another device). */
	MUST(pd2 = ibv_alloc_pd(ctx2));
	MUST(cq2 = ibv_create_cq(other, 8, NULL, NULL, 0));
	o1 = new_qp(pd, cq2, NULL, IBV_QPT_RC);
	o2 = new_qp(pd2, cq, NULL, IBV_QPT_RC);
	struct ibv_cq *cq3;
	MUST(cq3 = ibv_create_cq(ctx2, 8, NULL, NULL, 0));
	o3 = new_qp(pd2, cq3, srq, IBV_QPT_RC);
	CHECK(!o1 && !o2 && !o3,
	      "ibv_create_qp with a CQ or SRQ of another context: NULL");
	MUST(ibv_destroy_cq(cq3) == 0);
	MUST(ibv_destroy_cq(cq2) == 0);
	pd2->context = ctx;
	int rc = ibv_dealloc_pd(pd2);
	pd2->context = ctx2;
	CHECK(rc != 0 && ibv_dealloc_pd(pd2) == 0,
	      "ibv_dealloc_pd: a PD whose context was overwritten refused");

	/* A destroyed PD given to constructors (its memory is held back). */
	MUST(ibv_destroy_srq(srq) == 0);
	MUST(pd2 = ibv_alloc_pd(ctx));
	MUST(ibv_dealloc_pd(pd2) == 0);
	o1 = ibv_reg_mr(pd2, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	o2 = new_srq(pd2, 8);
	o3 = new_qp(pd2, cq, NULL, IBV_QPT_RC);
	CHECK(!o1 && !o2 && !o3,
	      "ibv_reg_mr/create_srq/create_qp with a deallocated PD: NULL");
	/* A new PD made after a destroy is not reached through the old
	 * pointer. */
	MUST(pd2 = ibv_alloc_pd(ctx));
	struct ibv_pd *pd3;
	MUST(ibv_dealloc_pd(pd2) == 0);
	MUST(pd3 = ibv_alloc_pd(ctx));
	CHECK(ibv_dealloc_pd(pd2) != 0 && ibv_dealloc_pd(pd3) == 0,
	      "ibv_dealloc_pd twice with a new PD made in between: the new "
	      "one stays");
	MUST(ibv_destroy_cq(cq) == 0);
	MUST(ibv_dealloc_pd(pd) == 0);
}

/* ---------------------------------------------------------------- item 2 */

static void looping_lists(void)
{
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	struct ibv_sge sge;
	struct ibv_recv_wr rw[2], *rbad;
	struct ibv_send_wr sw[2], *sbad;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = DEPTH,
						  .max_sge = 1 } };
	int r, cap;

	MUST(pd = ibv_alloc_pd(ctx));
	MUST(cq = ibv_create_cq(ctx, 256, NULL, NULL, 0));
	MUST(mr = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE));
	sge = (struct ibv_sge){ (uintptr_t)buf, 64, mr->lkey };
	memset(rw, 0, sizeof(rw));
	rw[0] = (struct ibv_recv_wr){ 1, &rw[1], &sge, 1 };
	rw[1] = (struct ibv_recv_wr){ 2, &rw[0], &sge, 1 };

	MUST(srq = ibv_create_srq(pd, &sa));
	cap = sa.attr.max_wr;
	rbad = NULL;
	r = ibv_post_srq_recv(srq, rw, &rbad);
	CHECK(r == ENOMEM && rbad == &rw[cap % 2],
	      "ibv_post_srq_recv with a looping list: ENOMEM (%d) after %d "
	      "WRs, bad_wr the next",
	      r, cap);

	MUST(qp = new_qp(pd, cq, NULL, IBV_QPT_UD));
	MUST(ud_rts(qp) == 0);
	{
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr i;
		MUST(ibv_query_qp(qp, &a, IBV_QP_CAP, &i) == 0);
		cap = i.cap.max_recv_wr;
	}
	rbad = NULL;
	r = ibv_post_recv(qp, rw, &rbad);
	CHECK(r == ENOMEM && rbad == &rw[cap % 2],
	      "ibv_post_recv with a looping list: ENOMEM (%d) after %d WRs, "
	      "bad_wr the next",
	      r, cap);

	struct ibv_ah *ah;
	MUST(ah = new_ah(pd));
	memset(sw, 0, sizeof(sw));
	for (int i = 0; i < 2; i++) {
		sw[i].wr_id = i;
		sw[i].next = &sw[1 - i];
		sw[i].sg_list = &sge;
		sw[i].num_sge = 1;
		sw[i].opcode = IBV_WR_SEND;
		sw[i].wr.ud.ah = ah;
		sw[i].wr.ud.remote_qpn = qp->qp_num;
		sw[i].wr.ud.remote_qkey = 0x11111111;
	}
	sbad = NULL;
	r = ibv_post_send(qp, sw, &sbad);
	CHECK(r == ENOMEM && (sbad == &sw[0] || sbad == &sw[1]),
	      "ibv_post_send with a looping list: ENOMEM (%d), bad_wr in the "
	      "list",
	      r);
	ibv_destroy_qp(qp);

	/* The ibv_wr_* batch: more WRs than the send queue holds. */
	struct ibv_qp_init_attr_ex x = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND,
	};
	MUST(qp = ibv_create_qp_ex(ctx, &x));
	MUST(ud_rts(qp) == 0);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(qp);
	ibv_wr_start(qx);
	for (int i = 0; i < 100000; i++) {
		qx->wr_id = i;
		ibv_wr_send(qx);
		ibv_wr_set_ud_addr(qx, ah, qp->qp_num, 0x11111111);
		ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 64);
	}
	r = ibv_wr_complete(qx);
	CHECK(r == ENOMEM, "ibv_wr_complete of 100000 WRs on a queue of %d: "
	      "ENOMEM (%d)", x.cap.max_send_wr, r);
	ibv_wr_start(qx);
	qx->wr_id = 1;
	ibv_wr_send(qx);
	ibv_wr_set_ud_addr(qx, ah, qp->qp_num, 0x11111111);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 64);
	CHECK(ibv_wr_complete(qx) == 0, "the next batch of one posts");
	ibv_destroy_qp(qp);
	ibv_destroy_ah(ah);
	ibv_destroy_srq(srq);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

/* ---------------------------------------------------------------- item 3 */

/* Makes objects with `make` until it fails or `max` exist; one more must
 * be ENOMEM. `drop` frees them all. */
#define LIMIT(name, max, T, make, drop)                                        \
	do {                                                                   \
		T **v = calloc((max) + 1, sizeof(T *));                        \
		int n = 0, e;                                                  \
		struct timespec t0, t1;                                        \
		MUST(v);                                                       \
		clock_gettime(CLOCK_MONOTONIC, &t0);                           \
		while (n < (max) && (v[n] = (make)))                           \
			n++;                                                   \
		errno = 0;                                                     \
		T *extra = n == (max) ? (make) : NULL;                         \
		e = errno;                                                     \
		clock_gettime(CLOCK_MONOTONIC, &t1);                           \
		CHECK(n == (max) && !extra && e == ENOMEM,                     \
		      "%s %d: made %d (%.2f s), one more %s (errno %d)", name, \
		      (max), n,                                                \
		      (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9, \
		      extra ? "made" : "refused", e);                          \
		if (extra)                                                     \
			v[n++] = extra;                                        \
		while (n > 0)                                                  \
			drop(v[--n]);                                          \
		free(v);                                                       \
	} while (0)

static void limits(void)
{
	struct ibv_device_attr a;
	struct ibv_pd *pd;
	struct ibv_cq *cq;

	MUST(ibv_query_device(ctx, &a) == 0);
	MUST(pd = ibv_alloc_pd(ctx));
	MUST(cq = ibv_create_cq(ctx, 8, NULL, NULL, 0));
	/* the PD and CQ above count too */
	LIMIT("max_pd", a.max_pd - 1, struct ibv_pd, ibv_alloc_pd(ctx2),
	      ibv_dealloc_pd);
	LIMIT("max_cq", a.max_cq - 1, struct ibv_cq,
	      ibv_create_cq(ctx2, 1, NULL, NULL, 0), ibv_destroy_cq);
	LIMIT("max_srq", a.max_srq, struct ibv_srq, new_srq(pd, 1),
	      ibv_destroy_srq);
	LIMIT("max_ah", a.max_ah, struct ibv_ah, new_ah(pd), ibv_destroy_ah);
	{
		struct ibv_qp_init_attr qa = {
			.send_cq = cq, .recv_cq = cq,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_UD,
		};
		LIMIT("max_qp", a.max_qp, struct ibv_qp,
		      ibv_create_qp(pd, &qa), ibv_destroy_qp);
	}
	LIMIT("max_mr", a.max_mr, struct ibv_mr,
	      ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE), ibv_dereg_mr);
	LIMIT("max_mw", a.max_mw, struct ibv_mw,
	      ibv_alloc_mw(pd, IBV_MW_TYPE_2), ibv_dealloc_mw);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

/* ---------------------------------------------------------------- item 6 */

/* An RC QP of PD A receiving through an SRQ of PD B: the receive buffer's
 * L_Key is checked against B. */
static void srq_of_another_pd(void)
{
	struct ibv_pd *pa, *pb;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_qp *rq, *sq;
	struct ibv_mr *send_mr, *recv_b, *recv_a;
	struct ibv_wc wc;
	char *rbuf = buf + 1024;

	MUST(pa = ibv_alloc_pd(ctx));
	MUST(pb = ibv_alloc_pd(ctx));
	MUST(cq = ibv_create_cq(ctx, 64, NULL, NULL, 0));
	MUST(srq = new_srq(pb, 8));
	rq = new_qp(pa, cq, srq, IBV_QPT_RC);
	CHECK(rq != NULL, "ibv_create_qp with an SRQ of another PD (errno %d)",
	      errno);
	if (!rq)
		return;
	MUST(sq = new_qp(pa, cq, NULL, IBV_QPT_RC));
	MUST(rc_connect(rq, sq->qp_num) == 0 && rc_connect(sq, rq->qp_num) == 0);
	MUST(send_mr = ibv_reg_mr(pa, buf, 1024, IBV_ACCESS_LOCAL_WRITE));
	MUST(recv_b = ibv_reg_mr(pb, rbuf, 1024, IBV_ACCESS_LOCAL_WRITE));
	MUST(recv_a = ibv_reg_mr(pa, rbuf + 1024, 1024,
				 IBV_ACCESS_LOCAL_WRITE));
	memcpy(buf, "through an SRQ of PD B", 23);
	memset(rbuf, 0, 64);

	struct ibv_sge rs = { (uintptr_t)rbuf, 64, recv_b->lkey };
	struct ibv_recv_wr r = { .wr_id = 7, .sg_list = &rs, .num_sge = 1 },
			   *rbad;
	struct ibv_sge ss = { (uintptr_t)buf, 23, send_mr->lkey };
	struct ibv_send_wr s = { .wr_id = 8, .sg_list = &ss, .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED },
			   *sbad;
	MUST(ibv_post_srq_recv(srq, &r, &rbad) == 0);
	MUST(ibv_post_send(sq, &s, &sbad) == 0);
	int got_recv = 0, got_send = 0;
	for (int i = 0; i < 2 && wait_wc(cq, &wc); i++) {
		if (wc.wr_id == 7)
			got_recv = wc.status == IBV_WC_SUCCESS;
		if (wc.wr_id == 8)
			got_send = wc.status == IBV_WC_SUCCESS;
	}
	CHECK(got_recv && got_send && !memcmp(rbuf, buf, 23),
	      "a SEND lands in a receive WR whose L_Key is of the SRQ's PD");

	/* A receive WR with an L_Key of the QP's PD (not the SRQ's): a local
	 * protection error on the receive side. */
	rs = (struct ibv_sge){ (uintptr_t)rbuf + 1024, 64, recv_a->lkey };
	r.wr_id = 9;
	MUST(ibv_post_srq_recv(srq, &r, &rbad) == 0);
	s.wr_id = 10;
	MUST(ibv_post_send(sq, &s, &sbad) == 0);
	int recv_status = -1;
	for (int i = 0; i < 2 && wait_wc(cq, &wc); i++)
		if (wc.wr_id == 9)
			recv_status = wc.status;
	CHECK(recv_status == IBV_WC_LOC_PROT_ERR,
	      "an L_Key of the QP's PD on the SRQ: LOC_PROT_ERR (%d)",
	      recv_status);
	ibv_destroy_qp(rq);
	ibv_destroy_qp(sq);
	ibv_destroy_srq(srq);
	ibv_dereg_mr(send_mr);
	ibv_dereg_mr(recv_a);
	ibv_dereg_mr(recv_b);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pa);
	ibv_dealloc_pd(pb);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	int n;
	/* A looping list that allocates fails here, not the machine. */
	struct rlimit as = { 8UL << 30, 8UL << 30 };
	MUST(setrlimit(RLIMIT_AS, &as) == 0);
	MUST(list = ibv_get_device_list(&n));
	MUST(n >= 2);
	MUST(ctx = ibv_open_device(list[0]));
	MUST(ctx2 = ibv_open_device(list[0]));
	MUST(other = ibv_open_device(list[1]));
	MUST(buf = aligned_alloc(4096, BUF));
	memset(buf, 0, BUF);
	MUST(ibv_query_gid(ctx, 1, 1, &gid) == 0);

	const char *only = argc > 1 ? argv[1] : "";
	if (!*only || !strcmp(only, "handles"))
		stale_handles();
	if (!*only || !strcmp(only, "loops"))
		looping_lists();
	if (!*only || !strcmp(only, "srq"))
		srq_of_another_pd();
	if (!*only || !strcmp(only, "limits"))
		limits();

	ibv_close_device(other);
	ibv_close_device(ctx2);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
