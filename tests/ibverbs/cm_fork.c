/* Children of fork() on a device their parent holds, as the pyverbs
 * rdmacm tests run (issue 33): the test process opens the device, then
 * forks its passive and its active side, each of which opens the device
 * again and connects through rdma_cm.
 *
 *   cm_fork ADDR PORT [DST]
 *
 * The parent opens the device on ADDR (ibv_open_device, a PD, a CQ) and an
 * rdma_cm id bound to ADDR (librdmacm's context of the device), then, for
 * two rounds, forks a server (rdma_create_ep + listen on ADDR:PORT+round)
 * and a client (rdma_create_ep to DST, ADDR if not given), which exchange
 * a SEND each way with the simplified verbs (rdma_post_send/recv) and
 * check its bytes. A child that used the parent's context would wait for
 * ever on an engine whose thread stayed in the parent (the 20 s alarm).
 * Last, the parent itself listens and connects to a forked client: its own
 * context still works. Exits 0 when every exchange checked; prints
 * "cm_fork: N exchanges". */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSG 64

static int fail(const char *who, const char *what) {
	fprintf(stderr, "cm_fork %s: %s failed: %m\n", who, what);
	return 1;
}

static struct rdma_addrinfo *addr_of(const char *host, int port, int passive) {
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res = NULL;
	char p[16];
	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	snprintf(p, sizeof p, "%d", port);
	if (rdma_getaddrinfo(host, p, &hints, &res))
		return NULL;
	return res;
}

static void attrs(struct ibv_qp_init_attr *a) {
	memset(a, 0, sizeof *a);
	a->cap.max_send_wr = a->cap.max_recv_wr = 2;
	a->cap.max_send_sge = a->cap.max_recv_sge = 1;
	a->sq_sig_all = 1;
}

/* One SEND each way on `id`'s QP: `first` sends first. */
static int exchange(const char *who, struct rdma_cm_id *id, int first) {
	char out[MSG], in[MSG];
	struct ibv_wc wc;
	struct ibv_mr *mr_in = rdma_reg_msgs(id, in, MSG), *mr_out = rdma_reg_msgs(id, out, MSG);
	if (!mr_in || !mr_out)
		return fail(who, "rdma_reg_msgs");
	snprintf(out, MSG, "%s %d", first ? "from the client" : "from the server", (int)getpid());
	if (rdma_post_recv(id, NULL, in, MSG, mr_in))
		return fail(who, "rdma_post_recv");
	if (!first && rdma_get_recv_comp(id, &wc) <= 0)
		return fail(who, "rdma_get_recv_comp");
	if (rdma_post_send(id, NULL, out, MSG, mr_out, 0) || rdma_get_send_comp(id, &wc) <= 0 ||
	    wc.status != IBV_WC_SUCCESS)
		return fail(who, "rdma_post_send");
	if (first && rdma_get_recv_comp(id, &wc) <= 0)
		return fail(who, "rdma_get_recv_comp");
	if (strncmp(in, first ? "from the server" : "from the client", 15)) {
		fprintf(stderr, "cm_fork %s: received \"%.*s\"\n", who, MSG, in);
		return 1;
	}
	rdma_dereg_mr(mr_in);
	rdma_dereg_mr(mr_out);
	return 0;
}

static int server(const char *addr, int port, int ready) {
	struct rdma_addrinfo *ai = addr_of(addr, port, 1);
	struct rdma_cm_id *listen_id, *id;
	struct ibv_qp_init_attr a;
	attrs(&a);
	if (!ai)
		return fail("server", "rdma_getaddrinfo");
	if (rdma_create_ep(&listen_id, ai, NULL, &a) || rdma_listen(listen_id, 1))
		return fail("server", "rdma_create_ep/rdma_listen");
	if (ready >= 0) {
		/* Tell the parent the port is listened on. */
		if (write(ready, "l", 1) != 1)
			return fail("server", "write");
		close(ready);
	}
	if (rdma_get_request(listen_id, &id) || rdma_accept(id, NULL))
		return fail("server", "rdma_get_request/rdma_accept");
	int rc = exchange("server", id, 0);
	rdma_disconnect(id);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(ai);
	return rc;
}

static int client(const char *dst, int port) {
	struct rdma_addrinfo *ai = addr_of(dst, port, 0);
	struct rdma_cm_id *id;
	struct ibv_qp_init_attr a;
	attrs(&a);
	if (!ai)
		return fail("client", "rdma_getaddrinfo");
	if (rdma_create_ep(&id, ai, NULL, &a) || rdma_connect(id, NULL))
		return fail("client", "rdma_create_ep/rdma_connect");
	int rc = exchange("client", id, 1);
	rdma_disconnect(id);
	rdma_destroy_ep(id);
	rdma_freeaddrinfo(ai);
	return rc;
}

/* Forks `role` (0 server, 1 client); the server's child writes a byte to
 * the pipe once it listens, and the parent waits for it. */
static pid_t spawn(int role, const char *addr, const char *dst, int port) {
	int p[2];
	if (pipe(p))
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		alarm(20);
		_exit(role == 0 ? server(addr, port, p[1]) : client(dst, port));
	}
	close(p[1]);
	if (role == 0) {
		char c;
		if (read(p[0], &c, 1) != 1)
			fprintf(stderr, "cm_fork: the server child did not listen\n");
	}
	close(p[0]);
	return pid;
}

static int reap(pid_t pid, const char *who) {
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return fail(who, "fork/waitpid");
	if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "cm_fork: %s child %s %d\n", who,
			WIFEXITED(st) ? "exited" : "killed by signal",
			WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
		return 1;
	}
	return 0;
}

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: cm_fork ADDR PORT [DST]\n");
		return 2;
	}
	const char *addr = argv[1], *dst = argc > 3 ? argv[3] : argv[1];
	int port = atoi(argv[2]), exchanges = 0, bad = 0;
	/* The parent holds the device, through libibverbs and librdmacm. */
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		return fail("parent", "ibv_get_device_list");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = ctx ? ibv_create_cq(ctx, 4, NULL, NULL, 0) : NULL;
	if (!pd || !cq)
		return fail("parent", "ibv_open_device/ibv_alloc_pd/ibv_create_cq");
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *held;
	struct rdma_addrinfo *bound = addr_of(addr, 0, 1);
	if (!ch || !bound || rdma_create_id(ch, &held, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(held, bound->ai_src_addr) || !held->verbs)
		return fail("parent", "rdma_bind_addr");
	for (int round = 0; round < 2; round++) {
		pid_t s = spawn(0, addr, dst, port + round);
		pid_t c = spawn(1, addr, dst, port + round);
		int r = reap(c, "client") | reap(s, "server");
		bad |= r;
		exchanges += !r;
	}
	/* The parent's own context after its children: it listens itself. */
	pid_t c = -1;
	{
		struct rdma_addrinfo *ai = addr_of(addr, port + 2, 1);
		struct rdma_cm_id *listen_id, *id;
		struct ibv_qp_init_attr a;
		attrs(&a);
		if (!ai || rdma_create_ep(&listen_id, ai, NULL, &a) || rdma_listen(listen_id, 1))
			return fail("parent", "rdma_create_ep/rdma_listen");
		c = spawn(1, addr, dst, port + 2);
		if (rdma_get_request(listen_id, &id) || rdma_accept(id, NULL))
			return fail("parent", "rdma_get_request/rdma_accept");
		int r = exchange("parent", id, 0) | reap(c, "client");
		bad |= r;
		exchanges += !r;
		rdma_disconnect(id);
		rdma_destroy_ep(id);
		rdma_destroy_ep(listen_id);
		rdma_freeaddrinfo(ai);
	}
	rdma_destroy_id(held);
	rdma_destroy_event_channel(ch);
	rdma_freeaddrinfo(bound);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("cm_fork: %d exchanges%s\n", exchanges, bad ? ", some failed" : "");
	return bad;
}
