/* uroce-fuzz-agent: the target side of `uroce fuzz`.
 *
 * Runs next to the RoCEv2 stack under test (kernel rxe, a NIC, or uroce
 * through its drop-in libibverbs.so.1) and lets the fuzzer set up QPs and
 * regions with known contents and observe them, over a line protocol on
 * TCP. Written against the standard <infiniband/verbs.h> only.
 *
 *   cc -O2 -Wall -o uroce-fuzz-agent fuzz/agent/uroce_fuzz_agent.c -libverbs
 *   uroce-fuzz-agent -a TARGET_IP [-d DEVICE] [-l LISTEN_IP] [-p PORT] [-m MTU] [-k]
 *
 * -k passes on new kernel log lines that report a problem (BUG, WARNING,
 * KASAN, Oops, ...) with every observation: for a kernel target (rxe).
 *
 * Protocol (one command per line, answers end with "end" or are one line):
 *   setup rc|uc|ud RECVS FUZZER_IP FUZZER_QPN FUZZER_PSN
 *     -> ok qpn=N control_qpn=N rq_psn=N sq_psn=N va=N len=N rkey=N
 *           private_rkey=N qkey=N mtu=N recv_len=N access=N [qp_access=N]
 *           [min_rnr_timer=N] keys=K;K;...
 *        access: the exposed region's ibv_access_flags; qp_access (RC, UC)
 *        and min_rnr_timer (RC): the fuzzed QP's, as ibv_query_qp reports
 *        them (fields a fuzzer does not know it ignores; one an older agent
 *        does not send the fuzzer takes as not known)
 *        where each K is NAME,RKEY,KIND,VA,LEN,ACCESS,SAME_PD,BOUND_TO_QP,STATE
 *        (KIND 0 region, 1 type 1 window, 2 type 2 window; STATE 0 valid,
 *        1 deregistered, 2 invalidated, 3 unbound): the further keys the
 *        fuzzer may aim at (see expose_keys), or none if the device could
 *        not make them all
 *   post send|write|read|cas|faa WR_ID LEN LOCAL_OFF REMOTE_VA RKEY SWAP_ADD COMPARE
 *     -> ok | error WHY   (a signaled WR on the fuzzed QP; its local buffer
 *        is the exposed region at LOCAL_OFF: the fuzzer answers as responder;
 *        on UD a datagram to the fuzzer's QP with the Q_Key QKEY)
 *   observe
 *     -> log LINE / state N / event NAME / exposed HEX /
 *        wc WR_ID STATUS RECV OPCODE BYTE_LEN WC_FLAGS IMM INVALIDATED_RKEY SRC_QP /
 *        private ok|changed / control ok|fail / end
 *        ("private ok": the private region, and the keys' memory no key lets
 *        the fuzzer write, hold their pattern)
 *   ping -> pong
 *   quit
 *
 * The fuzzed QP is connected to the fuzzer's address and QP number; a
 * second pair (control QP and its peer, both here, talking through the
 * device to the device's own address) checks after every case that a
 * legitimate SEND and RDMA WRITE still work. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REGION 4096
#define PATTERN 0x5a
#define QKEY 0x11111111u
#define DEPTH 64

static struct ibv_context *ctx;
static struct ibv_pd *pd, *pd2;
static int gid_index = -1;
static union ibv_gid my_gid;
static enum ibv_mtu mtu = IBV_MTU_1024;
static int mtu_bytes = 1024;

/* The fuzzed QP and its regions (re-made by every setup). */
/* Separate CQs: an error completion's opcode is undefined (IBA 11.4.2.1),
 * so which queue a completion came from is told by its CQ. */
static struct ibv_cq *fcq, *frcq;
static struct ibv_qp *fqp;
/* UD: the address of the fuzzer's QP, where posts go. */
static struct ibv_ah *fah;
static uint32_t fuzzer_qpn;
static struct ibv_mr *exposed_mr, *private_mr, *recv_mr;
static char *exposed, *private_buf, *recv_buf;

/* The further keys (uroce-fuzz's EXPOSED_KEYS, in its order): seven
 * regions of KEY_REGION bytes and four windows over quarters of an eighth
 * region, plus an unbound window (re-made by every setup). */
#define KEY_REGION 1024
#define NREGIONS 7
#define NKEYS 12
static const char *key_names[NKEYS] = {
    "read-only", "write-only", "no-atomic", "local-only", "other-pd", "deregistered",
    "zero-based", "window1", "window2", "window2-other-qp", "window2-invalidated",
    "window-unbound"};
static char *key_buf[NREGIONS + 1];
static struct ibv_mr *key_mr[NREGIONS + 1];
static struct ibv_mw *key_mw[5];
static char keys_line[NKEYS * 96];

/* The control pair. */
static struct ibv_cq *ccq;
static struct ibv_qp *cqp, *pqp;
static struct ibv_mr *cmr;
static char *cbuf;

static void gid_of_ip(const char *ip, union ibv_gid *g) {
  memset(g, 0, sizeof(*g));
  struct in_addr a;
  if (inet_pton(AF_INET, ip, &a) == 1) {
    g->raw[10] = 0xff;
    g->raw[11] = 0xff;
    memcpy(&g->raw[12], &a, 4);
  } else {
    inet_pton(AF_INET6, ip, g->raw);
  }
}

static int find_gid(const char *ip) {
  union ibv_gid want, g;
  gid_of_ip(ip, &want);
  struct ibv_port_attr pa;
  if (ibv_query_port(ctx, 1, &pa))
    return -1;
  for (int i = 0; i < pa.gid_tbl_len; i++) {
    if (ibv_query_gid(ctx, 1, i, &g))
      continue;
    if (!memcmp(&g, &want, sizeof(g))) {
      /* Prefer the RoCEv2 entry (the one after a RoCEv1 twin on rxe). */
      union ibv_gid n;
      if (i + 1 < pa.gid_tbl_len && !ibv_query_gid(ctx, 1, i + 1, &n) &&
          !memcmp(&n, &want, sizeof(n)))
        return i + 1;
      return i;
    }
  }
  return -1;
}

static struct ibv_qp *make_qp2(struct ibv_cq *cq, struct ibv_cq *rcq, enum ibv_qp_type t) {
  struct ibv_qp_init_attr ia = {
      .send_cq = cq,
      .recv_cq = rcq,
      .cap = {.max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = 1, .max_recv_sge = 1},
      .qp_type = t,
  };
  return ibv_create_qp(pd, &ia);
}

static struct ibv_qp *make_qp(struct ibv_cq *cq, enum ibv_qp_type t) {
  return make_qp2(cq, cq, t);
}

/* RESET -> INIT -> RTR -> RTS towards (gid, qpn). */
/* The fuzzed QP's requester gives up as fast as uroce's simulated target
 * does (timeout 8: ~1 ms, 3 retries, 2 RNR retries), so that a case's
 * requests end within its observation on both (the differential mode);
 * the control pair keeps patient defaults. */
static int connect_qp(struct ibv_qp *qp, enum ibv_qp_type t, const union ibv_gid *dgid,
                      uint32_t dqpn, uint32_t rq_psn, uint32_t sq_psn, int fuzzed) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1};
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (t == IBV_QPT_UD) {
    a.qkey = QKEY;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        (t == IBV_QPT_RC ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : 0);
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  if (ibv_modify_qp(qp, &a, mask))
    return -1;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  mask = IBV_QP_STATE;
  if (t != IBV_QPT_UD) {
    a.path_mtu = mtu;
    a.dest_qp_num = dqpn;
    a.rq_psn = rq_psn;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *dgid;
    a.ah_attr.grh.sgid_index = gid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (t == IBV_QPT_RC) {
      a.max_dest_rd_atomic = 4;
      a.min_rnr_timer = 1;
      mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
  }
  if (ibv_modify_qp(qp, &a, mask))
    return -1;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = sq_psn;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (t == IBV_QPT_RC) {
    a.timeout = fuzzed ? 8 : 14;
    a.retry_cnt = fuzzed ? 3 : 7;
    a.rnr_retry = fuzzed ? 2 : 7;
    a.max_rd_atomic = 4;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return ibv_modify_qp(qp, &a, mask);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int make_control(void) {
  if (cqp)
    ibv_destroy_qp(cqp);
  if (pqp)
    ibv_destroy_qp(pqp);
  cqp = pqp = NULL;
  if (!ccq && !(ccq = ibv_create_cq(ctx, 4 * DEPTH, NULL, NULL, 0)))
    return -1;
  if (!cbuf) {
    cbuf = aligned_alloc(4096, 4096);
    if (!cbuf || !(cmr = ibv_reg_mr(pd, cbuf, 4096,
                                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)))
      return -1;
  }
  cqp = make_qp(ccq, IBV_QPT_RC);
  pqp = make_qp(ccq, IBV_QPT_RC);
  if (!cqp || !pqp)
    return -1;
  if (connect_qp(cqp, IBV_QPT_RC, &my_gid, pqp->qp_num, 100, 200, 0) ||
      connect_qp(pqp, IBV_QPT_RC, &my_gid, cqp->qp_num, 200, 100, 0))
    return -1;
  return 0;
}

/* A SEND (into cbuf[0..32]) and an RDMA WRITE (into cbuf[64..96]) from the
 * peer to the control QP; both complete and land within 2 s. */
static int control_check(void) {
  struct ibv_wc wc[8];
  while (ibv_poll_cq(ccq, 8, wc) > 0)
    ;
  memset(cbuf, 0, 128);
  memset(cbuf + 256, 0xc3, 32);
  struct ibv_sge rs = {.addr = (uintptr_t)cbuf, .length = 32, .lkey = cmr->lkey};
  struct ibv_recv_wr rwr = {.wr_id = 0xc0, .sg_list = &rs, .num_sge = 1}, *bad_r;
  struct ibv_sge ss = {.addr = (uintptr_t)(cbuf + 256), .length = 32, .lkey = cmr->lkey};
  struct ibv_send_wr w2 = {.wr_id = 0xc2, .sg_list = &ss, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
  w2.wr.rdma.remote_addr = (uintptr_t)(cbuf + 64);
  w2.wr.rdma.rkey = cmr->rkey;
  struct ibv_send_wr w1 = {.wr_id = 0xc1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED, .next = &w2},
                     *bad_s;
  if (ibv_post_recv(cqp, &rwr, &bad_r) || ibv_post_send(pqp, &w1, &bad_s))
    return 0;
  int done = 0, good = 1;
  double end = now_s() + 2;
  while (done < 3 && now_s() < end) {
    int n = ibv_poll_cq(ccq, 8, wc);
    for (int i = 0; i < n; i++) {
      done++;
      good &= wc[i].status == IBV_WC_SUCCESS;
    }
  }
  for (int i = 0; i < 32; i++)
    good &= (unsigned char)cbuf[i] == 0xc3 && (unsigned char)cbuf[64 + i] == 0xc3;
  return good && done == 3;
}

static void teardown_keys(void) {
  for (int i = 0; i < 5; i++)
    if (key_mw[i])
      ibv_dealloc_mw(key_mw[i]);
  for (int i = 0; i <= NREGIONS; i++) {
    if (key_mr[i])
      ibv_dereg_mr(key_mr[i]);
    free(key_buf[i]);
    key_mr[i] = NULL;
    key_buf[i] = NULL;
  }
  memset(key_mw, 0, sizeof key_mw);
  keys_line[0] = 0;
}

static void teardown(void) {
  teardown_keys();
  if (fqp)
    ibv_destroy_qp(fqp);
  if (fah)
    ibv_destroy_ah(fah);
  fah = NULL;
  if (exposed_mr)
    ibv_dereg_mr(exposed_mr);
  if (private_mr)
    ibv_dereg_mr(private_mr);
  if (recv_mr)
    ibv_dereg_mr(recv_mr);
  if (fcq)
    ibv_destroy_cq(fcq);
  if (frcq)
    ibv_destroy_cq(frcq);
  free(exposed);
  free(private_buf);
  free(recv_buf);
  fqp = NULL;
  exposed_mr = private_mr = recv_mr = NULL;
  fcq = frcq = NULL;
  exposed = private_buf = recv_buf = NULL;
}

/* Waits up to 1 s for the completion of wr_id on cq (others are dropped:
 * at set-up nothing else completes there that the fuzzer must see). */
static int wait_wc(struct ibv_cq *cq, uint64_t wr_id) {
  double end = now_s() + 1;
  struct ibv_wc wc;
  while (now_s() < end)
    if (ibv_poll_cq(cq, 1, &wc) > 0 && wc.wr_id == wr_id)
      return wc.status == IBV_WC_SUCCESS ? 0 : -1;
  return -1;
}

/* Binds the type 2 window mw over quarter q of the windows' region with a
 * BIND_MW work request on qp (whose send CQ is cq); returns its R_Key. */
static int bind_type2(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mw *mw, int q,
                      uint32_t *rkey) {
  struct ibv_send_wr w = {.wr_id = 0xb1d0 + q, .opcode = IBV_WR_BIND_MW,
                          .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  w.bind_mw.mw = mw;
  w.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  w.bind_mw.bind_info.mr = key_mr[NREGIONS];
  w.bind_mw.bind_info.addr = (uintptr_t)(key_buf[NREGIONS] + q * KEY_REGION / 4);
  w.bind_mw.bind_info.length = KEY_REGION / 4;
  w.bind_mw.bind_info.mw_access_flags =
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  if (ibv_post_send(qp, &w, &bad) || wait_wc(cq, w.wr_id))
    return -1;
  *rkey = w.bind_mw.rkey;
  return 0;
}

static void key_entry(int i, uint32_t rkey, int kind, uint64_t va, unsigned len, int access,
                      int same_pd, int bound, int state) {
  size_t n = strlen(keys_line);
  snprintf(keys_line + n, sizeof keys_line - n, "%s%s,%u,%d,%llu,%u,%d,%d,%d,%d", n ? ";" : "",
           key_names[i], rkey, kind, (unsigned long long)va, len, access, same_pd, bound, state);
}

/* Makes the keys of key_names for the fuzzed QP (of type t) and lists them
 * in keys_line; on any failure none (and says why on stderr). Type 1
 * windows are bound through the control QP (any QP of the PD may), type 2
 * ones through the fuzzed QP, except on UD (which cannot bind them) and
 * the one bound to another QP: through the control QP. */
static int expose_keys(enum ibv_qp_type t) {
  const int remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  const int all = IBV_ACCESS_LOCAL_WRITE | remote;
  const int rights[NREGIONS + 1] = {
      IBV_ACCESS_REMOTE_READ,
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
      0,
      all,
      all,
      all,
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND};
  const char *step = "regions";
  uint32_t rkeys[NREGIONS];
  for (int i = 0; i <= NREGIONS; i++) {
    if (!(key_buf[i] = aligned_alloc(4096, KEY_REGION)))
      goto fail;
    memset(key_buf[i], PATTERN, KEY_REGION);
    struct ibv_pd *p = i == 4 ? pd2 : pd;
    key_mr[i] = i == 6 ? ibv_reg_mr_iova(p, key_buf[i], KEY_REGION, 0, rights[i])
                       : ibv_reg_mr(p, key_buf[i], KEY_REGION, rights[i]);
    if (!key_mr[i])
      goto fail;
    if (i < NREGIONS)
      rkeys[i] = key_mr[i]->rkey;
  }
  step = "deregistration";
  if (ibv_dereg_mr(key_mr[5]))
    goto fail;
  key_mr[5] = NULL;
  for (int i = 0; i < NREGIONS; i++)
    key_entry(i, rkeys[i], 0, i == 6 ? 0 : (uintptr_t)key_buf[i], KEY_REGION, rights[i],
              i != 4, 1, i == 5);
  step = "alloc_mw";
  for (int i = 0; i < 5; i++)
    if (!(key_mw[i] = ibv_alloc_mw(pd, i == 0 || i == 4 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2)))
      goto fail;
  step = "type 1 bind";
  struct ibv_mw_bind b1 = {.wr_id = 0xb1d0, .send_flags = IBV_SEND_SIGNALED};
  b1.bind_info.mr = key_mr[NREGIONS];
  b1.bind_info.addr = (uintptr_t)key_buf[NREGIONS];
  b1.bind_info.length = KEY_REGION / 4;
  b1.bind_info.mw_access_flags = remote;
  if (ibv_bind_mw(cqp, key_mw[0], &b1) || wait_wc(ccq, b1.wr_id))
    goto fail;
  char *wbase = key_buf[NREGIONS];
  key_entry(7, key_mw[0]->rkey, 1, (uintptr_t)wbase, KEY_REGION / 4, remote, 1, 1, 0);
  int own = t != IBV_QPT_UD;
  struct ibv_qp *bq = own ? fqp : cqp;
  struct ibv_cq *bcq = own ? fcq : ccq;
  uint32_t k2, k3, k4;
  step = "type 2 binds";
  if (bind_type2(bq, bcq, key_mw[1], 1, &k2) || bind_type2(cqp, ccq, key_mw[2], 2, &k3) ||
      bind_type2(bq, bcq, key_mw[3], 3, &k4))
    goto fail;
  step = "local invalidate";
  struct ibv_send_wr inv = {.wr_id = 0x1d0, .opcode = IBV_WR_LOCAL_INV,
                            .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = k4},
                     *bad;
  if (ibv_post_send(bq, &inv, &bad) || wait_wc(bcq, inv.wr_id))
    goto fail;
  key_entry(8, k2, 2, (uintptr_t)(wbase + KEY_REGION / 4), KEY_REGION / 4, remote, 1, own, 0);
  key_entry(9, k3, 2, (uintptr_t)(wbase + KEY_REGION / 2), KEY_REGION / 4, remote, 1, 0, 0);
  key_entry(10, k4, 2, (uintptr_t)(wbase + 3 * KEY_REGION / 4), KEY_REGION / 4, remote, 1, own,
            2);
  key_entry(11, key_mw[4]->rkey, 1, 0, 0, 0, 1, 1, 3);
  return 0;
fail:
  fprintf(stderr, "uroce-fuzz-agent: no further keys (%s: %s)\n", step, strerror(errno));
  teardown_keys();
  return -1;
}

/* Whether the keys' memory no key lets the fuzzer write (the read-only,
 * local-only, other-PD and deregistered regions, the second half of the
 * windows' region) holds its pattern. */
static int keys_intact(void) {
  static const int guarded[] = {0, 3, 4, 5};
  int ok = 1;
  for (unsigned g = 0; g < sizeof guarded / sizeof guarded[0]; g++)
    for (int i = 0; key_buf[guarded[g]] && i < KEY_REGION; i++)
      ok &= (unsigned char)key_buf[guarded[g]][i] == PATTERN;
  for (int i = KEY_REGION / 2; key_buf[NREGIONS] && i < KEY_REGION; i++)
    ok &= (unsigned char)key_buf[NREGIONS][i] == PATTERN;
  return ok;
}

static void setup(FILE *out, const char *type, unsigned recvs, const char *fip, unsigned fqpn,
                  unsigned fpsn) {
  enum ibv_qp_type t = !strcmp(type, "uc") ? IBV_QPT_UC
                       : !strcmp(type, "ud") ? IBV_QPT_UD
                                             : IBV_QPT_RC;
  teardown();
  exposed = aligned_alloc(4096, REGION);
  private_buf = aligned_alloc(4096, REGION);
  recv_buf = aligned_alloc(4096, REGION + 64);
  if (!exposed || !private_buf || !recv_buf) {
    fprintf(out, "error out of memory\n");
    return;
  }
  memset(exposed, PATTERN, REGION);
  memset(private_buf, PATTERN, REGION);
  int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
            IBV_ACCESS_REMOTE_ATOMIC;
  exposed_mr = ibv_reg_mr(pd, exposed, REGION, all);
  private_mr = ibv_reg_mr(pd, private_buf, REGION, IBV_ACCESS_LOCAL_WRITE);
  recv_mr = ibv_reg_mr(pd, recv_buf, REGION + 64, IBV_ACCESS_LOCAL_WRITE);
  fcq = ibv_create_cq(ctx, 4 * DEPTH, NULL, NULL, 0);
  frcq = ibv_create_cq(ctx, 4 * DEPTH, NULL, NULL, 0);
  if (!exposed_mr || !private_mr || !recv_mr || !fcq || !frcq ||
      !(fqp = make_qp2(fcq, frcq, t))) {
    fprintf(out, "error resources: %s\n", strerror(errno));
    return;
  }
  union ibv_gid fgid;
  gid_of_ip(fip, &fgid);
  uint32_t sq_psn = (uint32_t)random() & 0xffffff;
  if (connect_qp(fqp, t, &fgid, fqpn, fpsn & 0xffffff, sq_psn, 1)) {
    fprintf(out, "error modify: %s\n", strerror(errno));
    return;
  }
  /* The keys first: a key's set-up WR that fails on the fuzzed QP (rxe
   * fails LOCAL_INV of a type 2 window bound through a UC QP) leaves that
   * QP in ERR, which every case would then report. The case starts from a
   * fresh RTS instead, without the keys. */
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qia;
  if (expose_keys(t) &&
      (ibv_query_qp(fqp, &qa, IBV_QP_STATE, &qia) || qa.qp_state != IBV_QPS_RTS)) {
    struct ibv_qp_attr r = {.qp_state = IBV_QPS_RESET};
    struct ibv_wc wc;
    if (ibv_modify_qp(fqp, &r, IBV_QP_STATE) ||
        connect_qp(fqp, t, &fgid, fqpn, fpsn & 0xffffff, sq_psn, 1)) {
      fprintf(out, "error modify after the keys: %s\n", strerror(errno));
      return;
    }
    while (ibv_poll_cq(fcq, 1, &wc) > 0 || ibv_poll_cq(frcq, 1, &wc) > 0)
      ;
  }
  if (recvs > DEPTH)
    recvs = DEPTH;
  unsigned rlen = t == IBV_QPT_UD ? REGION + 40 : REGION;
  for (unsigned i = 0; i < recvs; i++) {
    struct ibv_sge s = {.addr = (uintptr_t)recv_buf, .length = rlen, .lkey = recv_mr->lkey};
    struct ibv_recv_wr w = {.wr_id = i, .sg_list = &s, .num_sge = 1}, *bad;
    if (ibv_post_recv(fqp, &w, &bad)) {
      fprintf(out, "error post_recv: %s\n", strerror(errno));
      return;
    }
  }
  fuzzer_qpn = fqpn;
  if (t == IBV_QPT_UD) {
    struct ibv_ah_attr ah = {.is_global = 1, .port_num = 1};
    ah.grh.dgid = fgid;
    ah.grh.sgid_index = gid_index;
    ah.grh.hop_limit = 64;
    if (!(fah = ibv_create_ah(pd, &ah))) {
      fprintf(out, "error create_ah: %s\n", strerror(errno));
      return;
    }
  }
  /* The QP's rights and RNR timer as the device keeps them. */
  char qp_line[96] = "";
  int n = 0;
  if (t != IBV_QPT_UD) {
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;
    int mask = IBV_QP_ACCESS_FLAGS | (t == IBV_QPT_RC ? IBV_QP_MIN_RNR_TIMER : 0);
    if (!ibv_query_qp(fqp, &qa, mask, &qi)) {
      n = snprintf(qp_line, sizeof qp_line, " qp_access=%u", qa.qp_access_flags);
      if (t == IBV_QPT_RC)
        n += snprintf(qp_line + n, sizeof qp_line - n, " min_rnr_timer=%u", qa.min_rnr_timer);
    }
  }
  /* Which of IBA 1.5's placement operations the device announces
   * (device_cap_flags_ex: FLUSH global, bit 38; ATOMIC WRITE, bit 40):
   * for one without them those opcodes are reserved. */
  struct ibv_device_attr_ex dx;
  if (!ibv_query_device_ex(ctx, NULL, &dx))
    snprintf(qp_line + n, sizeof qp_line - n, " ops_1_5=%u",
             (unsigned)(((dx.device_cap_flags_ex >> 38) & 1) |
                        (((dx.device_cap_flags_ex >> 40) & 1) << 1)));
  fprintf(out,
          "ok qpn=%u control_qpn=%u rq_psn=%u sq_psn=%u va=%llu len=%u rkey=%u "
          "private_rkey=%u qkey=%u mtu=%d recv_len=%u access=%d%s keys=%s\n",
          fqp->qp_num, cqp ? cqp->qp_num : 0, fpsn & 0xffffff, sq_psn,
          (unsigned long long)(uintptr_t)exposed, REGION, exposed_mr->rkey, private_mr->rkey,
          QKEY, mtu_bytes, rlen, all, qp_line, keys_line);
}

/* -k: the kernel log (/dev/kmsg, from the agent's start): new lines that
 * report a kernel problem are passed on ("log LINE"). */
static int kmsg = -1;

static void kernel_log(FILE *out) {
  static const char *bad[] = {"BUG", "WARNING", "KASAN", "Oops", "general protection",
                              "Call Trace", "UBSAN", "refcount_t", NULL};
  char rec[2048];
  ssize_t n;
  if (kmsg < 0)
    return;
  while ((n = read(kmsg, rec, sizeof rec - 1)) > 0 || (n < 0 && errno == EPIPE)) {
    if (n <= 0)
      continue;
    rec[n] = 0;
    char *msg = strchr(rec, ';');
    msg = msg ? msg + 1 : rec;
    msg[strcspn(msg, "\n")] = 0;
    for (int i = 0; bad[i]; i++)
      if (strstr(msg, bad[i])) {
        fprintf(out, "log %s\n", msg);
        break;
      }
  }
}

static void observe(FILE *out) {
  kernel_log(out);
  if (!fqp) {
    fprintf(out, "error no QP\nend\n");
    return;
  }
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  int state = ibv_query_qp(fqp, &a, IBV_QP_STATE, &ia) ? -1 : (int)a.qp_state;
  fprintf(out, "state %d\n", state);
  struct ibv_wc wc[16];
  int n;
  for (int q = 0; q < 2; q++)
    while ((n = ibv_poll_cq(q ? frcq : fcq, 16, wc)) > 0)
      for (int i = 0; i < n; i++)
        fprintf(out, "wc %llu %d %d %d %u %u %u %u %u\n", (unsigned long long)wc[i].wr_id,
                wc[i].status, q, (int)wc[i].opcode, wc[i].byte_len, (unsigned)wc[i].wc_flags,
                ntohl(wc[i].imm_data), wc[i].invalidated_rkey, wc[i].src_qp);
  struct ibv_async_event ev;
  while (ibv_get_async_event(ctx, &ev) == 0) {
    fprintf(out, "event %s\n", ibv_event_type_str(ev.event_type));
    ibv_ack_async_event(&ev);
  }
  fprintf(out, "exposed ");
  for (int i = 0; i < REGION; i++)
    fprintf(out, "%02x", (unsigned char)exposed[i]);
  fprintf(out, "\n");
  int intact = keys_intact();
  for (int i = 0; i < REGION; i++)
    intact &= (unsigned char)private_buf[i] == PATTERN;
  fprintf(out, "private %s\n", intact ? "ok" : "changed");
  int ok = control_check();
  if (!ok)
    make_control(); /* a fresh pair for the next case */
  fprintf(out, "control %s\nend\n", ok ? "ok" : "fail");
}

static void post(FILE *out, const char *op, unsigned long long wr_id, unsigned len,
                 unsigned off, unsigned long long va, unsigned rkey, unsigned long long swap_add,
                 unsigned long long compare) {
  if (!fqp) {
    fprintf(out, "error no QP\n");
    return;
  }
  int atomic = !strcmp(op, "cas") || !strcmp(op, "faa");
  if (atomic)
    len = 8;
  if (off > REGION || len > REGION - off) {
    fprintf(out, "error local range\n");
    return;
  }
  struct ibv_sge s = {.addr = (uintptr_t)(exposed + off), .length = len, .lkey = exposed_mr->lkey};
  struct ibv_send_wr w = {.wr_id = wr_id, .sg_list = &s, .num_sge = len ? 1 : 0,
                          .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  if (!strcmp(op, "send"))
    w.opcode = IBV_WR_SEND;
  else if (!strcmp(op, "write"))
    w.opcode = IBV_WR_RDMA_WRITE;
  else if (!strcmp(op, "read"))
    w.opcode = IBV_WR_RDMA_READ;
  else if (!strcmp(op, "cas"))
    w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  else if (!strcmp(op, "faa"))
    w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  else {
    fprintf(out, "error unknown operation %s\n", op);
    return;
  }
  if (fqp->qp_type == IBV_QPT_UD) {
    /* (The union's other members would be read as an address handle.) */
    w.wr.ud.ah = fah;
    w.wr.ud.remote_qpn = fuzzer_qpn;
    w.wr.ud.remote_qkey = QKEY;
  } else if (atomic) {
    w.wr.atomic.remote_addr = va;
    w.wr.atomic.rkey = rkey;
    w.wr.atomic.compare_add = !strcmp(op, "cas") ? compare : swap_add;
    w.wr.atomic.swap = swap_add;
  } else {
    w.wr.rdma.remote_addr = va;
    w.wr.rdma.rkey = rkey;
  }
  int e = ibv_post_send(fqp, &w, &bad);
  if (e)
    fprintf(out, "error post_send: %s\n", strerror(e));
  else
    fprintf(out, "ok\n");
}

static void serve(int fd) {
  FILE *in = fdopen(fd, "r"), *out = fdopen(dup(fd), "w");
  char line[512];
  while (fgets(line, sizeof line, in)) {
    char type[8], ip[64];
    unsigned recvs, qpn, psn;
    unsigned long long wr_id, va, swap_add, compare;
    unsigned len, off, rkey;
    if (sscanf(line, "setup %7s %u %63s %u %u", type, &recvs, ip, &qpn, &psn) == 5)
      setup(out, type, recvs, ip, qpn, psn);
    else if (sscanf(line, "post %7s %llu %u %u %llu %u %llu %llu", type, &wr_id, &len, &off, &va,
                    &rkey, &swap_add, &compare) == 8)
      post(out, type, wr_id, len, off, va, rkey, swap_add, compare);
    else if (!strncmp(line, "observe", 7))
      observe(out);
    else if (!strncmp(line, "ping", 4))
      fprintf(out, "pong\n");
    else if (!strncmp(line, "quit", 4))
      break;
    else
      fprintf(out, "error unknown command\n");
    fflush(out);
  }
  fclose(in);
  fclose(out);
}

int main(int argc, char **argv) {
  const char *dev = NULL, *addr = NULL, *listen_ip = "0.0.0.0";
  int port = 4792, opt;
  while ((opt = getopt(argc, argv, "d:a:l:p:m:k")) != -1) {
    switch (opt) {
    case 'k':
      kmsg = open("/dev/kmsg", O_RDONLY | O_NONBLOCK);
      if (kmsg >= 0)
        lseek(kmsg, 0, SEEK_END);
      else
        perror("/dev/kmsg");
      break;
    case 'd': dev = optarg; break;
    case 'a': addr = optarg; break;
    case 'l': listen_ip = optarg; break;
    case 'p': port = atoi(optarg); break;
    case 'm':
      mtu_bytes = atoi(optarg);
      mtu = mtu_bytes >= 4096 ? IBV_MTU_4096 : mtu_bytes >= 2048 ? IBV_MTU_2048
            : mtu_bytes >= 1024 ? IBV_MTU_1024 : mtu_bytes >= 512 ? IBV_MTU_512 : IBV_MTU_256;
      mtu_bytes = 128 << mtu;
      break;
    default:
      fprintf(stderr, "usage: %s -a TARGET_IP [-d DEVICE] [-l LISTEN_IP] [-p PORT] [-m MTU] [-k]\n",
              argv[0]);
      return 2;
    }
  }
  if (!addr) {
    fprintf(stderr, "-a TARGET_IP is required (the device's address)\n");
    return 2;
  }
  srandom((unsigned)time(NULL) ^ (unsigned)getpid());
  int n;
  struct ibv_device **list = ibv_get_device_list(&n);
  struct ibv_device *d = NULL;
  for (int i = 0; list && i < n; i++)
    if (!dev || !strcmp(ibv_get_device_name(list[i]), dev))
      d = d ? d : list[i];
  if (!d || !(ctx = ibv_open_device(d)) || !(pd = ibv_alloc_pd(ctx)) ||
      !(pd2 = ibv_alloc_pd(ctx))) {
    fprintf(stderr, "no device %s\n", dev ? dev : "");
    return 1;
  }
  if ((gid_index = find_gid(addr)) < 0) {
    fprintf(stderr, "%s: no GID for %s\n", ibv_get_device_name(d), addr);
    return 1;
  }
  gid_of_ip(addr, &my_gid);
  fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
  if (make_control()) {
    fprintf(stderr, "control QPs: %s\n", strerror(errno));
    return 1;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, listen_ip, &sa.sin_addr);
  if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1)) {
    perror("listen");
    return 1;
  }
  printf("uroce-fuzz-agent: %s (GID index %d), listening on %s:%d\n", ibv_get_device_name(d),
         gid_index, listen_ip, port);
  fflush(stdout);
  for (;;) {
    int c = accept(ls, NULL, NULL);
    if (c < 0)
      continue;
    /* An observation is one write; without this, its tail waits for the
     * fuzzer's delayed ACK (40 ms) behind Nagle's algorithm. */
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    serve(c);
  }
}
