/*
 * Errors that explain themselves, as a C program sees them on uroce's
 * libibverbs (compiled against Debian's <infiniband/verbs.h>, run with
 * LD_LIBRARY_PATH=$(uroce libdir) and UROCE_EXPLAIN=1): an RDMA WRITE
 * with a wrong rkey completes with IBV_WC_REM_ACCESS_ERR, and stderr
 * holds one line for each side: the requester's names the peer, the NAK's
 * syndrome and PSN and the rkey it asked; the responder's names the rkey,
 * va and len, the check that failed and the NAK it sent. A WR posted
 * afterwards is flushed, and its line says why the QP is in ERR.
 *
 * Two devices in one process: UROCE_DEVICES names them (the matrix sets
 * 127.118.1.1 and 127.118.1.2). The program sends its own stderr to a
 * temporary file and reads it back. Prints one line per check and
 * "N passed, N failed"; exits non-zero on a failure.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static void open_side(struct side *s, struct ibv_device *dev, int access)
{
	MUST(s->ctx = ibv_open_device(dev));
	MUST(s->pd = ibv_alloc_pd(s->ctx));
	MUST(s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0));
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	MUST(s->qp = ibv_create_qp(s->pd, &ia));
	MUST(posix_memalign((void **)&s->buf, 4096, BUF) == 0);
	memset(s->buf, 0, BUF);
	MUST(s->mr = ibv_reg_mr(s->pd, s->buf, BUF, access));
	MUST(ibv_query_gid(s->ctx, 1, 1, &s->gid) == 0);
}

static void rc_up(struct side *s, struct side *p)
{
	int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
		  IBV_ACCESS_REMOTE_READ;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = all };
	MUST(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				 IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	struct ibv_qp_attr r = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = p->qp->qp_num, .rq_psn = 0x100,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 1,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = p->gid, .sgid_index = 1,
				      .hop_limit = 64 } },
	};
	MUST(ibv_modify_qp(s->qp, &r, IBV_QP_STATE | IBV_QP_AV |
				 IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				 IBV_QP_MIN_RNR_TIMER) == 0);
	struct ibv_qp_attr t = { .qp_state = IBV_QPS_RTS, .timeout = 14,
				 .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 0x100,
				 .max_rd_atomic = 1 };
	MUST(ibv_modify_qp(s->qp, &t, IBV_QP_STATE | IBV_QP_TIMEOUT |
				 IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
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

static struct ibv_wc write_to(struct side *a, uint64_t wr_id, uint64_t raddr,
			      uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = 64,
			       .lkey = a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge,
				  .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	MUST(ibv_post_send(a->qp, &wr, &bad) == 0);
	return wait1(a->cq);
}

/* The line of `err` (what the library wrote to stderr) that holds every
 * one of the NULL-terminated strings, or NULL. */
static const char *line_with(const char *err, const char **needles)
{
	static char line[4096];
	for (const char *p = err; *p;) {
		const char *e = strchr(p, '\n');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n >= sizeof(line))
			n = sizeof(line) - 1;
		memcpy(line, p, n);
		line[n] = 0;
		int all = 1;
		for (const char **s = needles; *s; s++)
			all &= strstr(line, *s) != NULL;
		if (all)
			return line;
		p = e ? e + 1 : p + n;
	}
	return NULL;
}

int main(void)
{
	const char *on = getenv("UROCE_EXPLAIN");
	MUST(on && strcmp(on, "1") == 0);
	/* stderr to a file this program reads back. */
	FILE *errf = tmpfile();
	MUST(errf);
	int saved = dup(2);
	MUST(saved >= 0 && dup2(fileno(errf), 2) == 2);

	int n = 0;
	struct ibv_device **devs = ibv_get_device_list(&n);
	MUST(devs && n >= 2);
	struct side a, b;
	open_side(&a, devs[0], IBV_ACCESS_LOCAL_WRITE);
	open_side(&b, devs[1], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	rc_up(&a, &b);
	rc_up(&b, &a);

	uint32_t bad_rkey = b.mr->rkey ^ 0x5a5a0000;
	uint64_t va = (uintptr_t)b.buf + 16;
	struct ibv_wc w = write_to(&a, 7, va, bad_rkey);
	CHECK(w.status == IBV_WC_REM_ACCESS_ERR,
	      "WRITE with a wrong rkey: IBV_WC_REM_ACCESS_ERR (%d)", w.status);
	struct ibv_wc f = write_to(&a, 8, va, b.mr->rkey);
	CHECK(f.status == IBV_WC_WR_FLUSH_ERR,
	      "a WR posted to the QP in ERR: IBV_WC_WR_FLUSH_ERR (%d)", f.status);
	usleep(100000); /* the responder's line, written by its engine */

	fflush(stderr);
	MUST(dup2(saved, 2) == 2);
	long len = ftell(errf);
	MUST(len >= 0);
	char *err = calloc(1, (size_t)len + 1);
	MUST(err);
	rewind(errf);
	MUST(fread(err, 1, (size_t)len, errf) == (size_t)len);
	printf("stderr of the library:\n%s", err);

	char qa[32], qb[32], rk[32], vas[40];
	snprintf(qa, sizeof(qa), "QP %#08x ", a.qp->qp_num);
	snprintf(qb, sizeof(qb), "QP %#08x ", b.qp->qp_num);
	snprintf(rk, sizeof(rk), "rkey %#x", bad_rkey);
	snprintf(vas, sizeof(vas), "va %#llx", (unsigned long long)va);
	const char *req[] = { "uroce: ", qa, "IBV_WC_REM_ACCESS_ERR (requester)",
			      "sent NAK remote access error (syndrome 0x62) for PSN 0x000100",
			      rk, vas, "len 64", NULL };
	CHECK(line_with(err, req) != NULL,
	      "the requester's line: the peer, the NAK's syndrome and PSN, the rkey asked");
	const char *resp[] = { "uroce: ", qb, "(responder)", "R_Key check", rk, vas,
			       "len 64 needs REMOTE_WRITE",
			       "no memory region has this key",
			       "NAK remote access error (syndrome 0x62) sent to", NULL };
	CHECK(line_with(err, resp) != NULL,
	      "the responder's line: rkey, va, len, the check that failed, the NAK");
	const char *flush[] = { "uroce: ", qa, "IBV_WC_WR_FLUSH_ERR",
				"it is in ERR", "IBV_WC_REM_ACCESS_ERR", NULL };
	CHECK(line_with(err, flush) != NULL,
	      "the flush's line: why the QP is in ERR");

	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
