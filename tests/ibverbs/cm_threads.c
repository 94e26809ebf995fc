/*
 * rdma_cm ids and channels shared by two threads, as rdmacm-utils 44's
 * rping shares them: an event thread loops on rdma_get_cm_event while the
 * main thread destroys the id and then the channel. librdmacm (with the
 * kernel's ucma under it) orders this so that nothing is used after it is
 * freed, and so must uroce's library:
 *
 *   1. rdma_destroy_id returns only once every event naming the id that
 *      another thread was given is acknowledged (rping's main thread
 *      destroys its id while the event thread still handles DISCONNECTED);
 *   2. an event the destroying thread holds itself is not waited for (it
 *      could never be acknowledged);
 *   3. a thread already waiting in rdma_get_cm_event when the channel is
 *      destroyed keeps waiting, as a read(2) the kernel started does;
 *   4. rdma_get_cm_event on a destroyed channel fails with EBADF, as a
 *      read(2) of the closed descriptor does, instead of reading freed
 *      memory (rping's event thread, back at the top of its loop).
 *
 * One device: UROCE_DEVICES names it; argv[1] is its address, argv[2] an
 * address on the same /8 with nothing behind it (a resolve target only).
 * Prints one line per check and "N passed, N failed".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static const char *src_ip, *dst_ip;

static struct sockaddr_in addr_of(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	MUST(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
	return a;
}

/* An id on ch whose ADDR_RESOLVED event is queued (not yet taken). */
static struct rdma_cm_id *resolving_id(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id;
	struct sockaddr_in s = addr_of(src_ip, 0), d = addr_of(dst_ip, 7471);
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	MUST(rdma_resolve_addr(id, (struct sockaddr *)&s,
			       (struct sockaddr *)&d, 2000) == 0);
	return id;
}

struct holder {
	struct rdma_event_channel *ch;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int got;	/* the thread has its event */
	int acked;	/* ... and is about to acknowledge it */
	int event;
};

/* Takes one event, tells main, holds it 300 ms, acknowledges it. */
static void *hold_event(void *arg)
{
	struct holder *h = arg;
	struct rdma_cm_event *ev;
	int rc = rdma_get_cm_event(h->ch, &ev);
	pthread_mutex_lock(&h->mu);
	h->got = 1;
	h->event = rc ? -1 : (int)ev->event;
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
	if (rc)
		return NULL;
	usleep(300 * 1000);
	__atomic_store_n(&h->acked, 1, __ATOMIC_SEQ_CST);
	rdma_ack_cm_event(ev);
	return NULL;
}

static void destroy_waits_for_other_threads(void)
{
	struct holder h = { .mu = PTHREAD_MUTEX_INITIALIZER,
			    .cv = PTHREAD_COND_INITIALIZER };
	pthread_t t;
	MUST(h.ch = rdma_create_event_channel());
	struct rdma_cm_id *id = resolving_id(h.ch);
	MUST(pthread_create(&t, NULL, hold_event, &h) == 0);
	pthread_mutex_lock(&h.mu);
	while (!h.got)
		pthread_cond_wait(&h.cv, &h.mu);
	pthread_mutex_unlock(&h.mu);
	CHECK(h.event == RDMA_CM_EVENT_ADDR_RESOLVED,
	      "the other thread got ADDR_RESOLVED (%d)", h.event);
	int rc = rdma_destroy_id(id);
	int acked = __atomic_load_n(&h.acked, __ATOMIC_SEQ_CST);
	CHECK(rc == 0 && acked,
	      "rdma_destroy_id returned (%d) after the other thread's ack "
	      "(acked when it returned: %d)", rc, acked);
	pthread_join(t, NULL);
	rdma_destroy_event_channel(h.ch);
}

static void destroy_under_own_event(void)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_event *ev;
	MUST(ch = rdma_create_event_channel());
	struct rdma_cm_id *id = resolving_id(ch);
	MUST(rdma_get_cm_event(ch, &ev) == 0);
	int rc = rdma_destroy_id(id);
	CHECK(rc == 0, "rdma_destroy_id under the thread's own unacknowledged "
		       "event returns (%d)", rc);
	CHECK(rdma_ack_cm_event(ev) == 0, "that event is acknowledged after");
	rdma_destroy_event_channel(ch);
}

struct waiter {
	struct rdma_event_channel *ch;
	int entered, returned;
};

static void *wait_event(void *arg)
{
	struct waiter *w = arg;
	struct rdma_cm_event *ev;
	__atomic_store_n(&w->entered, 1, __ATOMIC_SEQ_CST);
	int rc = rdma_get_cm_event(w->ch, &ev);
	__atomic_store_n(&w->returned, rc ? 2 : 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static void waiter_keeps_waiting(void)
{
	static struct waiter w;
	pthread_t t;
	MUST(w.ch = rdma_create_event_channel());
	MUST(pthread_create(&t, NULL, wait_event, &w) == 0);
	while (!__atomic_load_n(&w.entered, __ATOMIC_SEQ_CST))
		usleep(1000);
	usleep(100 * 1000);
	rdma_destroy_event_channel(w.ch);
	usleep(200 * 1000);
	int r = __atomic_load_n(&w.returned, __ATOMIC_SEQ_CST);
	CHECK(r == 0, "a thread waiting in rdma_get_cm_event keeps waiting "
		      "after the channel is destroyed (returned: %d)", r);
	/* The thread stays blocked; exit ends it, as with a kernel channel. */
	pthread_detach(t);
}

static void destroyed_channel_is_ebadf(void)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_event *ev = NULL;
	MUST(ch = rdma_create_event_channel());
	rdma_destroy_event_channel(ch);
	/* What rping's event thread does when it comes back to the top of
	 * its loop after main destroyed the channel: with a kernel channel,
	 * a read(2) of a closed descriptor. */
	errno = 0;
	int rc = rdma_get_cm_event(ch, &ev);
	CHECK(rc == -1 && errno == EBADF,
	      "rdma_get_cm_event on a destroyed channel: -1 EBADF (%d, "
	      "errno %d)", rc, errno);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s DEVICE-IP UNUSED-IP\n", argv[0]);
		return 2;
	}
	src_ip = argv[1];
	dst_ip = argv[2];
	setvbuf(stdout, NULL, _IOLBF, 0);
	destroy_waits_for_other_threads();
	destroy_under_own_event();
	waiter_keeps_waiting();
	destroyed_channel_is_ebadf();
	printf("cm_threads.c: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
