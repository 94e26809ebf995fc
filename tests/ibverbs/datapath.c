/*
 * The data path as a C program sees it on uroce's libibverbs (compiled
 * against Debian's <infiniband/verbs.h>, run with
 * LD_LIBRARY_PATH=$(uroce libdir)):
 *   - zero-based memory: an IBV_ACCESS_ZERO_BASED region and a zero-based
 *     type 2 window are addressed from offset 0 (WRITE, READ, atomics);
 *     ibv_reg_mr_iova addresses a region from its iova;
 *   - completion timestamps of an ibv_cq_ex, taken when the completion is
 *     generated, consistent with hca_core_clock and ibv_query_rt_values_ex;
 *   - a UD address handle's traffic class as the IPv4 TOS of the
 *     receiver's GRH area;
 *   - RDMA WRITE WITH IMMEDIATE into a receive WR smaller than the WRITE
 *     (none, 0 bytes, 16 bytes), and one that finds no receive WR yet.
 *
 * Two devices in one process: UROCE_DEVICES names them (the matrix sets
 * 127.103.9.1 and 127.103.9.2). Prints one line per check and
 * "N passed, N failed"; exits non-zero on a failure.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
};

static struct ibv_device **devs;

static void open_side(struct side *s, int dev, struct ibv_cq *cq,
		      enum ibv_qp_type t)
{
	MUST(s->ctx = ibv_open_device(devs[dev]));
	MUST(s->pd = ibv_alloc_pd(s->ctx));
	s->cq = cq ? cq : ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	MUST(s->cq);
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = t,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	MUST(s->qp = ibv_create_qp(s->pd, &ia));
	MUST(posix_memalign((void **)&s->buf, 4096, BUF) == 0);
	memset(s->buf, 0, BUF);
	MUST(s->mr = ibv_reg_mr(s->pd, s->buf, BUF, ALL | IBV_ACCESS_MW_BIND));
	MUST(ibv_query_gid(s->ctx, 1, 1, &s->gid) == 0);
}

static void rc_up(struct side *s, struct side *p)
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

static void rc_pair(struct side *a, struct side *b, struct ibv_cq *acq)
{
	open_side(a, 0, acq, IBV_QPT_RC);
	open_side(b, 1, NULL, IBV_QPT_RC);
	rc_up(a, b);
	rc_up(b, a);
}

static void close_side(struct side *s)
{
	ibv_destroy_qp(s->qp);
	ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->cq);
	ibv_dealloc_pd(s->pd);
	ibv_close_device(s->ctx);
	free(s->buf);
}

/* One completion within 5 s, or status -1. */
static struct ibv_wc wait1(struct ibv_cq *cq)
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

/* One signaled RDMA op of `len` bytes at `loff` of a's buffer. */
static struct ibv_wc rdma(struct side *a, enum ibv_wr_opcode op, size_t loff,
			  uint32_t len, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf + loff,
			       .length = len, .lkey = a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 2;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	if (ibv_post_send(a->qp, &wr, &bad)) {
		struct ibv_wc wc = { .status = -1 };
		return wc;
	}
	return wait1(a->cq);
}

static void zero_based(void)
{
	struct side a, b;
	rc_pair(&a, &b, NULL);
	char *zbuf;
	MUST(posix_memalign((void **)&zbuf, 4096, BUF) == 0);
	memset(zbuf, 0, BUF);
	struct ibv_mr *zb = ibv_reg_mr(b.pd, zbuf, BUF, ALL | IBV_ACCESS_ZERO_BASED);
	CHECK(zb && zb->addr == zbuf, "reg_mr ZERO_BASED: a region, addr the buffer (errno %d)",
	      zb ? 0 : errno);
	if (!zb)
		goto out;
	memset(a.buf, 'z', 64);
	struct ibv_wc w = rdma(&a, IBV_WR_RDMA_WRITE, 0, 64, 256, zb->rkey);
	CHECK(w.status == IBV_WC_SUCCESS && zbuf[256] == 'z' && zbuf[319] == 'z' &&
		      zbuf[255] == 0 && zbuf[320] == 0,
	      "WRITE to remote address 256 of a zero-based region lands at offset 256 (%d)",
	      w.status);
	strcpy(zbuf + 1000, "zero-based");
	w = rdma(&a, IBV_WR_RDMA_READ, 2000, 10, 1000, zb->rkey);
	CHECK(w.status == IBV_WC_SUCCESS && memcmp(a.buf + 2000, "zero-based", 10) == 0,
	      "READ from remote address 1000 reads offset 1000 (%d)", w.status);
	*(uint64_t *)(zbuf + 512) = 40;
	w = rdma(&a, IBV_WR_ATOMIC_FETCH_AND_ADD, 3000, 8, 512, zb->rkey);
	CHECK(w.status == IBV_WC_SUCCESS && *(uint64_t *)(a.buf + 3000) == 40 &&
		      *(uint64_t *)(zbuf + 512) == 42,
	      "fetch-add at remote address 512 adds at offset 512 (%d)", w.status);

	/* A zero-based type 2 window over [4096, 6144) of b's region. */
	struct ibv_mw *mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
	MUST(mw);
	struct ibv_send_wr bw = { .wr_id = 5, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	bw.bind_mw.mw = mw;
	bw.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	bw.bind_mw.bind_info.mr = b.mr;
	bw.bind_mw.bind_info.addr = (uintptr_t)b.buf + 4096;
	bw.bind_mw.bind_info.length = 2048;
	bw.bind_mw.bind_info.mw_access_flags =
		IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ZERO_BASED;
	int rc = ibv_post_send(b.qp, &bw, &bad);
	w = wait1(b.cq);
	CHECK(rc == 0 && w.status == IBV_WC_SUCCESS,
	      "bind a type 2 window ZERO_BASED: success (%d, %d)", rc, w.status);
	memset(a.buf, 'w', 16);
	w = rdma(&a, IBV_WR_RDMA_WRITE, 0, 16, 8, bw.bind_mw.rkey);
	CHECK(w.status == IBV_WC_SUCCESS && b.buf[4096 + 8] == 'w' && b.buf[4096 + 23] == 'w' &&
		      b.buf[4096 + 7] == 0,
	      "WRITE to remote address 8 of the window lands 8 bytes into it (%d)", w.status);
	w = rdma(&a, IBV_WR_RDMA_WRITE, 0, 2, 2047, bw.bind_mw.rkey);
	CHECK(w.status == IBV_WC_REM_ACCESS_ERR,
	      "WRITE across the window's end: REM_ACCESS_ERR (%d)", w.status);
	ibv_dealloc_mw(mw);
	ibv_dereg_mr(zb);
out:
	free(zbuf);
	close_side(&a);
	close_side(&b);
}

static void iova(void)
{
	struct side a, b;
	rc_pair(&a, &b, NULL);
	char *buf;
	MUST(posix_memalign((void **)&buf, 4096, BUF) == 0);
	memset(buf, 0, BUF);
	uint64_t va = 0x500000000000ULL;
	struct ibv_mr *mr = ibv_reg_mr_iova(b.pd, buf, BUF, va, ALL);
	CHECK(mr != NULL, "reg_mr_iova at another iova: a region (errno %d)", mr ? 0 : errno);
	if (mr) {
		memset(a.buf, 'i', 32);
		struct ibv_wc w = rdma(&a, IBV_WR_RDMA_WRITE, 0, 32, va + 100, mr->rkey);
		CHECK(w.status == IBV_WC_SUCCESS && buf[100] == 'i' && buf[131] == 'i' && buf[99] == 0,
		      "WRITE to iova + 100 lands at offset 100 (%d)", w.status);
		ibv_dereg_mr(mr);
	}
	free(buf);
	close_side(&a);
	close_side(&b);
}

static uint64_t raw_clock(struct ibv_context *c)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	if (ibv_query_rt_values_ex(c, &v) || !(v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK))
		return 0;
	return (uint64_t)v.raw_clock.tv_sec * 1000000000ULL + v.raw_clock.tv_nsec;
}

static void timestamps(void)
{
	struct ibv_context *c = ibv_open_device(devs[0]);
	MUST(c);
	struct ibv_device_attr_ex dx;
	int rc = ibv_query_device_ex(c, NULL, &dx);
	CHECK(rc == 0 && dx.hca_core_clock > 0 && dx.completion_timestamp_mask != 0,
	      "query_device_ex: hca_core_clock %llu kHz, completion_timestamp_mask %#llx",
	      (unsigned long long)dx.hca_core_clock,
	      (unsigned long long)dx.completion_timestamp_mask);
	uint64_t khz = dx.hca_core_clock ? dx.hca_core_clock : 1;
	uint64_t t0 = raw_clock(c);
	CHECK(t0 != 0, "query_rt_values_ex RAW_CLOCK: %llu", (unsigned long long)t0);
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 16,
		.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
			    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
	};
	struct ibv_cq_ex *cx = ibv_create_cq_ex(c, &ca);
	CHECK(cx != NULL, "create_cq_ex with both timestamps (errno %d)", cx ? 0 : errno);
	if (!cx) {
		ibv_close_device(c);
		return;
	}
	/* The pair's a side uses the timestamping CQ, on its context. */
	struct side a, b;
	a.ctx = c;
	MUST(a.pd = ibv_alloc_pd(a.ctx));
	a.cq = ibv_cq_ex_to_cq(cx);
	struct ibv_qp_init_attr ia = {
		.send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	MUST(a.qp = ibv_create_qp(a.pd, &ia));
	MUST(posix_memalign((void **)&a.buf, 4096, BUF) == 0);
	MUST(a.mr = ibv_reg_mr(a.pd, a.buf, BUF, ALL));
	MUST(ibv_query_gid(a.ctx, 1, 1, &a.gid) == 0);
	open_side(&b, 1, NULL, IBV_QPT_RC);
	rc_up(&a, &b);
	rc_up(&b, &a);

	struct timespec r0;
	clock_gettime(CLOCK_REALTIME, &r0);
	uint64_t before = raw_clock(a.ctx);
	struct ibv_sge sge = { .addr = (uintptr_t)a.buf, .length = 8, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
	wr.wr.rdma.rkey = b.mr->rkey;
	MUST(ibv_post_send(a.qp, &wr, &bad) == 0);
	/* The completion is generated within microseconds; poll 100 ms later. */
	usleep(100000);
	uint64_t polled = raw_clock(a.ctx);
	struct ibv_poll_cq_attr pa = { 0 };
	int got = 0;
	for (int i = 0; i < 500000 && !got; i++) {
		if (ibv_start_poll(cx, &pa) == 0)
			got = 1;
		else
			usleep(10);
	}
	uint64_t ts = 0, wall = 0;
	if (got) {
		ts = ibv_wc_read_completion_ts(cx);
		wall = ibv_wc_read_completion_wallclock_ns(cx);
		ibv_end_poll(cx);
	}
	CHECK(got && ts >= before && ts <= polled,
	      "completion timestamp %llu within the raw clock's [%llu, %llu]",
	      (unsigned long long)ts, (unsigned long long)before,
	      (unsigned long long)polled);
	uint64_t ahead_us = (polled - ts) * 1000 / khz;
	CHECK(got && ahead_us >= 90000,
	      "taken when generated, not when polled: %llu us before the poll",
	      (unsigned long long)ahead_us);
	uint64_t r0ns = (uint64_t)r0.tv_sec * 1000000000ULL + r0.tv_nsec;
	CHECK(got && wall + 1000000 >= r0ns && wall < r0ns + 90000000ULL,
	      "wallclock %llu ns: just after the post (%llu)", (unsigned long long)wall,
	      (unsigned long long)r0ns);
	ibv_destroy_qp(a.qp);
	ibv_dereg_mr(a.mr);
	ibv_destroy_cq(a.cq);
	ibv_dealloc_pd(a.pd);
	ibv_close_device(c);
	free(a.buf);
	close_side(&b);
}

static void ud_tos(void)
{
	struct side a, b;
	open_side(&a, 0, NULL, IBV_QPT_UD);
	open_side(&b, 1, NULL, IBV_QPT_UD);
	struct side *s[2] = { &a, &b };
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr x = { .qp_state = IBV_QPS_INIT, .port_num = 1,
					 .qkey = 0x11111111 };
		MUST(ibv_modify_qp(s[i]->qp, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
						 IBV_QP_PORT | IBV_QP_QKEY) == 0);
		x.qp_state = IBV_QPS_RTR;
		MUST(ibv_modify_qp(s[i]->qp, &x, IBV_QP_STATE) == 0);
		x.qp_state = IBV_QPS_RTS;
		x.sq_psn = 0;
		MUST(ibv_modify_qp(s[i]->qp, &x, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
	}
	const uint8_t classes[] = { 0xb8, 0x2a, 0 };
	for (int k = 0; k < 3; k++) {
		struct ibv_sge rs = { .addr = (uintptr_t)b.buf + k * 256, .length = 256,
				      .lkey = b.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = k, .sg_list = &rs, .num_sge = 1 }, *rbad;
		MUST(ibv_post_recv(b.qp, &rw, &rbad) == 0);
		struct ibv_ah_attr aa = {
			.is_global = 1, .port_num = 1,
			.grh = { .dgid = b.gid, .sgid_index = 1, .hop_limit = 64,
				 .traffic_class = classes[k] },
		};
		struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
		MUST(ah);
		struct ibv_sge ss = { .addr = (uintptr_t)a.buf, .length = 8, .lkey = a.mr->lkey };
		struct ibv_send_wr sw = { .wr_id = k, .sg_list = &ss, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		sw.wr.ud.ah = ah;
		sw.wr.ud.remote_qpn = b.qp->qp_num;
		sw.wr.ud.remote_qkey = 0x11111111;
		MUST(ibv_post_send(a.qp, &sw, &bad) == 0);
		struct ibv_wc ws = wait1(a.cq), wr = wait1(b.cq);
		uint8_t tos = (uint8_t)b.buf[k * 256 + 21];
		CHECK(ws.status == IBV_WC_SUCCESS && wr.status == IBV_WC_SUCCESS &&
			      (wr.wc_flags & IBV_WC_GRH) && tos == classes[k],
		      "UD send with traffic_class %#x: the receiver's GRH area has TOS %#x",
		      classes[k], tos);
		ibv_destroy_ah(ah);
	}
	close_side(&a);
	close_side(&b);
}

static void write_imm(enum ibv_qp_type t)
{
	struct side a, b;
	open_side(&a, 0, NULL, t);
	open_side(&b, 1, NULL, t);
	if (t == IBV_QPT_RC) {
		rc_up(&a, &b);
		rc_up(&b, &a);
	} else {
		struct side *s[2][2] = { { &a, &b }, { &b, &a } };
		for (int i = 0; i < 2; i++) {
			struct side *me = s[i][0], *p = s[i][1];
			struct ibv_qp_attr x = { .qp_state = IBV_QPS_INIT, .port_num = 1,
						 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
			MUST(ibv_modify_qp(me->qp, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
							 IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
			struct ibv_qp_attr r = {
				.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
				.dest_qp_num = p->qp->qp_num,
				.ah_attr = { .is_global = 1, .port_num = 1,
					     .grh = { .dgid = p->gid, .sgid_index = 1,
						      .hop_limit = 64 } },
			};
			MUST(ibv_modify_qp(me->qp, &r, IBV_QP_STATE | IBV_QP_AV |
							 IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
							 IBV_QP_RQ_PSN) == 0);
			struct ibv_qp_attr ts = { .qp_state = IBV_QPS_RTS };
			MUST(ibv_modify_qp(me->qp, &ts, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
		}
	}
	const char *tn = t == IBV_QPT_RC ? "RC" : "UC";
	/* num_sge 0; one 0-byte SGE; one 16-byte SGE; (RC) none yet. */
	const char *what[] = { "no SGE", "a 0-byte SGE", "a 16-byte SGE",
			       "no receive WR yet (posted 20 ms later)" };
	int cases = t == IBV_QPT_RC ? 4 : 3;
	for (int c = 0; c < cases; c++) {
		uint32_t len = c == 2 ? 3000 : 64;
		struct ibv_sge rs = { .addr = (uintptr_t)b.buf + 6000,
				      .length = c == 2 ? 16 : 0, .lkey = b.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 100 + c, .sg_list = &rs,
					  .num_sge = c == 0 || c == 3 ? 0 : 1 }, *rbad;
		if (c < 3)
			MUST(ibv_post_recv(b.qp, &rw, &rbad) == 0);
		memset(a.buf, 'a' + c, len);
		memset(b.buf, 0, len);
		struct ibv_sge ss = { .addr = (uintptr_t)a.buf, .length = len,
				      .lkey = a.mr->lkey };
		struct ibv_send_wr sw = { .wr_id = c, .sg_list = &ss, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
					  .send_flags = IBV_SEND_SIGNALED,
					  .imm_data = htonl(0x1234 + c) }, *bad;
		sw.wr.rdma.remote_addr = (uintptr_t)b.buf;
		sw.wr.rdma.rkey = b.mr->rkey;
		MUST(ibv_post_send(a.qp, &sw, &bad) == 0);
		if (c == 3) {
			usleep(20000);
			MUST(ibv_post_recv(b.qp, &rw, &rbad) == 0);
		}
		struct ibv_wc ws = wait1(a.cq), wr = wait1(b.cq);
		CHECK(ws.status == IBV_WC_SUCCESS && wr.status == IBV_WC_SUCCESS &&
			      wr.opcode == IBV_WC_RECV_RDMA_WITH_IMM && wr.byte_len == len &&
			      wr.wr_id == 100 + (unsigned)c && ntohl(wr.imm_data) == 0x1234u + c &&
			      b.buf[0] == 'a' + c && b.buf[len - 1] == 'a' + c,
		      "%s WRITE_WITH_IMM of %u bytes, receive WR with %s: sender %s, receiver %s, "
		      "opcode %d, byte_len %u",
		      tn, len, what[c], ibv_wc_status_str(ws.status),
		      ibv_wc_status_str(wr.status), wr.opcode, wr.byte_len);
	}
	close_side(&a);
	close_side(&b);
}

int main(void)
{
	int n;
	devs = ibv_get_device_list(&n);
	if (!devs || n < 2) {
		fprintf(stderr, "need two devices (UROCE_DEVICES)\n");
		return 2;
	}
	zero_based();
	iova();
	timestamps();
	ud_tos();
	write_imm(IBV_QPT_RC);
	write_imm(IBV_QPT_UC);
	ibv_free_device_list(devs);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
