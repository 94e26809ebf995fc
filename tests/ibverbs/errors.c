/*
 * Error paths of uroce's libibverbs, through the C API as a program sees it
 * (compiled against Debian's <infiniband/verbs.h>, run with
 * LD_LIBRARY_PATH=$(uroce libdir)): every call must return what libibverbs
 * returns -- NULL + errno, the errno value, -1 + errno, or a completion
 * with the right status.
 *
 * Also the parts the ibverbs-utils and perftest matrix does not reach on
 * uroce: the ibv_wr_* API on an ibv_qp_ex, ibv_cq_ex polling
 * (ibv_start_poll/ibv_next_poll/ibv_end_poll), and a completion channel's
 * descriptor in poll(2).
 *
 * Two devices in one process: UROCE_DEVICES names them (the script sets
 * 127.40.2.1 and 127.40.2.2). Prints one line per check and
 * "N passed, N failed".
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <endian.h>
#include <sys/mman.h>
#include <unistd.h>
#include <net/if.h>

#include "check.h"

enum { BUF = 4096 };

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static void open_side(struct side *s, struct ibv_device *dev)
{
	MUST(s->ctx = ibv_open_device(dev));
	MUST(s->pd = ibv_alloc_pd(s->ctx));
	MUST(s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0));
	MUST(s->buf = aligned_alloc(4096, BUF));
	memset(s->buf, 0, BUF);
	MUST(s->mr = ibv_reg_mr(s->pd, s->buf, BUF,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					IBV_ACCESS_REMOTE_READ));
	MUST(ibv_query_gid(s->ctx, 1, 0, &s->gid) == 0);
}

static struct ibv_qp *rc_qp(struct side *s)
{
	struct ibv_qp_init_attr a = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(s->pd, &a);
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ,
	};
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_ACCESS_FLAGS);
}

static int to_rtr_sgid(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *dgid,
		       int global, int sgid_index)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = dqpn,
		.rq_psn = 0,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = global, .port_num = 1,
			     .grh = { .dgid = *dgid, .hop_limit = 1,
				      .sgid_index = sgid_index } },
	};
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER);
}

static int to_rtr(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *dgid,
		  int global)
{
	return to_rtr_sgid(qp, dqpn, dgid, global, 0);
}

static int to_rts_rnr(struct ibv_qp *qp, int rnr_retry)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTS,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = rnr_retry,
		.sq_psn = 0,
		.max_rd_atomic = 1,
	};
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

static int to_rts(struct ibv_qp *qp)
{
	return to_rts_rnr(qp, 7);
}

static void connect_pair(struct side *a, struct side *b)
{
	MUST(to_init(a->qp) == 0 && to_init(b->qp) == 0);
	MUST(to_rtr(a->qp, b->qp->qp_num, &b->gid, 1) == 0);
	/* GID index 1, as programs written for kernel rxe use it. */
	MUST(to_rtr_sgid(b->qp, a->qp->qp_num, &a->gid, 1, 1) == 0);
	MUST(to_rts(a->qp) == 0 && to_rts(b->qp) == 0);
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

static int post_write(struct side *s, uint32_t lkey, uint64_t raddr,
		      uint32_t rkey, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf, .length = 64,
			       .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = id, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr = { .rdma = { .remote_addr = raddr, .rkey = rkey } },
	}, *bad = NULL;
	return ibv_post_send(s->qp, &wr, &bad);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST(list && n >= 2);
	struct side a = { 0 }, b = { 0 };
	open_side(&a, list[0]);
	open_side(&b, list[1]);

	struct ibv_context *twice = ibv_open_device(list[0]);
	struct ibv_pd *tpd = twice ? ibv_alloc_pd(twice) : NULL;
	CHECK(twice && tpd && ibv_dealloc_pd(tpd) == 0 && ibv_close_device(twice) == 0,
	      "a device opened twice in one process (shares its engine)");
	struct ibv_device_attr da;
	CHECK(ibv_query_device(a.ctx, &da) == 0 && da.phys_port_cnt == 1 &&
		      da.max_srq > 0 && da.max_qp_wr > 0 &&
		      da.node_guid == ibv_get_device_guid(list[0]),
	      "query_device: 1 port, SRQs, node_guid as ibv_get_device_guid");

	/* ---- argument and state errors: NULL + errno, errno values */
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(a.pd, a.buf, BUF, IBV_ACCESS_REMOTE_WRITE);
	CHECK(!mr && errno == EINVAL,
	      "reg_mr REMOTE_WRITE without LOCAL_WRITE: NULL, errno EINVAL (%d)", errno);
	errno = 0;
	CHECK(!ibv_create_cq(a.ctx, 0, NULL, NULL, 0) && errno == EINVAL,
	      "create_cq with 0 entries: NULL, errno EINVAL (%d)", errno);
	struct ibv_qp_init_attr xa = { .send_cq = a.cq, .recv_cq = a.cq,
				       .cap = { 1, 1, 1, 1, 0 },
				       .qp_type = IBV_QPT_RAW_PACKET };
	errno = 0;
	CHECK(!ibv_create_qp(a.pd, &xa) && errno == EOPNOTSUPP,
	      "create_qp RAW_PACKET: NULL, errno EOPNOTSUPP (%d)", errno);
	union ibv_gid g;
	CHECK(ibv_query_gid(a.ctx, 1, 99, &g) == -1,
	      "query_gid index 99 of a 16-entry table: -1");
	CHECK(ibv_query_gid(a.ctx, 1, 1, &g) == 0 && memcmp(&g, &a.gid, 16) == 0,
	      "query_gid index 1 (where rxe keeps its RoCEv2 GID): the device's GID");
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(a.ctx, 2, &pa) == EINVAL,
	      "query_port 2 of a 1-port device: EINVAL");
	CHECK(ibv_query_port(a.ctx, 1, &pa) == 0 && pa.gid_tbl_len == 16,
	      "query_port: gid_tbl_len 16 (%d)", pa.gid_tbl_len);
	{
		/* Entries 2.. are empty, as most of a kernel device's table:
		 * ENODATA from ibv_query_gid_ex, the zero GID from
		 * ibv_query_gid; past the table, EINVAL. */
		struct ibv_gid_entry ge;
		union ibv_gid g;
		static const union ibv_gid zero;
		CHECK(ibv_query_gid_ex(a.ctx, 1, 5, &ge, 0) == ENODATA,
		      "query_gid_ex of an empty entry: ENODATA");
		CHECK(ibv_query_gid_ex(a.ctx, 1, 16, &ge, 0) == EINVAL,
		      "query_gid_ex past the table: EINVAL");
		memset(&g, 0xff, sizeof(g));
		CHECK(ibv_query_gid(a.ctx, 1, 5, &g) == 0 &&
			      memcmp(&g, &zero, sizeof(g)) == 0,
		      "query_gid of an empty entry: the zero GID");
		CHECK(ibv_query_gid(a.ctx, 1, 16, &g) == -1,
		      "query_gid past the table: -1");
	}
	{
		/* The GID entries name the interface holding the address (lo). */
		struct ibv_gid_entry ge;
		unsigned lo = if_nametoindex("lo");
		int rc = ibv_query_gid_ex(a.ctx, 1, 1, &ge, 0);
		CHECK(rc == 0 && ge.gid_index == 1 && ge.port_num == 1 &&
			      ge.gid_type == IBV_GID_TYPE_ROCE_V2 &&
			      ge.ndev_ifindex == lo && lo != 0 &&
			      memcmp(&ge.gid, &a.gid, 16) == 0,
		      "query_gid_ex index 1: RoCE v2, ndev_ifindex %u = lo's %u",
		      ge.ndev_ifindex, lo);
		rc = ibv_query_gid_ex(a.ctx, 1, 2, &ge, 0);
		CHECK(rc == ENODATA, "query_gid_ex index 2 (empty): ENODATA (%d)", rc);
		struct ibv_gid_entry one[1];
		errno = 0;
		ssize_t n = ibv_query_gid_table(a.ctx, one, 1, 0);
		CHECK(n == -EINVAL || (n < 0 && errno == EINVAL),
		      "query_gid_table with room for 1 of 2 entries: EINVAL (%zd)", n);
		struct ibv_gid_entry tbl[4];
		memset(tbl, 0xff, sizeof(tbl));
		n = ibv_query_gid_table(a.ctx, tbl, 4, 0);
		CHECK(n == 2 && tbl[0].gid_index == 0 && tbl[1].gid_index == 1 &&
			      memcmp(&tbl[0].gid, &a.gid, 16) == 0 &&
			      memcmp(&tbl[1].gid, &a.gid, 16) == 0 &&
			      tbl[1].ndev_ifindex == lo && tbl[2].gid_index == 0xffffffff,
		      "query_gid_table: 2 entries, both the device's GID (%zd)", n);
	}

	MUST(a.qp = rc_qp(&a));
	MUST(b.qp = rc_qp(&b));
	struct ibv_sge sge = { (uintptr_t)a.buf, 8, a.mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND }, *bad = NULL;
	int rc = ibv_post_send(a.qp, &swr, &bad);
	CHECK(rc == EINVAL && bad == &swr,
	      "post_send in RESET: EINVAL (%d), bad_wr = the WR", rc);
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 },
			   *rbad = NULL;
	rc = ibv_post_recv(a.qp, &rwr, &rbad);
	CHECK(rc == EINVAL && rbad == &rwr, "post_recv in RESET: EINVAL (%d)", rc);
	rc = to_rts(a.qp);
	CHECK(rc == EINVAL, "modify RESET -> RTS: EINVAL (%d)", rc);
	MUST(to_init(a.qp) == 0);
	rc = to_rtr(a.qp, b.qp->qp_num, &b.gid, 0);
	CHECK(rc == EINVAL, "modify to RTR without a GRH on RoCE: EINVAL (%d)", rc);
	rc = to_rtr_sgid(a.qp, b.qp->qp_num, &b.gid, 1, 2);
	CHECK(rc == EINVAL, "modify to RTR with sgid_index 2 of 2 entries: EINVAL (%d)", rc);
	CHECK(a.qp->state == IBV_QPS_INIT, "qp->state follows modify (INIT)");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	rc = ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi);
	CHECK(rc == 0 && qa.qp_state == IBV_QPS_INIT && qi.cap.max_send_wr >= 16,
	      "query_qp: INIT, max_send_wr %u", qi.cap.max_send_wr);
	struct ibv_sge many[2] = { sge, sge };
	MUST(ibv_modify_qp(a.qp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RESET },
			   IBV_QP_STATE) == 0);

	/* ---- careless input (issue #12): counts checked before the list is
	 * read, NULL lists, bad ranges and vectors; rxe and the kernel answer
	 * these with an errno, never a crash. The wild pointer (8) would fault
	 * if it were read. */
	struct ibv_send_wr hwr = { .wr_id = 9, .sg_list = (struct ibv_sge *)8,
				   .num_sge = 1 << 20, .opcode = IBV_WR_SEND };
	bad = NULL;
	rc = ibv_post_send(a.qp, &hwr, &bad);
	CHECK(rc == EINVAL && bad == &hwr,
	      "post_send with num_sge 2^20 and a wild sg_list: EINVAL (%d), list not read", rc);
	struct ibv_recv_wr hrwr = { .wr_id = 10, .sg_list = (struct ibv_sge *)8,
				    .num_sge = 1 << 20 };
	rbad = NULL;
	rc = ibv_post_recv(a.qp, &hrwr, &rbad);
	CHECK(rc == EINVAL && rbad == &hrwr,
	      "post_recv with num_sge 2^20 and a wild sg_list: EINVAL (%d)", rc);
	hrwr.num_sge = 1;
	hrwr.sg_list = NULL;
	rc = ibv_post_recv(a.qp, &hrwr, &rbad);
	CHECK(rc == EINVAL && rbad == &hrwr, "post_recv with a NULL sg_list: EINVAL (%d)", rc);
	hrwr.num_sge = -1;
	rc = ibv_post_recv(a.qp, &hrwr, &rbad);
	CHECK(rc == EINVAL, "post_recv with num_sge -1: EINVAL (%d)", rc);
	hwr.num_sge = 1;
	hwr.sg_list = NULL;
	bad = NULL;
	rc = ibv_post_send(a.qp, &hwr, &bad);
	CHECK(rc == EINVAL && bad == &hwr, "post_send with a NULL sg_list: EINVAL (%d)", rc);
	hwr.num_sge = -1;
	bad = NULL;
	rc = ibv_post_send(a.qp, &hwr, &bad);
	CHECK(rc == EINVAL && bad == &hwr, "post_send with num_sge -1: EINVAL (%d)", rc);
	hwr.num_sge = 1 << 20;
	hwr.sg_list = (struct ibv_sge *)8;
	hwr.send_flags = IBV_SEND_INLINE;
	bad = NULL;
	rc = ibv_post_send(a.qp, &hwr, &bad);
	CHECK(rc == EINVAL && bad == &hwr,
	      "inline post_send with num_sge 2^20 and a wild sg_list: EINVAL (%d)", rc);
	bad = &hwr;
	rc = ibv_post_send(a.qp, NULL, &bad);
	CHECK(rc == EINVAL && bad == NULL, "post_send of a NULL list: EINVAL (%d), bad_wr NULL", rc);
	rbad = &hrwr;
	rc = ibv_post_recv(a.qp, NULL, &rbad);
	CHECK(rc == EINVAL && rbad == NULL, "post_recv of a NULL list: EINVAL (%d), bad_wr NULL", rc);
	rc = ibv_post_send(a.qp, NULL, NULL);
	CHECK(rc == EINVAL, "post_send of a NULL list, NULL bad_wr: EINVAL (%d)", rc);
	hrwr.num_sge = 1 << 20;
	hrwr.sg_list = (struct ibv_sge *)8;
	rc = ibv_post_recv(a.qp, &hrwr, NULL);
	CHECK(rc == EINVAL, "post_recv with num_sge 2^20, NULL bad_wr: EINVAL (%d)", rc);
	MUST(to_init(a.qp) == 0);
	rc = ibv_post_recv(a.qp, &rwr, &rbad);
	CHECK(rc == 0, "a valid post_recv after the careless ones (%d)", rc);
	rc = ibv_modify_qp(a.qp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RESET },
			   IBV_QP_STATE | IBV_QP_RATE_LIMIT);
	CHECK(rc == EOPNOTSUPP && a.qp->state == IBV_QPS_INIT,
	      "modify_qp with a mask bit past IBV_QP_DEST_QPN: EOPNOTSUPP (%d)", rc);
	MUST(ibv_modify_qp(a.qp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RESET },
			   IBV_QP_STATE) == 0);
	long page = sysconf(_SC_PAGESIZE);
	char *gone = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	MUST(gone != MAP_FAILED);
	MUST(munmap(gone + page, page) == 0); /* a hole in the middle */
	errno = 0;
	mr = ibv_reg_mr(a.pd, gone, 4 * page, IBV_ACCESS_LOCAL_WRITE);
	CHECK(!mr && errno == EFAULT,
	      "reg_mr over an unmapped page: NULL, errno EFAULT (%d)", errno);
	MUST(mprotect(gone, page, PROT_READ) == 0);
	errno = 0;
	mr = ibv_reg_mr(a.pd, gone, page, IBV_ACCESS_LOCAL_WRITE);
	CHECK(!mr && errno == EFAULT,
	      "reg_mr for writing over read-only memory: NULL, errno EFAULT (%d)", errno);
	mr = ibv_reg_mr(a.pd, gone, page, 0);
	CHECK(mr && ibv_dereg_mr(mr) == 0, "reg_mr read-only over read-only memory");
	MUST(mprotect(gone + 2 * page, page, PROT_NONE) == 0);
	errno = 0;
	mr = ibv_reg_mr(a.pd, gone + 2 * page, page, 0);
	CHECK(!mr && errno == EFAULT,
	      "reg_mr over a PROT_NONE page: NULL, errno EFAULT (%d)", errno);
	errno = 0;
	mr = ibv_reg_mr(a.pd, a.buf, SIZE_MAX, 0);
	CHECK(!mr && errno == EINVAL,
	      "reg_mr of SIZE_MAX bytes (wraps): NULL, errno EINVAL (%d)", errno);
	errno = 0;
	mr = ibv_reg_mr_iova(a.pd, a.buf, BUF, (uintptr_t)a.buf + 1, IBV_ACCESS_LOCAL_WRITE);
	CHECK(!mr && errno == EINVAL,
	      "reg_mr_iova at another offset in the page: NULL, errno EINVAL (%d)", errno);
	errno = 0;
	mr = ibv_reg_mr(a.pd, (void *)(uintptr_t)-4096, 8192, IBV_ACCESS_LOCAL_WRITE);
	CHECK(!mr && errno == EINVAL,
	      "reg_mr of a range that wraps the address space: NULL, errno EINVAL (%d)", errno);
	errno = 0;
	mr = ibv_reg_mr(a.pd, a.buf, 0, IBV_ACCESS_LOCAL_WRITE);
	CHECK(!mr && errno == EINVAL, "reg_mr of 0 bytes: NULL, errno EINVAL (%d)", errno);
	mr = ibv_reg_mr(a.pd, a.buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && ibv_dereg_mr(mr) == 0, "a valid reg_mr after the refused ones");
	munmap(gone, page);
	munmap(gone + 2 * page, 2 * page);
	errno = 0;
	struct ibv_cq *vcq = ibv_create_cq(a.ctx, 16, NULL, NULL, a.ctx->num_comp_vectors);
	CHECK(!vcq && errno == EINVAL,
	      "create_cq on vector num_comp_vectors (%d): NULL, errno EINVAL (%d)",
	      a.ctx->num_comp_vectors, errno);
	vcq = ibv_create_cq(a.ctx, 16, NULL, NULL, -1);
	CHECK(!vcq && errno == EINVAL, "create_cq on vector -1: NULL, errno EINVAL");
	struct ibv_cq_init_attr_ex vcqa = { .cqe = 16, .comp_vector = a.ctx->num_comp_vectors,
					    .wc_flags = IBV_WC_STANDARD_FLAGS };
	errno = 0;
	CHECK(!ibv_create_cq_ex(a.ctx, &vcqa) && errno == EINVAL,
	      "create_cq_ex on vector num_comp_vectors: NULL, errno EINVAL (%d)", errno);
	vcq = ibv_create_cq(a.ctx, 16, NULL, NULL, a.ctx->num_comp_vectors - 1);
	CHECK(vcq && ibv_destroy_cq(vcq) == 0, "create_cq on the last vector");

	/* ---- busy objects */
	rc = ibv_destroy_cq(a.cq);
	CHECK(rc == EBUSY, "destroy_cq while a QP uses it: EBUSY (%d)", rc);
	rc = ibv_dealloc_pd(a.pd);
	CHECK(rc == EBUSY, "dealloc_pd with an MR and a QP: EBUSY (%d)", rc);

	/* ---- SRQ errors; what uroce does not do */
	struct ibv_srq_init_attr sia = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(a.pd, &sia);
	CHECK(srq && sia.attr.max_wr >= 8, "create_srq");
	MUST(srq);
	struct ibv_srq_attr sa = { .srq_limit = 100 };
	rc = ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT);
	CHECK(rc == EINVAL, "modify_srq with a limit above max_wr: EINVAL (%d)", rc);
	struct ibv_recv_wr srw = { .wr_id = 3, .sg_list = many, .num_sge = 2 },
			   *sbad = NULL;
	rc = ibv_post_srq_recv(srq, &srw, &sbad);
	CHECK(rc == EINVAL && sbad == &srw,
	      "post_srq_recv with more SGEs than max_sge: EINVAL (%d)", rc);
	struct ibv_recv_wr hsrw = { .wr_id = 4, .sg_list = (struct ibv_sge *)8,
				    .num_sge = 1 << 20 };
	sbad = NULL;
	rc = ibv_post_srq_recv(srq, &hsrw, &sbad);
	CHECK(rc == EINVAL && sbad == &hsrw,
	      "post_srq_recv with num_sge 2^20 and a wild sg_list: EINVAL (%d)", rc);
	hsrw.num_sge = 1;
	hsrw.sg_list = NULL;
	sbad = NULL;
	rc = ibv_post_srq_recv(srq, &hsrw, &sbad);
	CHECK(rc == EINVAL && sbad == &hsrw, "post_srq_recv with a NULL sg_list: EINVAL (%d)", rc);
	hsrw.num_sge = -1;
	rc = ibv_post_srq_recv(srq, &hsrw, &sbad);
	CHECK(rc == EINVAL, "post_srq_recv with num_sge -1: EINVAL (%d)", rc);
	sbad = &hsrw;
	rc = ibv_post_srq_recv(srq, NULL, &sbad);
	CHECK(rc == EINVAL && sbad == NULL, "post_srq_recv of a NULL list: EINVAL (%d)", rc);
	srw.num_sge = 1;
	rc = ibv_post_srq_recv(srq, &srw, &sbad);
	CHECK(rc == 0, "a valid post_srq_recv after the careless ones (%d)", rc);
	struct ibv_qp_init_attr sqa = { .send_cq = a.cq, .recv_cq = a.cq, .srq = srq,
					.cap = { 4, 4, 1, 1, 0 },
					.qp_type = IBV_QPT_RC };
	struct ibv_qp *sqp = ibv_create_qp(a.pd, &sqa);
	MUST(sqp && to_init(sqp) == 0);
	srw.num_sge = 1;
	rc = ibv_post_recv(sqp, &srw, &sbad);
	CHECK(rc == EINVAL, "post_recv on a QP that receives from an SRQ: EINVAL (%d)", rc);
	rc = ibv_destroy_srq(srq);
	CHECK(rc == EBUSY, "destroy_srq while a QP uses it: EBUSY (%d)", rc);
	MUST(ibv_destroy_qp(sqp) == 0);
	CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq once unused");
	rc = ibv_resize_cq(a.cq, 128);
	CHECK(rc == 0 && a.cq->cqe >= 128, "resize_cq to 128: 0, cqe %d", a.cq->cqe);
	rc = ibv_resize_cq(a.cq, 0);
	CHECK(rc == EINVAL, "resize_cq to 0: EINVAL (%d)", rc);
	rc = ibv_resize_cq(a.cq, da.max_cqe + 1);
	CHECK(rc == EINVAL && a.cq->cqe >= 128,
	      "resize_cq past max_cqe: EINVAL (%d), the CQ unchanged", rc);
	MUST(ibv_resize_cq(a.cq, 64) == 0);
	rc = ibv_attach_mcast(a.qp, &a.gid, 0);
	CHECK(rc == EINVAL, "attach_mcast of an RC QP to a unicast GID: EINVAL (%d)", rc);
	uint16_t pkey = 0;
	CHECK(ibv_query_pkey(a.ctx, 1, 0, &pkey) == 0 && pkey == 0xffff &&
		      ibv_query_pkey(a.ctx, 1, 1, &pkey) == -1,
	      "query_pkey: 0xffff at index 0, -1 past the table");

	/* ---- a connected pair: completions with error statuses */
	connect_pair(&a, &b);
	swr.sg_list = many;
	swr.num_sge = 2;
	rc = ibv_post_send(a.qp, &swr, &bad);
	CHECK(rc == EINVAL, "post_send with more SGEs than max_send_sge: EINVAL (%d)", rc);
	swr.sg_list = &sge;
	swr.num_sge = 1;
	struct ibv_send_wr iwr = { .wr_id = 14, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_INLINE };
	rc = ibv_post_send(a.qp, &iwr, &bad);
	CHECK(rc == EINVAL && bad == &iwr,
	      "inline send longer than max_inline_data (0): EINVAL (%d)", rc);
	hwr.send_flags = 0;
	bad = NULL;
	rc = ibv_post_send(a.qp, &hwr, &bad);
	CHECK(rc == EINVAL && bad == &hwr,
	      "post_send in RTS with num_sge 2^20 and a wild sg_list: EINVAL (%d)", rc);
	/* Two WRs: the first posts, the second is refused (bad_wr = it). */
	struct ibv_send_wr two = { .wr_id = 15, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_RDMA_WRITE, .next = &hwr,
				   .wr = { .rdma = { .remote_addr = (uintptr_t)b.buf,
						     .rkey = b.mr->rkey } } };
	bad = NULL;
	rc = ibv_post_send(a.qp, &two, &bad);
	CHECK(rc == EINVAL && bad == &hwr,
	      "a list whose second WR has num_sge 2^20: EINVAL (%d), bad_wr = the second", rc);

	struct ibv_wc wc;
	strcpy(a.buf, "hello uroce");
	MUST(post_write(&a, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey, 10) == 0);
	CHECK(wait_wc(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
		      wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 10 &&
		      strcmp(b.buf, "hello uroce") == 0,
	      "RDMA WRITE: success, data arrived");

	/* ---- importing a context, a PD and an MR (one process) */
	{
		errno = 0;
		CHECK(!ibv_import_device(-1) && errno == EBADF,
		      "import_device of a closed fd: NULL, EBADF (%d)", errno);
		int null_fd = open("/dev/null", O_RDONLY);
		errno = 0;
		CHECK(!ibv_import_device(null_fd) && errno == EOPNOTSUPP,
		      "import_device of a descriptor that names no context: NULL, EOPNOTSUPP (%d)",
		      errno);
		close(null_fd);
		struct ibv_context *ic = ibv_import_device(dup(b.ctx->cmd_fd));
		struct ibv_pd *ipd = ic ? ibv_import_pd(ic, b.pd->handle) : NULL;
		struct ibv_mr *imr = ipd ? ibv_import_mr(ipd, b.mr->handle) : NULL;
		CHECK(ic && ic->device == b.ctx->device && ipd && ipd->handle == b.pd->handle &&
			      imr && imr->lkey == b.mr->lkey && imr->rkey == b.mr->rkey &&
			      imr->length == b.mr->length && imr->addr == NULL,
		      "import_device(dup(cmd_fd)), import_pd, import_mr: the same objects");
		errno = 0;
		CHECK(ic && !ibv_import_pd(ic, 0xdead) && errno == EINVAL,
		      "import_pd of an unknown handle: NULL, EINVAL (%d)", errno);
		if (imr)
			ibv_unimport_mr(imr);
		if (ipd)
			ibv_unimport_pd(ipd);
		strcpy(a.buf, "still registered");
		MUST(post_write(&a, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey, 30) == 0);
		CHECK(wait_wc(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			      strcmp(b.buf, "still registered") == 0,
		      "after unimport_mr/pd the region still serves the peer");
		CHECK(ic && ibv_close_device(ic) == 0, "close the imported context");
	}

	/* ---- memory windows and re-registration (the pair stays healthy) */
	{
		errno = 0;
		CHECK(!ibv_alloc_mw(b.pd, 3) && errno == EINVAL,
		      "alloc_mw of type 3: NULL, errno EINVAL (%d)", errno);
		char *wbuf = aligned_alloc(4096, BUF);
		MUST(wbuf);
		memset(wbuf, 0, BUF);
		struct ibv_mr *wmr = ibv_reg_mr(b.pd, wbuf, BUF,
						IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
		MUST(wmr);
		struct ibv_mw *mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
		struct ibv_mw *mw2 = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
		CHECK(mw && mw2 && mw->type == IBV_MW_TYPE_1 && mw->pd == b.pd &&
			      (mw->rkey >> 8) != (mw2->rkey >> 8),
		      "alloc_mw of types 1 and 2");
		struct ibv_mw_bind bind = {
			.wr_id = 40, .send_flags = IBV_SEND_SIGNALED,
			.bind_info = { .mr = wmr, .addr = (uintptr_t)wbuf + 256,
				       .length = 256,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
		};
		rc = ibv_bind_mw(b.qp, mw2, &bind);
		CHECK(rc == EINVAL, "bind_mw of a type 2 window: EINVAL (%d)", rc);
		struct ibv_mw_bind other = bind;
		other.bind_info.mr = a.mr; /* a region of a's PD */
		rc = ibv_bind_mw(b.qp, mw, &other);
		CHECK(rc == EPERM, "bind_mw to a region of another PD: EPERM (%d)", rc);
		uint32_t old = mw->rkey;
		rc = ibv_bind_mw(b.qp, mw, &bind);
		CHECK(rc == 0 && mw->rkey == ibv_inc_rkey(old) && wait_wc(b.cq, &wc) == 1 &&
			      wc.wr_id == 40 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_BIND_MW,
		      "bind_mw type 1: the rkey steps, BIND_MW completion (%s)",
		      ibv_wc_status_str(wc.status));
		strcpy(a.buf, "through a window");
		MUST(post_write(&a, a.mr->lkey, (uintptr_t)wbuf + 256, mw->rkey, 41) == 0);
		CHECK(wait_wc(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			      strcmp(wbuf + 256, "through a window") == 0 && wbuf[255] == 0,
		      "RDMA WRITE through a type 1 window");
		rc = ibv_dereg_mr(wmr);
		CHECK(rc == EBUSY, "dereg_mr with a window bound: EBUSY (%d)", rc);
		rc = ibv_rereg_mr(wmr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
				  IBV_ACCESS_LOCAL_WRITE);
		CHECK(rc == IBV_REREG_MR_ERR_CMD && errno == EBUSY,
		      "rereg_mr with a window bound: ERR_CMD, EBUSY (%d, %d)", rc, errno);
		/* Unbind: a zero-length bind with no region. */
		struct ibv_mw_bind unbind = { .wr_id = 42, .send_flags = IBV_SEND_SIGNALED };
		rc = ibv_bind_mw(b.qp, mw, &unbind);
		CHECK(rc == 0 && wait_wc(b.cq, &wc) == 1 && wc.wr_id == 42 &&
			      wc.status == IBV_WC_SUCCESS,
		      "bind_mw of length 0 unbinds");
		CHECK(ibv_dealloc_mw(mw) == 0 && ibv_dealloc_mw(mw2) == 0, "dealloc_mw");

		/* ibv_rereg_mr: libibverbs' own input checks (-1), the
		 * kernel's (-4), and the changes themselves. */
		errno = 0;
		rc = ibv_rereg_mr(wmr, 8, NULL, NULL, 0, 0);
		CHECK(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
		      "rereg_mr with an unknown flag: ERR_INPUT, EINVAL (%d)", rc);
		rc = ibv_rereg_mr(wmr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0);
		CHECK(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
		      "rereg_mr translation without an address: ERR_INPUT, EINVAL (%d)", rc);
		rc = ibv_rereg_mr(wmr, IBV_REREG_MR_CHANGE_PD, b.pd, NULL, 0,
				  IBV_ACCESS_LOCAL_WRITE);
		CHECK(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
		      "rereg_mr with access but no CHANGE_ACCESS: ERR_INPUT, EINVAL (%d)", rc);
		rc = ibv_rereg_mr(wmr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
				  IBV_ACCESS_REMOTE_WRITE);
		CHECK(rc == IBV_REREG_MR_ERR_CMD && errno == EINVAL,
		      "rereg_mr to remote write without local write: ERR_CMD, EINVAL (%d)", rc);
		rc = ibv_rereg_mr(wmr, IBV_REREG_MR_CHANGE_PD, a.pd, NULL, 0, 0);
		CHECK(rc == IBV_REREG_MR_ERR_CMD && errno == EINVAL,
		      "rereg_mr to a PD of another context: ERR_CMD, EINVAL (%d)", rc);
		uint32_t lk = wmr->lkey, rk = wmr->rkey;
		rc = ibv_rereg_mr(wmr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		MUST(post_write(&a, a.mr->lkey, (uintptr_t)wbuf, wmr->rkey, 43) == 0);
		CHECK(rc == 0 && wmr->lkey == lk && wmr->rkey == rk && wait_wc(a.cq, &wc) == 1 &&
			      wc.status == IBV_WC_SUCCESS && strcmp(wbuf, "through a window") == 0,
		      "rereg_mr access: same keys, remote write now allowed");
		char *nbuf = aligned_alloc(4096, BUF);
		MUST(nbuf);
		memset(nbuf, 0, BUF);
		rc = ibv_rereg_mr(wmr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, nbuf, BUF, 0);
		strcpy(a.buf, "moved");
		MUST(post_write(&a, a.mr->lkey, (uintptr_t)nbuf, wmr->rkey, 44) == 0);
		CHECK(rc == 0 && wmr->addr == nbuf && wait_wc(a.cq, &wc) == 1 &&
			      wc.status == IBV_WC_SUCCESS && strcmp(nbuf, "moved") == 0 &&
			      strcmp(wbuf, "through a window") == 0,
		      "rereg_mr translation: writes land in the new memory");
		CHECK(ibv_dereg_mr(wmr) == 0, "dereg_mr once the windows are gone");
		free(wbuf);
		free(nbuf);
	}

	MUST(post_write(&a, a.mr->lkey ^ 0x5a5a5a5a, (uintptr_t)b.buf,
			b.mr->rkey, 11) == 0);
	CHECK(wait_wc(a.cq, &wc) == 1 && wc.wr_id == 11 &&
		      wc.status == IBV_WC_LOC_PROT_ERR,
	      "WRITE with a bad lkey: %s", ibv_wc_status_str(wc.status));

	/* The QP is in error now: reset and reconnect (both sides). */
	for (struct side *s = &a; s; s = s == &a ? &b : NULL) {
		MUST(ibv_modify_qp(s->qp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RESET },
				   IBV_QP_STATE) == 0);
		while (ibv_poll_cq(s->cq, 1, &wc) > 0)
			;
	}
	connect_pair(&a, &b);
	MUST(post_write(&a, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey ^ 0x1234, 12) == 0);
	CHECK(wait_wc(a.cq, &wc) == 1 && wc.wr_id == 12 &&
		      wc.status == IBV_WC_REM_ACCESS_ERR,
	      "WRITE with a bad rkey: %s", ibv_wc_status_str(wc.status));
	MUST(post_write(&a, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey, 13) == 0);
	CHECK(wait_wc(a.cq, &wc) == 1 && wc.wr_id == 13 &&
		      wc.status == IBV_WC_WR_FLUSH_ERR,
	      "WR posted after the error: %s", ibv_wc_status_str(wc.status));
	struct pollfd afd = { .fd = b.ctx->async_fd, .events = POLLIN };
	CHECK(poll(&afd, 1, 5000) == 1 && (afd.revents & POLLIN),
	      "async_fd readable while events wait (poll)");
	struct ibv_async_event ev;
	rc = ibv_get_async_event(b.ctx, &ev); /* PORT_ACTIVE first */
	while (rc == 0 && ev.event_type == IBV_EVENT_PORT_ACTIVE) {
		ibv_ack_async_event(&ev);
		rc = ibv_get_async_event(b.ctx, &ev);
	}
	CHECK(rc == 0 && ev.event_type == IBV_EVENT_QP_ACCESS_ERR &&
		      ev.element.qp == b.qp,
	      "responder's async event: %s on its QP",
	      ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	MUST(fcntl(b.ctx->async_fd, F_SETFL,
		   fcntl(b.ctx->async_fd, F_GETFL) | O_NONBLOCK) == 0);
	int drained = 0;
	while ((rc = ibv_get_async_event(b.ctx, &ev)) == 0 && drained < 100) {
		ibv_ack_async_event(&ev);
		drained++;
	}
	CHECK(rc == -1 && errno == EAGAIN,
	      "O_NONBLOCK async_fd drained: -1, EAGAIN (%d) after %d more", errno, drained);

	/* ---- the ibv_wr_* API and ibv_cq_ex polling */
	struct ibv_cq_init_attr_ex cqa = { .cqe = 16,
					   .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(a.ctx, &cqa);
	CHECK(cqx != NULL, "create_cq_ex through verbs_context");
	{
		/* Every function pointer of the ibv_cq_ex is set. */
		void *fns[] = { cqx->start_poll, cqx->next_poll, cqx->end_poll,
				cqx->read_opcode, cqx->read_vendor_err, cqx->read_byte_len,
				cqx->read_imm_data, cqx->read_qp_num, cqx->read_src_qp,
				cqx->read_wc_flags, cqx->read_slid, cqx->read_sl,
				cqx->read_dlid_path_bits, cqx->read_completion_ts,
				cqx->read_cvlan, cqx->read_flow_tag, cqx->read_tm_info,
				cqx->read_completion_wallclock_ns };
		unsigned nulls = 0;
		for (unsigned i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
			nulls += fns[i] == NULL;
		CHECK(nulls == 0, "no null function pointer in ibv_cq_ex (%u null)", nulls);
	}
	struct ibv_qp_init_attr_ex qxa = {
		.send_cq = ibv_cq_ex_to_cq(cqx), .recv_cq = ibv_cq_ex_to_cq(cqx),
		.cap = { 16, 16, 1, 1, 64 }, .qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = a.pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND,
	};
	/* A provider never accepts what it cannot do: operations uroce lacks,
	 * or that the transport lacks, are EOPNOTSUPP at creation. */
	{
		static const struct { int type; uint64_t ops; const char *what; } no[] = {
			{ IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_WRITE, "UC atomic write" },
			{ IBV_QPT_UC, 1ULL << 11, "UC flush (IBV_QP_EX_WITH_FLUSH of rdma-core 45)" },
			{ IBV_QPT_UD, IBV_QP_EX_WITH_BIND_MW, "UD bind MW" },
			{ IBV_QPT_RC, IBV_QP_EX_WITH_TSO, "RC TSO" },
			{ IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ, "UC RDMA READ" },
			{ IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE, "UD RDMA WRITE" },
		};
		for (unsigned i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
			struct ibv_qp_init_attr_ex na = qxa;
			na.qp_type = no[i].type;
			na.send_ops_flags = IBV_QP_EX_WITH_SEND | no[i].ops;
			errno = 0;
			struct ibv_qp *nq = ibv_create_qp_ex(a.ctx, &na);
			CHECK(!nq && errno == EOPNOTSUPP,
			      "create_qp_ex asking for %s: NULL, errno EOPNOTSUPP (%d)",
			      no[i].what, errno);
			if (nq)
				ibv_destroy_qp(nq);
		}
	}
	{
		struct ibv_qp_init_attr_ex ma = qxa;
		ma.send_ops_flags |= IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV |
				     IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_ATOMIC_WRITE |
				     (1ULL << 11) /* IBV_QP_EX_WITH_FLUSH */;
		struct ibv_qp *mq = ibv_create_qp_ex(a.ctx, &ma);
		CHECK(mq != NULL, "create_qp_ex with BIND_MW, LOCAL_INV, SEND_WITH_INV, "
				  "ATOMIC_WRITE and FLUSH");
		if (mq)
			ibv_destroy_qp(mq);
	}
	struct ibv_qp *xqp = ibv_create_qp_ex(a.ctx, &qxa);
	CHECK(xqp != NULL, "create_qp_ex with send_ops_flags");
	{
		/* Every function pointer of the ibv_qp_ex is set. */
		struct ibv_qp_ex *q = ibv_qp_to_qp_ex(xqp);
		void *fns[] = { q->wr_atomic_cmp_swp, q->wr_atomic_fetch_add, q->wr_bind_mw,
				q->wr_local_inv, q->wr_rdma_read, q->wr_rdma_write,
				q->wr_rdma_write_imm, q->wr_send, q->wr_send_imm, q->wr_send_inv,
				q->wr_send_tso, q->wr_set_ud_addr, q->wr_set_xrc_srqn,
				q->wr_set_inline_data, q->wr_set_inline_data_list, q->wr_set_sge,
				q->wr_set_sge_list, q->wr_start, q->wr_complete, q->wr_abort,
				q->wr_atomic_write };
		unsigned nulls = 0;
		for (unsigned i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
			nulls += fns[i] == NULL;
		CHECK(nulls == 0, "no null function pointer in ibv_qp_ex (%u null)", nulls);
	}
	struct ibv_qp *oldqp = a.qp;
	a.qp = xqp;
	MUST(ibv_modify_qp(b.qp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RESET },
			   IBV_QP_STATE) == 0);
	while (ibv_poll_cq(b.cq, 1, &wc) > 0)
		;
	connect_pair(&a, &b);
	struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(xqp);
	strcpy(a.buf + 100, "written by ibv_wr_rdma_write");
	ibv_wr_start(qpx);
	qpx->wr_id = 77;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qpx, b.mr->rkey, (uintptr_t)b.buf + 200);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)a.buf + 100, 29);
	qpx->wr_id = 78;
	ibv_wr_rdma_write(qpx, b.mr->rkey, (uintptr_t)b.buf + 300);
	ibv_wr_set_inline_data(qpx, "inline!", 8);
	rc = ibv_wr_complete(qpx);
	CHECK(rc == 0, "ibv_wr_complete: %d", rc);
	int got = 0, ok = 1;
	time_t end = time(NULL) + 5;
	while (got < 2 && time(NULL) < end) {
		struct ibv_poll_cq_attr pca = { 0 };
		if (ibv_start_poll(cqx, &pca) != 0)
			continue;
		do {
			ok &= cqx->status == IBV_WC_SUCCESS &&
			      cqx->wr_id == (uint64_t)(77 + got) &&
			      ibv_wc_read_opcode(cqx) == IBV_WC_RDMA_WRITE &&
			      ibv_wc_read_qp_num(cqx) == xqp->qp_num;
			got++;
		} while (ibv_next_poll(cqx) == 0);
		ibv_end_poll(cqx);
	}
	CHECK(got == 2 && ok && strcmp(b.buf + 200, "written by ibv_wr_rdma_write") == 0 &&
		      strcmp(b.buf + 300, "inline!") == 0,
	      "two WRITEs by ibv_wr_*, completions by ibv_start_poll/next_poll, data arrived");
	/* rxe's provider: a list or inline data past the QP's capabilities
	 * is ENOSPC from ibv_wr_complete, found before anything is read. */
	ibv_wr_start(qpx);
	ibv_wr_rdma_write(qpx, b.mr->rkey, (uintptr_t)b.buf + 400);
	ibv_wr_set_sge_list(qpx, qxa.cap.max_send_sge + 1, (struct ibv_sge *)8);
	rc = ibv_wr_complete(qpx);
	CHECK(rc == ENOSPC, "ibv_wr_set_sge_list past max_send_sge, wild list: ENOSPC (%d)", rc);
	ibv_wr_start(qpx);
	ibv_wr_rdma_write(qpx, b.mr->rkey, (uintptr_t)b.buf + 400);
	ibv_wr_set_inline_data(qpx, a.buf, qxa.cap.max_inline_data + 1);
	rc = ibv_wr_complete(qpx);
	CHECK(rc == ENOSPC, "ibv_wr_set_inline_data past max_inline_data (%u): ENOSPC (%d)",
	      qxa.cap.max_inline_data, rc);
	struct ibv_data_buf dbl[3] = { { a.buf, qxa.cap.max_inline_data },
				       { a.buf, 1 }, { (void *)8, 1 << 30 } };
	ibv_wr_start(qpx);
	ibv_wr_rdma_write(qpx, b.mr->rkey, (uintptr_t)b.buf + 400);
	ibv_wr_set_inline_data_list(qpx, 3, dbl);
	rc = ibv_wr_complete(qpx);
	CHECK(rc == ENOSPC, "ibv_wr_set_inline_data_list past max_inline_data: ENOSPC (%d)", rc);
	ibv_wr_start(qpx);
	qpx->wr_id = 79;
	ibv_wr_rdma_write(qpx, b.mr->rkey, (uintptr_t)b.buf + 400);
	ibv_wr_set_inline_data_list(qpx, 2, (struct ibv_data_buf[]){ { "aga", 3 }, { "in", 3 } });
	rc = ibv_wr_complete(qpx);
	got = 0;
	end = time(NULL) + 5;
	while (!got && time(NULL) < end) {
		struct ibv_poll_cq_attr pca = { 0 };
		if (ibv_start_poll(cqx, &pca) != 0)
			continue;
		got = cqx->wr_id == 79 && cqx->status == IBV_WC_SUCCESS ? 1 : -1;
		ibv_end_poll(cqx);
	}
	CHECK(rc == 0 && got == 1 && strcmp(b.buf + 400, "again") == 0,
	      "a valid ibv_wr_* batch after the refused ones (%d), data arrived", rc);
	ibv_wr_start(qpx);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)a.buf, 8); /* no WR started */
	rc = ibv_wr_complete(qpx);
	CHECK(rc == EINVAL, "ibv_wr_set_sge before any WR: wr_complete EINVAL (%d)", rc);
	{
		/* RDMA ATOMIC WRITE: the 8 bytes land as one store, completion
		 * IBV_WC_ATOMIC_WRITE. */
		struct ibv_wc w;
		uint8_t aw[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
		ibv_wr_start(qpx);
		qpx->wr_id = 81;
		qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_atomic_write(qpx, b.mr->rkey, (uintptr_t)b.buf + 512, aw);
		rc = ibv_wr_complete(qpx);
		int n = rc == 0 ? wait_wc(ibv_cq_ex_to_cq(cqx), &w) : 0;
		CHECK(n == 1 && w.wr_id == 81 && w.status == IBV_WC_SUCCESS &&
			      w.opcode == IBV_WC_ATOMIC_WRITE && w.byte_len == 8 &&
			      memcmp(b.buf + 512, aw, 8) == 0,
		      "ibv_wr_atomic_write: %s, opcode %d, the bytes arrived",
		      n ? ibv_wc_status_str(w.status) : "no completion", n ? (int)w.opcode : -1);
		/* ibv_wr_flush sits where rdma-core 45 appended it to
		 * ibv_qp_ex (this verbs.h is 44's). FLUSH needs
		 * IBV_ACCESS_FLUSH_GLOBAL (1 << 8, rdma-core 45) on the remote
		 * QP and region. */
		enum { FLUSH_GLOBAL = 1 << 8 };
		typedef void (*flush_fn)(struct ibv_qp_ex *, uint32_t, uint64_t, size_t,
					 uint8_t, uint8_t);
		flush_fn fl = *(flush_fn *)((char *)qpx + sizeof(struct ibv_qp_ex));
		CHECK(fl != NULL, "ibv_qp_ex's wr_flush slot (rdma-core 45) is set");
		errno = 0;
		struct ibv_mr *pmr = ibv_reg_mr(b.pd, b.buf, BUF, IBV_ACCESS_LOCAL_WRITE | (1 << 9));
		CHECK(!pmr && errno == EOPNOTSUPP,
		      "reg_mr with IBV_ACCESS_FLUSH_PERSISTENT: NULL, EOPNOTSUPP (%d)", errno);
		struct ibv_mr *fmr = ibv_reg_mr(b.pd, b.buf, BUF,
						IBV_ACCESS_LOCAL_WRITE | FLUSH_GLOBAL);
		struct ibv_qp_attr fa = { .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
							     IBV_ACCESS_REMOTE_READ | FLUSH_GLOBAL };
		MUST(fmr && ibv_modify_qp(b.qp, &fa, IBV_QP_ACCESS_FLAGS) == 0);
		if (fl) {
			ibv_wr_start(qpx);
			qpx->wr_id = 82;
			fl(qpx, fmr->rkey, (uintptr_t)b.buf + 64, 64, 1 /* GLOBAL */, 0 /* RANGE */);
			rc = ibv_wr_complete(qpx);
			n = rc == 0 ? wait_wc(ibv_cq_ex_to_cq(cqx), &w) : 0;
			CHECK(n == 1 && w.wr_id == 82 && w.status == IBV_WC_SUCCESS &&
				      w.opcode == 8 /* IBV_WC_FLUSH */ && w.byte_len == 64,
			      "ibv_wr_flush of a range: %s, opcode %d, byte_len %u",
			      n ? ibv_wc_status_str(w.status) : "no completion",
			      n ? (int)w.opcode : -1, n ? w.byte_len : 0);
		}
		MUST(ibv_dereg_mr(fmr) == 0);
	}
	ibv_wr_start(qpx);
	ibv_wr_bind_mw(qpx, NULL, 0, NULL);
	rc = ibv_wr_complete(qpx);
	CHECK(rc == EINVAL, "ibv_wr_bind_mw of no window: wr_complete EINVAL (%d)", rc);

	/* ---- UD through the ibv_wr_* API: address handle, immediate data in
	 * network order, the GRH area, an AH back to the sender */
	{
		struct ibv_qp_init_attr_ex ua = {
			.send_cq = ibv_cq_ex_to_cq(cqx), .recv_cq = ibv_cq_ex_to_cq(cqx),
			.cap = { 8, 8, 1, 1, 0 }, .qp_type = IBV_QPT_UD,
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.pd = a.pd, .send_ops_flags = IBV_QP_EX_WITH_SEND_WITH_IMM,
		};
		struct ibv_qp *us = ibv_create_qp_ex(a.ctx, &ua);
		struct ibv_qp_init_attr ra = { .send_cq = b.cq, .recv_cq = b.cq,
					       .cap = { 8, 8, 1, 1, 0 },
					       .qp_type = IBV_QPT_UD };
		struct ibv_qp *ur = ibv_create_qp(b.pd, &ra);
		MUST(us && ur);
		for (int i = 0; i < 2; i++) {
			struct ibv_qp *q = i ? ur : us;
			struct ibv_qp_attr x = { .qp_state = IBV_QPS_INIT, .port_num = 1,
						 .qkey = 0x11111111 };
			MUST(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
						       IBV_QP_PORT | IBV_QP_QKEY) == 0);
			x.qp_state = IBV_QPS_RTR;
			MUST(ibv_modify_qp(q, &x, IBV_QP_STATE) == 0);
			x.qp_state = IBV_QPS_RTS;
			x.sq_psn = 0;
			MUST(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
		}
		struct ibv_ah_attr aha = { .is_global = 0, .port_num = 1 };
		errno = 0;
		CHECK(!ibv_create_ah(a.pd, &aha) && errno == EINVAL,
		      "create_ah without a GRH on RoCE: NULL, EINVAL (%d)", errno);
		aha.is_global = 1;
		aha.grh.dgid = b.gid;
		aha.grh.hop_limit = 64;
		struct ibv_ah *ah = ibv_create_ah(a.pd, &aha);
		CHECK(ah != NULL, "create_ah to the peer's GID");
		struct ibv_sge rs = { (uintptr_t)b.buf + 1024, 40 + 16, b.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 55, .sg_list = &rs, .num_sge = 1 },
				   *rb;
		MUST(ibv_post_recv(ur, &rw, &rb) == 0);
		strcpy(a.buf + 512, "ud datagram");
		struct ibv_qp_ex *ux = ibv_qp_to_qp_ex(us);
		ibv_wr_start(ux);
		ux->wr_id = 56;
		ux->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send_imm(ux, htobe32(0x01020304));
		ibv_wr_set_ud_addr(ux, ah, ur->qp_num, 0x11111111);
		ibv_wr_set_sge(ux, a.mr->lkey, (uintptr_t)a.buf + 512, 12);
		CHECK(ibv_wr_complete(ux) == 0, "UD SEND with immediate by ibv_wr_*");
		struct ibv_wc rwc;
		int got_r = wait_wc(b.cq, &rwc);
		CHECK(got_r == 1 && rwc.status == IBV_WC_SUCCESS && rwc.wr_id == 55 &&
			      rwc.opcode == IBV_WC_RECV && rwc.byte_len == 40 + 12 &&
			      (rwc.wc_flags & IBV_WC_GRH) && (rwc.wc_flags & IBV_WC_WITH_IMM) &&
			      be32toh(rwc.imm_data) == 0x01020304 &&
			      rwc.src_qp == us->qp_num &&
			      strcmp(b.buf + 1024 + 40, "ud datagram") == 0,
		      "UD receive: GRH + data, imm_data in network order (%08x), src_qp",
		      be32toh(rwc.imm_data));
		struct ibv_ah_attr back;
		rc = ibv_init_ah_from_wc(b.ctx, 1, &rwc,
					 (struct ibv_grh *)(b.buf + 1024), &back);
		CHECK(rc == 0 && back.is_global &&
			      memcmp(&back.grh.dgid, &a.gid, 16) == 0,
		      "init_ah_from_wc: the GRH names the sender's GID");
		struct ibv_ah *bah = ibv_create_ah_from_wc(
			b.pd, &rwc, (struct ibv_grh *)(b.buf + 1024), 1);
		CHECK(bah != NULL, "create_ah_from_wc");
		struct ibv_poll_cq_attr pca = { 0 };
		time_t end2 = time(NULL) + 5;
		int sc = 0;
		while (!sc && time(NULL) < end2) {
			if (ibv_start_poll(cqx, &pca) == 0) {
				sc = cqx->wr_id == 56 && cqx->status == IBV_WC_SUCCESS ? 1 : -1;
				ibv_end_poll(cqx);
			}
		}
		CHECK(sc == 1, "UD send completion");
		rc = ibv_dealloc_pd(b.pd);
		CHECK(rc == EBUSY, "dealloc_pd with an AH: EBUSY (%d)", rc);
		MUST(ibv_destroy_ah(bah) == 0 && ibv_destroy_ah(ah) == 0);
		MUST(ibv_destroy_qp(us) == 0 && ibv_destroy_qp(ur) == 0);
	}

	/* ---- a completion channel's fd in poll(2) */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(b.ctx);
	MUST(ch);
	struct ibv_cq *ccq = ibv_create_cq(b.ctx, 16, &ch, ch, 0);
	MUST(ccq);
	CHECK(!(fcntl(ch->fd, F_GETFL) & O_NONBLOCK),
	      "channel fd is blocking, as libibverbs hands it out");
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 0) == 0, "channel fd not readable before an event");
	MUST(ibv_req_notify_cq(ccq, 0) == 0);
	struct ibv_qp_init_attr cqa2 = { .send_cq = ccq, .recv_cq = ccq,
					 .cap = { 4, 4, 1, 1, 0 },
					 .qp_type = IBV_QPT_RC };
	struct ibv_qp *cqp;
	MUST(cqp = ibv_create_qp(b.pd, &cqa2));
	struct ibv_qp *bqp = b.qp;
	b.qp = cqp;
	MUST(ibv_modify_qp(xqp, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RESET },
			   IBV_QP_STATE) == 0);
	connect_pair(&a, &b);
	MUST(post_write(&b, b.mr->lkey, (uintptr_t)a.buf, a.mr->rkey, 90) == 0);
	CHECK(poll(&pfd, 1, 5000) == 1 && (pfd.revents & POLLIN),
	      "channel fd readable after a completion (poll)");
	struct ibv_cq *evcq;
	void *evctx;
	rc = ibv_get_cq_event(ch, &evcq, &evctx);
	CHECK(rc == 0 && evcq == ccq && evctx == &ch,
	      "get_cq_event names the CQ and its cq_context");
	rc = ibv_destroy_cq(ccq);
	CHECK(rc == EBUSY, "destroy_cq with an unacknowledged event: EBUSY (%d)", rc);
	ibv_ack_cq_events(ccq, 1);
	MUST(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	errno = 0;
	rc = ibv_get_cq_event(ch, &evcq, &evctx);
	CHECK(rc == -1 && errno == EAGAIN,
	      "get_cq_event on an O_NONBLOCK channel with no event: -1, EAGAIN (%d)", errno);

	/* ---- RNR: a SEND that finds no receive, with rnr_retry 0 */
	{
		struct ibv_qp *s1 = rc_qp(&a), *r1 = rc_qp(&b);
		MUST(s1 && r1 && to_init(s1) == 0 && to_init(r1) == 0);
		MUST(to_rtr(s1, r1->qp_num, &b.gid, 1) == 0);
		MUST(to_rtr(r1, s1->qp_num, &a.gid, 1) == 0);
		MUST(to_rts_rnr(s1, 0) == 0 && to_rts(r1) == 0);
		while (ibv_poll_cq(a.cq, 1, &wc) > 0)
			;
		struct ibv_sge ss = { (uintptr_t)a.buf, 8, a.mr->lkey };
		struct ibv_send_wr sw = { .wr_id = 95, .sg_list = &ss, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED },
				   *sb;
		MUST(ibv_post_send(s1, &sw, &sb) == 0);
		CHECK(wait_wc(a.cq, &wc) == 1 && wc.wr_id == 95 &&
			      wc.status == IBV_WC_RNR_RETRY_EXC_ERR,
		      "SEND without a receive, rnr_retry 0: %s",
		      ibv_wc_status_str(wc.status));
		MUST(ibv_destroy_qp(s1) == 0 && ibv_destroy_qp(r1) == 0);
	}

	/* ---- SRQ resize (IBV_DEVICE_SRQ_RESIZE, as rxe): ibv_modify_srq with
	 * IBV_SRQ_MAX_WR grows it in place; below what is posted, EINVAL */
	{
		struct ibv_device_attr da;
		MUST(ibv_query_device(a.ctx, &da) == 0);
		CHECK(da.device_cap_flags & IBV_DEVICE_SRQ_RESIZE,
		      "device_cap_flags has IBV_DEVICE_SRQ_RESIZE");
		struct ibv_srq_init_attr sia = { .attr = { .max_wr = 4, .max_sge = 1 } };
		struct ibv_srq *srq = ibv_create_srq(a.pd, &sia);
		MUST(srq);
		struct ibv_sge rs = { (uintptr_t)a.buf, 64, a.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rb;
		int posted = 0;
		while (ibv_post_srq_recv(srq, &rw, &rb) == 0 && posted < 16)
			posted++;
		CHECK(posted == 4, "a 4-WR SRQ takes 4 (%d)", posted);
		struct ibv_srq_attr sa = { .max_wr = 8 };
		rc = ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR);
		CHECK(rc == 0, "modify_srq(IBV_SRQ_MAX_WR 8): %d", rc);
		memset(&sa, 0, sizeof(sa));
		MUST(ibv_query_srq(srq, &sa) == 0);
		CHECK(sa.max_wr >= 8, "query_srq after the resize: max_wr %u", sa.max_wr);
		posted = 0;
		while (ibv_post_srq_recv(srq, &rw, &rb) == 0 && posted < 16)
			posted++;
		CHECK(posted == (int)sa.max_wr - 4, "the grown SRQ takes %u more (%d)",
		      sa.max_wr - 4, posted);
		sa.max_wr = 2;
		rc = ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR);
		CHECK(rc == EINVAL, "modify_srq below the WRs posted: EINVAL (%d)", rc);
		MUST(ibv_destroy_srq(srq) == 0);
	}

	/* ---- UD: an RDMA READ (its union holds an RDMA address, no address
	 * handle) and a send longer than the MTU are posted, as on rxe and
	 * NICs, and complete with LOC_QP_OP_ERR and LOC_LEN_ERR; the QP is in
	 * SQE after each (IBA), back to RTS by a modify */
	{
		struct ibv_cq *ucq = ibv_create_cq(a.ctx, 16, NULL, NULL, 0);
		struct ibv_qp_init_attr ua = { .send_cq = ucq, .recv_cq = ucq,
					       .cap = { 8, 8, 1, 1, 0 },
					       .qp_type = IBV_QPT_UD };
		struct ibv_qp *uq = ucq ? ibv_create_qp(a.pd, &ua) : NULL;
		MUST(uq);
		struct ibv_qp_attr x = { .qp_state = IBV_QPS_INIT, .port_num = 1,
					 .qkey = 0x11111111 };
		MUST(ibv_modify_qp(uq, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
						    IBV_QP_PORT | IBV_QP_QKEY) == 0);
		x.qp_state = IBV_QPS_RTR;
		MUST(ibv_modify_qp(uq, &x, IBV_QP_STATE) == 0);
		x.qp_state = IBV_QPS_RTS;
		MUST(ibv_modify_qp(uq, &x, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
		struct ibv_port_attr pa;
		MUST(ibv_query_port(a.ctx, 1, &pa) == 0);
		int mtu = 128 << pa.active_mtu;
		struct ibv_ah_attr aha = { .is_global = 1, .port_num = 1,
					   .grh = { .dgid = b.gid, .hop_limit = 64 } };
		struct ibv_ah *ah = ibv_create_ah(a.pd, &aha);
		MUST(ah);
		char *big = aligned_alloc(4096, 2 * mtu);
		struct ibv_mr *bmr = big ? ibv_reg_mr(a.pd, big, 2 * mtu,
						      IBV_ACCESS_LOCAL_WRITE) : NULL;
		MUST(bmr);
		for (int i = 0; i < 2; i++) {
			struct ibv_sge ss = { (uintptr_t)big, i ? 8 : mtu + 1, bmr->lkey };
			struct ibv_send_wr sw = { .wr_id = 300 + i, .sg_list = &ss,
						  .num_sge = 1,
						  .send_flags = IBV_SEND_SIGNALED },
					   *sb;
			if (i) {
				sw.opcode = IBV_WR_RDMA_READ;
				sw.wr.rdma.remote_addr = (uintptr_t)b.buf;
				sw.wr.rdma.rkey = b.mr->rkey;
			} else {
				sw.opcode = IBV_WR_SEND;
				sw.wr.ud.ah = ah;
				sw.wr.ud.remote_qpn = 1;
				sw.wr.ud.remote_qkey = 0x11111111;
			}
			rc = ibv_post_send(uq, &sw, &sb);
			enum ibv_wc_status want = i ? IBV_WC_LOC_QP_OP_ERR : IBV_WC_LOC_LEN_ERR;
			int got = rc == 0 ? wait_wc(ucq, &wc) : 0;
			struct ibv_qp_init_attr qi;
			struct ibv_qp_attr qa;
			MUST(ibv_query_qp(uq, &qa, IBV_QP_STATE, &qi) == 0);
			CHECK(rc == 0 && got == 1 && wc.wr_id == 300u + i && wc.status == want &&
				      qa.qp_state == IBV_QPS_SQE,
			      "UD %s: posted (%d), %s, QP state %d", i ? "RDMA READ" : "SEND > MTU",
			      rc, got == 1 ? ibv_wc_status_str(wc.status) : "no completion",
			      qa.qp_state);
			x.qp_state = IBV_QPS_RTS;
			MUST(ibv_modify_qp(uq, &x, IBV_QP_STATE) == 0);
		}
		MUST(ibv_destroy_qp(uq) == 0 && ibv_destroy_ah(ah) == 0 &&
		     ibv_destroy_cq(ucq) == 0 && ibv_dereg_mr(bmr) == 0);
		free(big);
	}

	/* ---- teardown in the right order succeeds */
	MUST(ibv_destroy_qp(cqp) == 0 && ibv_destroy_qp(bqp) == 0);
	MUST(ibv_destroy_qp(xqp) == 0 && ibv_destroy_qp(oldqp) == 0);
	CHECK(ibv_destroy_cq(ccq) == 0, "destroy_cq once acknowledged and unused");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy_comp_channel");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0, "destroy the ibv_cq_ex");
	for (struct side *s = &a; s; s = s == &a ? &b : NULL) {
		MUST(ibv_dereg_mr(s->mr) == 0);
		MUST(ibv_destroy_cq(s->cq) == 0);
		MUST(ibv_dealloc_pd(s->pd) == 0);
		MUST(ibv_close_device(s->ctx) == 0);
	}
	ibv_free_device_list(list);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
