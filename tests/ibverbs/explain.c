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

#include "check_pair.h"

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

	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 16, 8);

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
			      "sent NAK remote access error (syndrome 0x62) for PSN 0x000000",
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
