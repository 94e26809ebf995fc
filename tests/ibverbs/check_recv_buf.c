/*
 * UROCE_CHECK's `buffer` category for receive WRs: the program writes into
 * the buffer of a receive WR it posted, before a message arrives into it
 * (ibv_post_recv(3): the buffers of a WR are the NIC's until its
 * completion is retrieved; the message overwrites what the program
 * wrote). The checksum taken at ibv_post_recv is compared just before the
 * engine places the message, and the program's write is reported at the
 * WR's completion when the message covers it. Two receive WRs on one
 * shared buffer (the engine's own writes are not the program's), a buffer
 * written after its completion, and a write beyond the bytes a message
 * fills are the clean cases. With UROCE_CHECK=1 exactly one
 * report names this file's line.
 */
#include "check_pair.h"

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	rc_pair(&a, &b, 32, 8);
	memset(a.buf, 'x', 1024);
	MUST(post_recv(&b, 1, 0, 1024) == 0);
	b.buf[10] = 'y'; /* the mistake: the receive WR is still posted */
	MUST(post(&a, IBV_WR_SEND, 7, 0, 1024, IBV_SEND_SIGNALED, 0, 0) == 0);
	struct ibv_wc wc = wait1(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1,
	      "the receive completes (status %d)", wc.status);
	CHECK(b.buf[10] == 'x', "the message overwrote what the program wrote");
	CHECK(wait1(a.cq).status == IBV_WC_SUCCESS, "the SEND completes");

	/* Clean: two receive WRs share one buffer; it changes only after
	 * their completions. */
	MUST(post_recv(&b, 2, 2048, 1024) == 0);
	MUST(post_recv(&b, 3, 2048, 1024) == 0);
	for (int i = 0; i < 2; i++) {
		memset(a.buf, 'a' + i, 1024);
		MUST(post(&a, IBV_WR_SEND, 8 + i, 0, 1024, IBV_SEND_SIGNALED,
			  0, 0) == 0);
		CHECK(wait1(a.cq).status == IBV_WC_SUCCESS, "SEND %d completes",
		      i + 2);
		wc = wait1(b.cq);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2u + i &&
			      b.buf[2048] == 'a' + i,
		      "receive %d on the shared buffer completes", i + 2);
	}
	b.buf[2048] = 'z';

	/* Not reported: a write beyond the bytes the message fills (the NIC
	 * overwrites nothing the program wrote). */
	MUST(post_recv(&b, 4, 2048, 1024) == 0);
	b.buf[2048 + 900] = 'w';
	MUST(post(&a, IBV_WR_SEND, 10, 0, 64, IBV_SEND_SIGNALED, 0, 0) == 0);
	CHECK(wait1(a.cq).status == IBV_WC_SUCCESS, "SEND 4 completes");
	wc = wait1(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 64 &&
		      b.buf[2048 + 900] == 'w',
	      "a 64-byte message leaves the rest of the buffer");
	close_side(&a);
	close_side(&b);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
