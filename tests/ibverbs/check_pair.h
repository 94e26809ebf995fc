/* What the checker's C programs (tests/ibverbs/check_*.c) share: two
 * devices of one process (UROCE_DEVICES names them), a side each (PD, CQ,
 * QP, a registered buffer), an RC connection between them, and a wait for
 * one completion. Each program makes one mistake UROCE_CHECK reports; the
 * matrix runs it with UROCE_CHECK=1 and looks for the report on stderr. */
#ifndef UROCE_TESTS_CHECK_PAIR_H
#define UROCE_TESTS_CHECK_PAIR_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

enum { BUF = 8192 };
enum { ALL = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
	     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
	int events; /* set before open_side: the CQ gets a channel, ch */
	struct ibv_comp_channel *ch;
};

static struct ibv_device **devs;

/* A side on device `dev`: a CQ of `cqe` entries and a QP of type `t` with
 * `wrs` WRs each way. */
static inline void open_side(struct side *s, int dev, int cqe, int wrs,
		      enum ibv_qp_type t)
{
	if (!devs)
		MUST(devs = ibv_get_device_list(NULL));
	MUST(devs[0] && devs[1]);
	MUST(s->ctx = ibv_open_device(devs[dev]));
	MUST(s->pd = ibv_alloc_pd(s->ctx));
	if (s->events)
		MUST(s->ch = ibv_create_comp_channel(s->ctx));
	MUST(s->cq = ibv_create_cq(s->ctx, cqe, NULL, s->ch, 0));
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = t,
		.cap = { .max_send_wr = wrs, .max_recv_wr = wrs,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 },
	};
	MUST(s->qp = ibv_create_qp(s->pd, &ia));
	MUST(posix_memalign((void **)&s->buf, 4096, BUF) == 0);
	memset(s->buf, 0, BUF);
	MUST(s->mr = ibv_reg_mr(s->pd, s->buf, BUF, ALL));
	MUST(ibv_query_gid(s->ctx, 1, 1, &s->gid) == 0);
}

/* RC QP `s` to RTS, connected to `p`; a SEND that finds no receive WR
 * is retried without end (rnr_retry 7) until one is posted. */
static inline void rc_up(struct side *s, struct side *p)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = ALL };
	MUST(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				 IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	struct ibv_qp_attr r = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = p->qp->qp_num, .rq_psn = 0,
		.max_dest_rd_atomic = 4, .min_rnr_timer = 1,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = p->gid, .sgid_index = 1,
				      .hop_limit = 64 } },
	};
	MUST(ibv_modify_qp(s->qp, &r, IBV_QP_STATE | IBV_QP_AV |
				 IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				 IBV_QP_MIN_RNR_TIMER) == 0);
	struct ibv_qp_attr t = { .qp_state = IBV_QPS_RTS, .timeout = 14,
				 .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 0,
				 .max_rd_atomic = 4 };
	MUST(ibv_modify_qp(s->qp, &t, IBV_QP_STATE | IBV_QP_TIMEOUT |
				 IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

/* Two connected RC sides (a on the first device, b on the second). */
static inline void rc_pair(struct side *a, struct side *b, int cqe, int wrs)
{
	open_side(a, 0, cqe, wrs, IBV_QPT_RC);
	open_side(b, 1, cqe, wrs, IBV_QPT_RC);
	rc_up(a, b);
	rc_up(b, a);
}

static inline void close_side(struct side *s)
{
	if (s->qp)
		ibv_destroy_qp(s->qp);
	if (s->mr)
		ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->cq);
	if (s->ch)
		ibv_destroy_comp_channel(s->ch);
	ibv_dealloc_pd(s->pd);
	ibv_close_device(s->ctx);
	free(s->buf);
}

/* One completion within 5 s, or status -1. */
static inline struct ibv_wc wait1(struct ibv_cq *cq)
{
	struct ibv_wc wc = { .status = -1 };
	for (int i = 0; i < 500000; i++) {
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
		usleep(10);
	}
	wc.status = -1;
	return wc;
}

/* Posts a send WR of `len` bytes at `off` of s's buffer. */
static inline int post(struct side *s, enum ibv_wr_opcode op, uint64_t wr_id,
		size_t off, uint32_t len, int flags, uint64_t raddr,
		uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off,
			       .length = len, .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge,
				  .num_sge = 1, .opcode = op,
				  .send_flags = flags }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(s->qp, &wr, &bad);
}

/* Posts a receive WR of `len` bytes at `off` of s's buffer. */
static inline int post_recv(struct side *s, uint64_t wr_id, size_t off, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off,
			       .length = len, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge,
				  .num_sge = 1 }, *bad;
	return ibv_post_recv(s->qp, &wr, &bad);
}

/* The clean case of the buffer checks, then the end of the program: a
 * SEND (wr_id 8) whose source changes only after its completion, received
 * at `recv_off` of b's buffer; both sides closed; the exit status. */
static inline int clean_send_and_finish(struct side *a, struct side *b, size_t recv_off)
{
	MUST(post_recv(b, 2, recv_off, 1024) == 0);
	MUST(post(a, IBV_WR_SEND, 8, 0, 1024, IBV_SEND_SIGNALED, 0, 0) == 0);
	struct ibv_wc wc = wait1(a->cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 8,
	      "the second SEND completes");
	a->buf[100] = 'z';
	wc = wait1(b->cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "its receive completes");
	close_side(a);
	close_side(b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}

#endif
