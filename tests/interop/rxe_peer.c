/* rxe_peer.c — the kernel-rxe side of uroce's interop matrix
 * (tests/interop/run.sh), a plain libibverbs program run in the guest.
 *
 *   rxe-peer stress [-p PORT] [-n MSGS] [-m MTU] [-s SEED] [HOST]
 *       `uroce rc-stress`'s protocol (verbs-api/cli/src/stress.rs):
 *       without HOST the server (exposes a region, checks every SEND /
 *       SEND_WITH_IMM), with HOST the client (a seeded mix of SEND,
 *       SEND_WITH_IMM, RDMA WRITE, WRITE_WITH_IMM, READ, compare-swap and
 *       fetch-add, one at a time; READ and atomic results checked against
 *       a shadow copy, the whole region read back at the end).
 *   rxe-peer badrkey|rnr|mw [-p PORT] [-o write|read] [HOST]
 *       the error scenarios, facing the interop-peer example
 *       (tests/interop/peer.rs), which speaks the same protocol: the TCP
 *       server is the responder, the client the requester.
 *         badrkey: the requester's RDMA WRITE or READ carries a bad rkey;
 *                  it must complete with REM_ACCESS_ERR, and the
 *                  responder's QP go to ERR with its posted receive
 *                  flushed (the asynchronous events it raised are reported).
 *         rnr:     the requester SENDs before the responder posts a
 *                  receive (rnr_retry 7); the SEND completes with success
 *                  and the right data once the receive is posted.
 *         mw:      the responder binds a type 2 memory window; the
 *                  requester WRITEs through it, invalidates it with SEND
 *                  with Invalidate, and WRITEs through it again
 *                  (REM_ACCESS_ERR).
 * The RoCEv2 GID is index 1 (rxe's ::ffff:a.b.c.d); the peer's GID is its
 * IPv4 address mapped. Every wait is bounded. Exit 0 = all checks passed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DATA (1u << 20)
#define WORDS 64
#define MAX_SEND (16u << 10)
#define RECV_SLOTS 128
#define END_MARK UINT64_MAX
#define TIMEOUT_MS 15000
#define ALL_ACCESS                                                              \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
	 IBV_ACCESS_REMOTE_ATOMIC)

static int gid_idx = 1;
static int port = 18516;
static const char *me = "rxe-peer";

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s: ", me);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ---- TCP lines ---- */

static int tcp_fd = -1;
static char peer_ip[64], my_ip[64];

static void tcp_server(void)
{
	int one = 1, s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	socklen_t len = sizeof(a);
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s, (void *)&a, sizeof(a)) || listen(s, 1))
		die("listen %d: %s", port, strerror(errno));
	struct pollfd p = { .fd = s, .events = POLLIN };
	if (poll(&p, 1, 60000) != 1)
		die("no client within 60 s");
	tcp_fd = accept(s, (void *)&a, &len);
	if (tcp_fd < 0)
		die("accept: %s", strerror(errno));
	close(s);
	inet_ntop(AF_INET, &a.sin_addr, peer_ip, sizeof(peer_ip));
	len = sizeof(a);
	getsockname(tcp_fd, (void *)&a, &len);
	inet_ntop(AF_INET, &a.sin_addr, my_ip, sizeof(my_ip));
}

static void tcp_client(const char *host)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	socklen_t len = sizeof(a);
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
		die("not an IPv4 address: %s", host);
	tcp_fd = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(tcp_fd, (void *)&a, sizeof(a)))
		die("connect %s:%d: %s", host, port, strerror(errno));
	snprintf(peer_ip, sizeof(peer_ip), "%s", host);
	getsockname(tcp_fd, (void *)&a, &len);
	inet_ntop(AF_INET, &a.sin_addr, my_ip, sizeof(my_ip));
}

static void put_line(const char *fmt, ...)
{
	char b[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(b, sizeof(b), fmt, ap);
	va_end(ap);
	if (write(tcp_fd, b, n) != n)
		die("exchange: write: %s", strerror(errno));
}

/* One line (without the newline); "" at EOF. Waits at most ms. */
static char *get_line(int ms)
{
	static char b[512];
	size_t n = 0;
	uint64_t end = now_ms() + ms;
	while (n < sizeof(b) - 1) {
		struct pollfd p = { .fd = tcp_fd, .events = POLLIN };
		int left = (int)(end - now_ms());
		if (left <= 0 || poll(&p, 1, left) != 1)
			die("exchange: no line within %d ms", ms);
		ssize_t r = read(tcp_fd, b + n, 1);
		if (r <= 0)
			break;
		if (b[n] == '\n')
			break;
		n++;
	}
	b[n] = 0;
	return b;
}

/* ---- verbs ---- */

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint32_t psn;
};

static struct side open_side(int recv_wr)
{
	struct side s = { 0 };
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l || n == 0)
		die("no RDMA device");
	s.ctx = ibv_open_device(l[0]);
	if (!s.ctx)
		die("cannot open %s", ibv_get_device_name(l[0]));
	s.pd = ibv_alloc_pd(s.ctx);
	s.cq = ibv_create_cq(s.ctx, 4 * RECV_SLOTS + 256, NULL, NULL, 0);
	if (!s.pd || !s.cq)
		die("cannot allocate a PD/CQ");
	struct ibv_qp_init_attr a = {
		.send_cq = s.cq,
		.recv_cq = s.cq,
		.cap = { .max_send_wr = 64, .max_recv_wr = recv_wr, .max_send_sge = 2, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	s.qp = ibv_create_qp(s.pd, &a);
	if (!s.qp)
		die("cannot create a QP: %s", strerror(errno));
	srand48(getpid() ^ time(NULL));
	s.psn = lrand48() & 0xffffff;
	struct ibv_qp_attr ia = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ALL_ACCESS };
	if (ibv_modify_qp(s.qp, &ia, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify QP to INIT: %s", strerror(errno));
	return s;
}

static enum ibv_mtu mtu_enum(unsigned m)
{
	switch (m) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	}
	die("bad MTU %u", m);
	return 0;
}

static void connect_qp(struct side *s, uint32_t rqpn, uint32_t rpsn, const char *rip, unsigned mtu, int rnr_timer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = mtu_enum(mtu),
		.dest_qp_num = rqpn,
		.rq_psn = rpsn,
		.max_dest_rd_atomic = 16,
		.min_rnr_timer = rnr_timer,
		.ah_attr = { .is_global = 1, .port_num = 1 },
	};
	struct in_addr ip4;
	if (inet_pton(AF_INET, rip, &ip4) != 1)
		die("bad peer address %s", rip);
	a.ah_attr.grh.dgid.raw[10] = 0xff;
	a.ah_attr.grh.dgid.raw[11] = 0xff;
	memcpy(&a.ah_attr.grh.dgid.raw[12], &ip4, 4);
	a.ah_attr.grh.sgid_index = gid_idx;
	a.ah_attr.grh.hop_limit = 64;
	if (ibv_modify_qp(s->qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify QP to RTR: %s", strerror(errno));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = s->psn;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(s->qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify QP to RTS: %s", strerror(errno));
}

/* One completion, or die after ms. */
static struct ibv_wc wait_wc(struct side *s, int ms, const char *what)
{
	struct ibv_wc wc;
	uint64_t end = now_ms() + ms;
	for (;;) {
		int n = ibv_poll_cq(s->cq, 1, &wc);
		if (n < 0)
			die("poll CQ failed");
		if (n == 1)
			return wc;
		if (now_ms() > end)
			die("%s: no completion within %d ms", what, ms);
	}
}

static int poll_wc(struct side *s, int ms, struct ibv_wc *wc)
{
	uint64_t end = now_ms() + ms;
	do {
		if (ibv_poll_cq(s->cq, 1, wc) == 1)
			return 1;
		usleep(1000);
	} while (now_ms() < end);
	return 0;
}

static enum ibv_qp_state qp_state(struct side *s)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(s->qp, &a, IBV_QP_STATE, &ia))
		die("query QP: %s", strerror(errno));
	return a.qp_state;
}

static const char *state_str(enum ibv_qp_state st)
{
	static const char *n[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };
	return st <= IBV_QPS_ERR ? n[st] : "?";
}

/* ---- stress (uroce rc-stress's protocol) ---- */

static uint8_t pat(uint64_t seq, size_t i)
{
	return (uint8_t)((seq * 0x9e3779b97f4a7c15ull) >> 56) ^ (uint8_t)((uint8_t)i * 31);
}

static struct ibv_mr *reg(struct side *s, size_t len, int access)
{
	void *p = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
	if (!p)
		die("out of memory");
	memset(p, 0, len);
	struct ibv_mr *mr = ibv_reg_mr(s->pd, p, len, access);
	if (!mr)
		die("ibv_reg_mr: %s", strerror(errno));
	return mr;
}

static void post_recv(struct side *s, struct ibv_mr *mr, size_t off, uint32_t len, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr + off, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(s->qp, &wr, &bad))
		die("post receive failed");
}

static int stress_server(void)
{
	struct side s = open_side(RECV_SLOTS);
	struct ibv_mr *region = reg(&s, DATA + 8 * WORDS, ALL_ACCESS);
	struct ibv_mr *slots = reg(&s, RECV_SLOTS * MAX_SEND, IBV_ACCESS_LOCAL_WRITE);
	tcp_server();
	unsigned qpn, psn, mtu;
	char ip[64] = "";
	char *l = get_line(30000);
	if (sscanf(l, "%x %x %x %63s", &qpn, &psn, &mtu, ip) < 3)
		die("exchange: bad line '%s'", l);
	connect_qp(&s, qpn, psn, ip[0] ? ip : peer_ip, mtu, 12);
	for (int i = 0; i < RECV_SLOTS; i++)
		post_recv(&s, slots, (size_t)i * MAX_SEND, MAX_SEND, i);
	put_line("%x %x %x %llx\n", s.qp->qp_num, s.psn, region->rkey, (unsigned long long)(uintptr_t)region->addr);
	uint64_t sends = 0, writes = 0, errors = 0, bytes = 0;
	for (;;) {
		struct ibv_wc wc = wait_wc(&s, TIMEOUT_MS, "server");
		if (wc.status != IBV_WC_SUCCESS)
			die("server: wr %llu completed with %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
		if (wc.opcode != IBV_WC_RECV && wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM)
			continue;
		size_t slot = wc.wr_id, len = wc.byte_len;
		if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
			writes++;
		} else {
			uint8_t *b = (uint8_t *)slots->addr + slot * MAX_SEND;
			uint64_t seq;
			if (len < 8) {
				errors++;
				fprintf(stderr, "%s: a SEND of %zu bytes\n", me, len);
			} else {
				memcpy(&seq, b, 8);
				seq = le64toh(seq);
				if (seq == END_MARK)
					break;
				if ((wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) != (uint32_t)seq) {
					errors++;
					fprintf(stderr, "%s: SEND %llu: immediate %#x\n", me, (unsigned long long)seq,
						ntohl(wc.imm_data));
				}
				for (size_t i = 8; i < len; i++)
					if (b[i] != pat(seq, i)) {
						errors++;
						fprintf(stderr, "%s: SEND %llu differs at byte %zu\n", me,
							(unsigned long long)seq, i);
						break;
					}
				sends++;
				bytes += len;
			}
		}
		post_recv(&s, slots, slot * MAX_SEND, MAX_SEND, slot);
	}
	put_line("%llu %llu %llu\n", (unsigned long long)sends, (unsigned long long)writes, (unsigned long long)errors);
	get_line(30000); /* the client closes when it has its verdict */
	printf("rxe-peer stress server: %llu sends (%llu bytes) and %llu writes with immediate received, %llu errors\n",
	       (unsigned long long)sends, (unsigned long long)bytes, (unsigned long long)writes,
	       (unsigned long long)errors);
	return errors ? 1 : 0;
}

static uint64_t rng_state;
static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}
static uint64_t rnd_range(uint64_t lo, uint64_t hi) /* inclusive */
{
	return lo + rnd() % (hi - lo + 1);
}

static int stress_client(const char *host, uint64_t messages, unsigned mtu, uint64_t seed)
{
	struct side s = open_side(1);
	struct ibv_mr *src = reg(&s, DATA + MAX_SEND, ALL_ACCESS);
	struct ibv_mr *res = reg(&s, MAX_SEND, ALL_ACCESS);
	struct ibv_mr *whole = reg(&s, DATA + 8 * WORDS, ALL_ACCESS);
	uint8_t *shadow = calloc(1, DATA + 8 * WORDS);
	uint8_t *S = src->addr, *R = res->addr;
	tcp_client(host);
	put_line("%x %x %x %s\n", s.qp->qp_num, s.psn, mtu, my_ip);
	unsigned rqpn, rpsn, rkey;
	unsigned long long raddr;
	char *l = get_line(30000);
	if (sscanf(l, "%x %x %x %llx", &rqpn, &rpsn, &rkey, &raddr) != 4)
		die("exchange: bad line '%s'", l);
	connect_qp(&s, rqpn, rpsn, peer_ip, mtu, 12);
	rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
	uint64_t n[7] = { 0 }, errors = 0, bytes = 0, write_imms = 0;
	static const char *names[7] = { "SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM",
					"RDMA_READ", "FETCH_AND_ADD", "COMPARE_AND_SWAP" };
	for (uint64_t seq = 0; seq < messages; seq++) {
		unsigned kind = rnd() % 10;
		struct ibv_sge sge = { 0 };
		struct ibv_send_wr wr = { .wr_id = seq, .sg_list = &sge, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED },
				   *bad;
		size_t len = 0, off = 0, at = 0;
		uint64_t orig = 0;
		int idx;
		if (kind <= 2) {
			len = rnd_range(8, MAX_SEND);
			uint64_t le = htole64(seq);
			memcpy(S + DATA, &le, 8);
			for (size_t i = 8; i < len; i++)
				S[DATA + i] = pat(seq, i);
			sge = (struct ibv_sge){ (uintptr_t)S + DATA, len, src->lkey };
			wr.opcode = IBV_WR_SEND;
			idx = 0;
			if (kind == 2) {
				wr.opcode = IBV_WR_SEND_WITH_IMM;
				wr.imm_data = htonl((uint32_t)seq);
				idx = 1;
			}
			bytes += len;
		} else if (kind <= 5) {
			len = rnd_range(0, 64 << 10);
			off = rnd_range(0, DATA - len);
			for (size_t i = 0; i < len; i++)
				S[off + i] = (uint8_t)rnd();
			memcpy(shadow + off, S + off, len);
			sge = (struct ibv_sge){ (uintptr_t)S + off, len, src->lkey };
			wr.opcode = kind == 5 ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
			wr.imm_data = htonl((uint32_t)seq);
			wr.wr.rdma.remote_addr = raddr + off;
			wr.wr.rdma.rkey = rkey;
			idx = kind == 5 ? 3 : 2;
			write_imms += kind == 5;
			bytes += len;
		} else if (kind <= 7) {
			len = rnd_range(0, MAX_SEND);
			off = rnd_range(0, DATA - len);
			memset(R, 0xee, len);
			sge = (struct ibv_sge){ (uintptr_t)R, len, res->lkey };
			wr.opcode = IBV_WR_RDMA_READ;
			wr.wr.rdma.remote_addr = raddr + off;
			wr.wr.rdma.rkey = rkey;
			idx = 4;
			bytes += len;
		} else {
			at = DATA + 8 * rnd_range(0, WORDS - 1);
			uint64_t now;
			memcpy(&orig, shadow + at, 8);
			sge = (struct ibv_sge){ (uintptr_t)R, 8, res->lkey };
			wr.wr.atomic.remote_addr = raddr + at;
			wr.wr.atomic.rkey = rkey;
			if (kind == 8) {
				uint64_t add = rnd_range(1, 999);
				wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
				wr.wr.atomic.compare_add = add;
				now = orig + add;
				idx = 5;
			} else {
				uint64_t swap = rnd();
				wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
				wr.wr.atomic.compare_add = (rnd() & 1) ? orig : orig ^ 1;
				wr.wr.atomic.swap = swap;
				now = wr.wr.atomic.compare_add == orig ? swap : orig;
				idx = 6;
			}
			memcpy(shadow + at, &now, 8);
		}
		if (ibv_post_send(s.qp, &wr, &bad))
			die("post %s failed", names[idx]);
		struct ibv_wc wc = wait_wc(&s, TIMEOUT_MS, names[idx]);
		if (wc.status != IBV_WC_SUCCESS || wc.wr_id != seq)
			die("%s (wr %llu) completed with %s (wr %llu)", names[idx], (unsigned long long)seq,
			    ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
		n[idx]++;
		if (idx == 4 && memcmp(R, shadow + off, len)) {
			errors++;
			fprintf(stderr, "%s: READ of %zu bytes at %zu returned other data\n", me, len, off);
		}
		if (idx >= 5) {
			uint64_t got;
			memcpy(&got, R, 8);
			if (got != orig) {
				errors++;
				fprintf(stderr, "%s: %s returned %#llx, expected %#llx\n", me, names[idx],
					(unsigned long long)got, (unsigned long long)orig);
			}
		}
	}
	/* Read the whole region back, 64 KiB at a time, each piece followed by a
	 * small SEND (counted like the others): a responder that judges
	 * progress by its completions (uroce rc-stress: 15 s) sees some while
	 * a lossy, reordering link slows the READs down. */
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	uint64_t seq = messages;
	for (size_t off = 0; off < DATA + 8 * WORDS; off += 64 << 10) {
		size_t len = DATA + 8 * WORDS - off < (64 << 10) ? DATA + 8 * WORDS - off : (64 << 10);
		sge = (struct ibv_sge){ (uintptr_t)whole->addr + off, len, whole->lkey };
		wr = (struct ibv_send_wr){ .wr_id = UINT64_MAX - 1, .sg_list = &sge, .num_sge = 1,
					   .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED };
		wr.wr.rdma.remote_addr = raddr + off;
		wr.wr.rdma.rkey = rkey;
		if (ibv_post_send(s.qp, &wr, &bad))
			die("post the final READ failed");
		wc = wait_wc(&s, TIMEOUT_MS, "final READ");
		if (wc.status != IBV_WC_SUCCESS)
			die("final READ completed with %s", ibv_wc_status_str(wc.status));
		uint64_t le = htole64(seq);
		memcpy(S + DATA, &le, 8);
		for (size_t i = 8; i < 64; i++)
			S[DATA + i] = pat(seq, i);
		sge = (struct ibv_sge){ (uintptr_t)S + DATA, 64, src->lkey };
		wr = (struct ibv_send_wr){ .wr_id = seq, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED };
		if (ibv_post_send(s.qp, &wr, &bad))
			die("post SEND failed");
		wc = wait_wc(&s, TIMEOUT_MS, "SEND");
		if (wc.status != IBV_WC_SUCCESS)
			die("SEND completed with %s", ibv_wc_status_str(wc.status));
		n[0]++;
		seq++;
	}
	if (memcmp(whole->addr, shadow, DATA + 8 * WORDS)) {
		size_t i = 0;
		while (((uint8_t *)whole->addr)[i] == shadow[i])
			i++;
		errors++;
		fprintf(stderr, "%s: the server region differs from the expected one from byte %zu\n", me, i);
	}
	uint64_t end = END_MARK;
	memcpy(S + DATA, &end, 8);
	sge = (struct ibv_sge){ (uintptr_t)S + DATA, 8, src->lkey };
	wr = (struct ibv_send_wr){ .wr_id = UINT64_MAX, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED };
	if (ibv_post_send(s.qp, &wr, &bad))
		die("post the end marker failed");
	wc = wait_wc(&s, TIMEOUT_MS, "end marker");
	if (wc.status != IBV_WC_SUCCESS)
		die("end marker completed with %s", ibv_wc_status_str(wc.status));
	unsigned long long ss = 0, sw = 0, se = 1;
	l = get_line(30000);
	sscanf(l, "%llu %llu %llu", &ss, &sw, &se);
	if (ss != n[0] + n[1] || sw != write_imms) {
		errors++;
		fprintf(stderr, "%s: the server received %llu sends and %llu writes with immediate, we sent %llu and %llu\n",
			me, ss, sw, (unsigned long long)(n[0] + n[1]), (unsigned long long)write_imms);
	}
	errors += se;
	printf("rxe-peer stress client: ");
	for (int i = 0; i < 7; i++)
		printf("%llu %s, ", (unsigned long long)n[i], names[i]);
	printf("%llu bytes; server: %llu sends, %llu writes with immediate, %llu errors; %llu errors in all\n",
	       (unsigned long long)bytes, ss, sw, se, (unsigned long long)errors);
	return errors ? 1 : 0;
}

/* ---- error scenarios (interop-peer's protocol) ---- */

static const char *event_str(enum ibv_event_type e)
{
	switch (e) {
	case IBV_EVENT_QP_FATAL: return "QP_FATAL";
	case IBV_EVENT_QP_REQ_ERR: return "QP_REQ_ERR";
	case IBV_EVENT_QP_ACCESS_ERR: return "QP_ACCESS_ERR";
	case IBV_EVENT_COMM_EST: return "COMM_EST";
	case IBV_EVENT_QP_LAST_WQE_REACHED: return "QP_LAST_WQE_REACHED";
	default: return ibv_event_type_str(e);
	}
}

/* Async events seen within ms, as a comma-separated list ("none"). */
static void async_events(struct side *s, int ms, char *out, size_t cap)
{
	out[0] = 0;
	uint64_t end = now_ms() + ms;
	for (;;) {
		int left = (int)(end - now_ms());
		if (left <= 0)
			break;
		struct pollfd p = { .fd = s->ctx->async_fd, .events = POLLIN };
		if (poll(&p, 1, left) != 1)
			break;
		struct ibv_async_event ev;
		if (ibv_get_async_event(s->ctx, &ev))
			break;
		if (ev.event_type != IBV_EVENT_COMM_EST) {
			size_t n = strlen(out);
			snprintf(out + n, cap - n, "%s%s", n ? "," : "", event_str(ev.event_type));
		}
		ibv_ack_async_event(&ev);
	}
	if (!out[0])
		snprintf(out, cap, "none");
}

/* The responder's half of the exchange: accepts the requester, reads its
 * "QPN PSN IP" and connects the QP to it. */
static void accept_requester(struct side *s, int rnr_timer)
{
	tcp_server();
	unsigned qpn, psn;
	char ip[64];
	char *l = get_line(30000);
	if (sscanf(l, "%x %x %63s", &qpn, &psn, ip) != 3)
		die("exchange: bad line '%s'", l);
	connect_qp(s, qpn, psn, ip, 1024, rnr_timer);
}

/* The requester's half: connects to the responder, sends "QPN PSN IP",
 * reads its "QPN PSN RKEY ADDR" and connects the QP. */
static void join_responder(struct side *s, const char *host, unsigned *rkey,
			   unsigned long long *raddr)
{
	tcp_client(host);
	put_line("%x %x %s\n", s->qp->qp_num, s->psn, my_ip);
	unsigned rqpn, rpsn;
	char *l = get_line(30000);
	if (sscanf(l, "%x %x %x %llx", &rqpn, &rpsn, rkey, raddr) != 4)
		die("exchange: bad line '%s'", l);
	connect_qp(s, rqpn, rpsn, peer_ip, 1024, 12);
}

static int err_responder(const char *mode)
{
	struct side s = open_side(4);
	struct ibv_mr *mr = reg(&s, 4096, ALL_ACCESS);
	int rnr = !strcmp(mode, "rnr");
	if (!rnr)
		post_recv(&s, mr, 0, 4096, 1);
	/* RNR timer 24 (40.96 ms): a few dozen RNR NAKs while we wait. */
	accept_requester(&s, 24);
	put_line("%x %x %x %llx\n", s.qp->qp_num, s.psn, mr->rkey, (unsigned long long)(uintptr_t)mr->addr);
	int ok = 1;
	char res[256];
	if (rnr) {
		get_line(30000); /* "sent" */
		usleep(1500000);
		post_recv(&s, mr, 0, 4096, 1);
		struct ibv_wc wc;
		if (!poll_wc(&s, 10000, &wc)) {
			snprintf(res, sizeof(res), "no receive completion within 10 s");
			ok = 0;
		} else {
			int data_ok = wc.byte_len == 64;
			for (int i = 0; i < 64 && data_ok; i++)
				data_ok = ((uint8_t *)mr->addr)[i] == (uint8_t)(i * 7 + 1);
			ok = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && data_ok;
			snprintf(res, sizeof(res), "receive %s, %u bytes, data %s", ibv_wc_status_str(wc.status),
				 wc.byte_len, data_ok ? "ok" : "wrong");
		}
	} else {
		get_line(30000); /* "done STATUS" */
		char ev[128];
		async_events(&s, 2000, ev, sizeof(ev));
		struct ibv_wc wc;
		const char *recv = NULL;
		if (poll_wc(&s, 500, &wc))
			recv = ibv_wc_status_str(wc.status);
		enum ibv_qp_state st = qp_state(&s);
		/* IBA: the responder's QP goes to ERR (its receive flushed); the
		 * affiliated event is reported, not required (rxe raises none). */
		ok = st == IBV_QPS_ERR && recv != NULL && wc.status == IBV_WC_WR_FLUSH_ERR;
		snprintf(res, sizeof(res), "responder QP %s, async events %s, posted receive: %s", state_str(st), ev,
			 recv ? recv : "no completion");
	}
	put_line("%s %s\n", ok ? "ok" : "FAIL", res);
	printf("rxe-peer %s responder: %s: %s\n", mode, ok ? "ok" : "FAIL", res);
	get_line(30000);
	return ok ? 0 : 1;
}

static int err_requester(const char *mode, const char *host, const char *op)
{
	struct side s = open_side(4);
	struct ibv_mr *mr = reg(&s, 4096, ALL_ACCESS);
	int rnr = !strcmp(mode, "rnr");
	unsigned rkey;
	unsigned long long raddr;
	join_responder(&s, host, &rkey, &raddr);
	char *l;
	struct ibv_sge sge = { (uintptr_t)mr->addr, 64, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED }, *bad;
	int ok;
	char res[256];
	if (rnr) {
		for (int i = 0; i < 64; i++)
			((uint8_t *)mr->addr)[i] = (uint8_t)(i * 7 + 1);
		wr.opcode = IBV_WR_SEND;
		uint64_t t0 = now_ms();
		if (ibv_post_send(s.qp, &wr, &bad))
			die("post SEND failed");
		put_line("sent\n");
		struct ibv_wc wc = wait_wc(&s, 15000, "SEND");
		uint64_t dt = now_ms() - t0;
		ok = wc.status == IBV_WC_SUCCESS && dt >= 1000;
		snprintf(res, sizeof(res), "SEND completed with %s after %llu ms", ibv_wc_status_str(wc.status),
			 (unsigned long long)dt);
	} else {
		int rd = !strcmp(op, "read");
		wr.opcode = rd ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey ^ 1;
		if (ibv_post_send(s.qp, &wr, &bad))
			die("post failed");
		struct ibv_wc wc = wait_wc(&s, 15000, rd ? "READ" : "WRITE");
		enum ibv_qp_state st = qp_state(&s);
		ok = wc.status == IBV_WC_REM_ACCESS_ERR && st == IBV_QPS_ERR;
		snprintf(res, sizeof(res), "%s with a bad rkey completed with %s, requester QP %s",
			 rd ? "RDMA READ" : "RDMA WRITE", ibv_wc_status_str(wc.status), state_str(st));
		put_line("done\n");
	}
	l = get_line(30000);
	int peer_ok = !strncmp(l, "ok", 2);
	printf("rxe-peer %s requester: %s: %s; the responder (uroce) says: %s\n", mode, ok ? "ok" : "FAIL", res, l);
	put_line("bye\n");
	return ok && peer_ok ? 0 : 1;
}

/* ---- memory windows (interop-peer's protocol, mode mw) ----
 * The responder binds a type 2 window over 512 bytes at offset 1024 of a
 * region without remote access of its own and gives the window's rkey and
 * address; the requester WRITEs 64 bytes through it (success), SENDs with
 * Invalidate naming it (success; the receive shows WITH_INV and the key),
 * and WRITEs through it again (REM_ACCESS_ERR: the window is gone). */

static uint8_t mw_pat(size_t i)
{
	return (uint8_t)(i * 5 + 3);
}

static int mw_responder(void)
{
	struct side s = open_side(4);
	struct ibv_mr *mr = reg(&s, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw = ibv_alloc_mw(s.pd, IBV_MW_TYPE_2);
	if (!mw)
		die("ibv_alloc_mw type 2: %s", strerror(errno));
	post_recv(&s, mr, 2048, 1024, 1);
	accept_requester(&s, 12);
	struct ibv_send_wr bw = { .wr_id = 5, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	bw.bind_mw.mw = mw;
	bw.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	bw.bind_mw.bind_info.mr = mr;
	bw.bind_mw.bind_info.addr = (uintptr_t)mr->addr + 1024;
	bw.bind_mw.bind_info.length = 512;
	bw.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_post_send(s.qp, &bw, &bad))
		die("post BIND_MW: %s", strerror(errno));
	struct ibv_wc wc = wait_wc(&s, 5000, "BIND_MW");
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_BIND_MW)
		die("BIND_MW completed with %s", ibv_wc_status_str(wc.status));
	uint32_t rkey = bw.bind_mw.rkey;
	put_line("%x %x %x %llx\n", s.qp->qp_num, s.psn, rkey,
		 (unsigned long long)(uintptr_t)mr->addr + 1024);
	get_line(30000); /* "done" */
	const uint8_t *b = mr->addr;
	int data_ok = b[1023] == 0 && b[1024 + 64] == 0;
	for (int i = 0; i < 64 && data_ok; i++)
		data_ok = b[1024 + i] == mw_pat(i);
	int got = poll_wc(&s, 2000, &wc);
	/* Kernel rxe reports the invalidation with the kernel's
	 * IB_WC_WITH_INVALIDATE bit (1 << 2), which is userspace's
	 * IBV_WC_IP_CSUM_OK; IBV_WC_WITH_INV is 1 << 3. Either names it; the
	 * key must be the window's. */
	int flagged = got && (wc.wc_flags & (IBV_WC_WITH_INV | IBV_WC_IP_CSUM_OK));
	int inv_ok = got && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && flagged &&
		     wc.invalidated_rkey == rkey;
	usleep(200000);
	enum ibv_qp_state st = qp_state(&s);
	int ok = data_ok && inv_ok && st == IBV_QPS_ERR;
	char res[256];
	snprintf(res, sizeof(res),
		 "WRITE through the window: data %s; receive: %s, wc_flags %#x, invalidated rkey %s; "
		 "responder QP %s after the WRITE through the invalidated window",
		 data_ok ? "ok" : "wrong", got ? ibv_wc_status_str(wc.status) : "no completion",
		 got ? wc.wc_flags : 0, inv_ok ? "the window's" : "wrong", state_str(st));
	put_line("%s %s\n", ok ? "ok" : "FAIL", res);
	printf("rxe-peer mw responder: %s: %s\n", ok ? "ok" : "FAIL", res);
	get_line(30000);
	return ok ? 0 : 1;
}

static int mw_requester(const char *host)
{
	struct side s = open_side(4);
	struct ibv_mr *mr = reg(&s, 4096, ALL_ACCESS);
	unsigned rkey;
	unsigned long long raddr;
	join_responder(&s, host, &rkey, &raddr);
	char *l;
	for (int i = 0; i < 64; i++)
		((uint8_t *)mr->addr)[i] = mw_pat(i);
	struct ibv_sge sge = { (uintptr_t)mr->addr, 64, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(s.qp, &wr, &bad))
		die("post WRITE failed");
	struct ibv_wc w1 = wait_wc(&s, 15000, "WRITE");
	sge.length = 16;
	struct ibv_send_wr inv = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_INV, .send_flags = IBV_SEND_SIGNALED };
	inv.invalidate_rkey = rkey;
	if (ibv_post_send(s.qp, &inv, &bad))
		die("post SEND_WITH_INV failed");
	struct ibv_wc w2 = wait_wc(&s, 15000, "SEND_WITH_INV");
	wr.wr_id = 3;
	sge.length = 64;
	if (ibv_post_send(s.qp, &wr, &bad))
		die("post WRITE failed");
	struct ibv_wc w3 = wait_wc(&s, 15000, "WRITE");
	int ok = w1.status == IBV_WC_SUCCESS && w2.status == IBV_WC_SUCCESS &&
		 w3.status == IBV_WC_REM_ACCESS_ERR;
	char res[256];
	snprintf(res, sizeof(res), "WRITE through the window: %s; SEND_WITH_INV: %s; WRITE after it: %s",
		 ibv_wc_status_str(w1.status), ibv_wc_status_str(w2.status), ibv_wc_status_str(w3.status));
	put_line("done\n");
	l = get_line(30000);
	int peer_ok = !strncmp(l, "ok", 2);
	printf("rxe-peer mw requester: %s: %s; the responder (uroce) says: %s\n", ok ? "ok" : "FAIL", res, l);
	put_line("bye\n");
	return ok && peer_ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	uint64_t messages = 2000, seed = 1;
	unsigned mtu = 1024;
	const char *op = "write";
	if (argc < 2)
		die("usage: rxe-peer stress|badrkey|rnr|mw [-p port] [-g gid] [-n msgs] [-m mtu] [-s seed] [-o write|read] [host]");
	const char *mode = argv[1];
	int c;
	optind = 2;
	while ((c = getopt(argc, argv, "p:g:n:m:s:o:")) != -1) {
		switch (c) {
		case 'p': port = atoi(optarg); break;
		case 'g': gid_idx = atoi(optarg); break;
		case 'n': messages = strtoull(optarg, NULL, 0); break;
		case 'm': mtu = atoi(optarg); break;
		case 's': seed = strtoull(optarg, NULL, 0); break;
		case 'o': op = optarg; break;
		default: die("bad option");
		}
	}
	const char *host = optind < argc ? argv[optind] : NULL;
	if (!strcmp(mode, "stress"))
		return host ? stress_client(host, messages, mtu, seed) : stress_server();
	if (!strcmp(mode, "badrkey") || !strcmp(mode, "rnr"))
		return host ? err_requester(mode, host, op) : err_responder(mode);
	if (!strcmp(mode, "mw"))
		return host ? mw_requester(host) : mw_responder();
	die("unknown mode %s", mode);
	return 1;
}
