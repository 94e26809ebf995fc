/* udp_yard: what the kernel's UDP can do on loopback between two processes,
 * the yardsticks benches/perftest.sh measures uroce against.
 *
 *   udp_yard bulk     SIZE SECS RX_ADDR TX_ADDR   one SIZE-byte datagram per
 *                                                 send(2) / recv(2)
 *   udp_yard gso      SEG  SECS RX_ADDR TX_ADDR   UDP_SEGMENT sends of
 *                                                 61440/SEG (at most 64)
 *                                                 segments of SEG bytes,
 *                                                 UDP_GRO receives (gso_size
 *                                                 from the cmsg)
 *   udp_yard mmsg     SIZE SECS RX_ADDR TX_ADDR   SIZE-byte datagrams in
 *                                                 sendmmsg/recvmmsg batches
 *                                                 of 64
 *   udp_yard pingpong SIZE SECS A_ADDR  B_ADDR    busy-polling ping-pong on
 *                                                 non-blocking sockets (spin
 *                                                 on recv; past 50 us without
 *                                                 an answer, block in poll)
 *
 * Both sockets are bound (port 0) and connected before fork(2): the child
 * receives (or answers the pings), the parent sends. Throughput counts what
 * the receiver got, over SECS seconds after a 0.3 s warm-up. Every process
 * has an alarm(2) and every wait a time limit, so nothing hangs.
 *
 * Prints one line of key=value pairs starting "ok", or "na reason=..." (and
 * exits 0) when the kernel lacks GSO/GRO; errors go to stderr, exit 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define WARMUP_NS 300000000LL  /* discarded before counting */
#define BATCH 64               /* sendmmsg / recvmmsg batch */
#define GSO_BYTES 61440        /* most bytes per GSO send: 15 x 4096, 60 x 1024 */
#define RXBUF 65536
#define SOCKBUF (8 << 20)      /* as uroce's engine asks for */
#define MAX_SAMPLES (4u << 20) /* ping-pong round trips kept */
#define STOP_SEQ 0xffffu       /* ping-pong: "stop" */

static const char *role = "udp_yard";

static void die(const char *fmt, ...) {
  int e = errno;
  va_list ap;
  fprintf(stderr, "%s: ", role);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (e != 0)
    fprintf(stderr, ": %s", strerror(e));
  fputc('\n', stderr);
  exit(1);
}

static int64_t now_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
    die("clock_gettime");
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long parse_long(const char *s, long lo, long hi, const char *what) {
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
    errno = 0;
    die("bad %s '%s' (%ld..%ld)", what, s, lo, hi);
  }
  return v;
}

static void set_int(int fd, int level, int opt, int val, const char *what) {
  if (setsockopt(fd, level, opt, &val, sizeof val) != 0)
    die("setsockopt %s", what);
}

static void set_timeout(int fd, int opt, long ms) {
  struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
  if (setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv) != 0)
    die("setsockopt SO_RCVTIMEO/SO_SNDTIMEO");
}

/* A UDP socket bound to addr:0, with big buffers (FORCE first, as uroce). */
static int udp_socket(const char *addr, int nonblock, struct sockaddr_in *out) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0)
    die("socket");
  int val = SOCKBUF;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &val, sizeof val) != 0)
    set_int(fd, SOL_SOCKET, SO_RCVBUF, SOCKBUF, "SO_RCVBUF");
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &val, sizeof val) != 0)
    set_int(fd, SOL_SOCKET, SO_SNDBUF, SOCKBUF, "SO_SNDBUF");
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
    errno = 0;
    die("bad IPv4 address '%s'", addr);
  }
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    die("bind %s", addr);
  socklen_t len = sizeof *out;
  if (getsockname(fd, (struct sockaddr *)out, &len) != 0)
    die("getsockname");
  return fd;
}

static void connect_to(int fd, const struct sockaddr_in *peer) {
  if (connect(fd, (const struct sockaddr *)peer, sizeof *peer) != 0)
    die("connect");
}

/* What the child reports to the parent through the pipe. */
struct result {
  int ok;
  uint64_t bytes, dgrams, recvs, gro_recvs;
  int64_t ns;
};

static void write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      die("write pipe");
    }
    c += w;
    n -= (size_t)w;
  }
}

/* Reads the child's result, waiting at most until deadline. 0: got it. */
static int read_result(int fd, struct result *r, int64_t deadline) {
  char *c = (char *)r;
  size_t n = sizeof *r;
  while (n > 0) {
    int64_t left = deadline - now_ns();
    if (left <= 0)
      return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc = poll(&p, 1, (int)(left / 1000000 + 1));
    if (rc < 0) {
      if (errno == EINTR)
        continue;
      die("poll pipe");
    }
    if (rc == 0)
      continue;
    ssize_t got = read(fd, c, n);
    if (got < 0) {
      if (errno == EINTR)
        continue;
      die("read pipe");
    }
    if (got == 0)
      return -1; /* child exited without a result */
    c += got;
    n -= (size_t)got;
  }
  return 0;
}

/* Non-blocking check: has the child written to the pipe (or exited)? */
static int pipe_readable(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int rc = poll(&p, 1, 0);
  if (rc < 0) {
    if (errno == EINTR)
      return 0;
    die("poll pipe");
  }
  return rc > 0;
}

/* Waits for the child; returns 0 if it exited 0. Kills it past the limit. */
static int reap(pid_t pid, int limit_ms) {
  int64_t deadline = now_ns() + (int64_t)limit_ms * 1000000;
  for (;;) {
    int st = 0;
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      die("waitpid");
    }
    if (w == pid) {
      if (WIFEXITED(st))
        return WEXITSTATUS(st) == 0 ? 0 : -1;
      return -1;
    }
    if (now_ns() > deadline) {
      if (kill(pid, SIGKILL) != 0 && errno != ESRCH)
        die("kill");
      deadline = now_ns() + 5000000000LL;
    }
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 10000000};
    if (nanosleep(&ts, NULL) != 0 && errno != EINTR)
      die("nanosleep");
  }
}

enum mode { BULK, GSO, MMSG, PINGPONG };

/* Segments per GSO send: 61440 bytes' worth, at most 64 (UDP_MAX_SEGMENTS
 * of older kernels). */
static long gso_segments(long size) {
  long n = GSO_BYTES / size;
  return n < 64 ? n : 64;
}

/* ---- receiver (child) for bulk / gso / mmsg */

struct counter {
  int64_t first, t0;
  int counting;
  struct result r;
};

/* Called after every receive: starts counting after the warm-up, returns 1
 * when the measured window is over. */
static int tick(struct counter *c, int64_t secs_ns) {
  int64_t t = now_ns();
  if (!c->counting) {
    if (t - c->first >= WARMUP_NS) {
      c->counting = 1;
      c->t0 = t;
      memset(&c->r, 0, sizeof c->r);
    }
    return 0;
  }
  if (t - c->t0 >= secs_ns) {
    c->r.ns = t - c->t0;
    return 1;
  }
  return 0;
}

static void receiver(enum mode m, int fd, long size, int64_t secs_ns, int out) {
  static char buf[BATCH][RXBUF / BATCH > 2048 ? RXBUF / BATCH : 2048];
  static char big[RXBUF];
  struct counter c;
  memset(&c, 0, sizeof c);
  set_timeout(fd, SO_RCVTIMEO, 100);
  int64_t give_up = now_ns() + 5000000000LL + secs_ns; /* no traffic at all */
  int started = 0;
  struct mmsghdr msgs[BATCH];
  struct iovec iovs[BATCH];
  for (int i = 0; i < BATCH; i++) {
    iovs[i].iov_base = buf[i];
    iovs[i].iov_len = sizeof buf[i];
    memset(&msgs[i], 0, sizeof msgs[i]);
    msgs[i].msg_hdr.msg_iov = &iovs[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  (void)size;
  for (;;) {
    uint64_t bytes = 0, dgrams = 0, gro = 0;
    if (m == BULK) {
      ssize_t n = recv(fd, big, sizeof big, 0);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          die("recv");
      } else {
        bytes = (uint64_t)n;
        dgrams = 1;
      }
    } else if (m == GSO) {
      union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
      } ctl;
      struct iovec iov = {.iov_base = big, .iov_len = sizeof big};
      struct msghdr mh;
      memset(&mh, 0, sizeof mh);
      mh.msg_iov = &iov;
      mh.msg_iovlen = 1;
      mh.msg_control = ctl.b;
      mh.msg_controllen = sizeof ctl.b;
      ssize_t n = recvmsg(fd, &mh, 0);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          die("recvmsg");
      } else {
        int gso_size = 0;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm)) {
          if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO &&
              cm->cmsg_len >= CMSG_LEN(sizeof(int)))
            memcpy(&gso_size, CMSG_DATA(cm), sizeof gso_size);
        }
        bytes = (uint64_t)n;
        if (gso_size > 0) {
          dgrams = ((uint64_t)n + (uint64_t)gso_size - 1) / (uint64_t)gso_size;
          gro = 1;
        } else {
          dgrams = 1;
        }
      }
    } else {
      for (int i = 0; i < BATCH; i++)
        msgs[i].msg_len = 0;
      int n = recvmmsg(fd, msgs, BATCH, MSG_WAITFORONE, NULL);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          die("recvmmsg");
      } else {
        for (int i = 0; i < n; i++)
          bytes += msgs[i].msg_len;
        dgrams = (uint64_t)n;
      }
    }
    if (dgrams > 0 && !started) {
      started = 1;
      c.first = now_ns();
    }
    if (!started) {
      if (now_ns() > give_up) {
        errno = 0;
        die("no datagram received");
      }
      continue;
    }
    c.r.bytes += bytes;
    c.r.dgrams += dgrams;
    c.r.recvs += dgrams > 0;
    c.r.gro_recvs += gro;
    if (tick(&c, secs_ns))
      break;
  }
  c.r.ok = 1;
  write_all(out, &c.r, sizeof c.r);
}

/* ---- sender (parent) for bulk / gso / mmsg; stops when the child reports */

static int sender(enum mode m, int fd, long size, int64_t secs_ns, int in, struct result *r,
                  pid_t child) {
  static char buf[GSO_BYTES];
  memset(buf, 0x5a, sizeof buf);
  set_timeout(fd, SO_SNDTIMEO, 100);
  struct mmsghdr msgs[BATCH];
  struct iovec iov = {.iov_base = buf, .iov_len = (size_t)size};
  for (int i = 0; i < BATCH; i++) {
    memset(&msgs[i], 0, sizeof msgs[i]);
    msgs[i].msg_hdr.msg_iov = &iov;
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  size_t len = m == GSO ? (size_t)gso_segments(size) * (size_t)size : (size_t)size;
  int64_t start = now_ns();
  int64_t deadline = start + WARMUP_NS + secs_ns + 10000000000LL;
  int64_t last = start;
  int sent_any = 0;
  for (;;) {
    int fail = 0;
    if (m == MMSG) {
      int n = sendmmsg(fd, msgs, BATCH, 0);
      if (n < 0)
        fail = 1;
    } else {
      ssize_t n = send(fd, buf, len, 0);
      if (n < 0)
        fail = 1;
    }
    if (fail) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ENOBUFS ||
          errno == ECONNREFUSED) {
        /* ECONNREFUSED: an ICMP error from a closed receiver; the pipe
         * tells whether it is done. */
      } else if (m == GSO && !sent_any && (errno == EIO || errno == EINVAL)) {
        if (kill(child, SIGKILL) != 0 && errno != ESRCH)
          die("kill");
        return 1; /* the kernel cannot do GSO here */
      } else {
        die(m == MMSG ? "sendmmsg" : "send");
      }
    } else {
      sent_any = 1;
    }
    int64_t t = now_ns();
    if (t - last >= 1000000) { /* look at the pipe once a millisecond */
      last = t;
      if (pipe_readable(in))
        break;
      if (t > deadline) {
        errno = 0;
        die("the receiver did not finish");
      }
    }
  }
  if (read_result(in, r, now_ns() + 5000000000LL) != 0 || !r->ok) {
    errno = 0;
    die("the receiver failed");
  }
  return 0;
}

/* ---- ping-pong */

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* Spins on a non-blocking recv until a datagram arrives or the deadline.
 * Past SPIN_NS without one it blocks in poll(2) until one comes: two
 * spinners that the scheduler has stacked on one core (it does, and leaves
 * them there while the other core idles) then measure its time slice; a
 * process woken from poll is placed on an idle core, and spins there
 * afterwards. With a core each, an answer comes long before SPIN_NS. */
#define SPIN_NS 50000
static ssize_t spin_recv(int fd, unsigned char *buf, size_t cap, int64_t deadline) {
  int64_t start = now_ns();
  for (;;) {
    ssize_t n = recv(fd, buf, cap, 0);
    if (n >= 0)
      return n;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNREFUSED)
      die("recv");
    int64_t t = now_ns();
    if (t > deadline)
      return -1;
    if (t - start >= SPIN_NS) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      if (poll(&p, 1, 100) < 0 && errno != EINTR)
        die("poll");
    }
  }
}

static void pong(int fd, int64_t secs_ns) {
  unsigned char buf[2048];
  int64_t deadline = now_ns() + WARMUP_NS + secs_ns + 15000000000LL;
  for (;;) {
    ssize_t n = spin_recv(fd, buf, sizeof buf, deadline);
    if (n < 0) {
      errno = 0;
      die("pong: no stop from the pinger");
    }
    if (n >= 2 && buf[0] == (STOP_SEQ & 0xff) && buf[1] == (STOP_SEQ >> 8))
      return;
    for (;;) {
      if (send(fd, buf, (size_t)n, 0) >= 0)
        break;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ENOBUFS)
        die("send");
      if (now_ns() > deadline) {
        errno = 0;
        die("pong: cannot send");
      }
    }
  }
}

static void ping(int fd, long size, int64_t secs_ns, pid_t child) {
  uint32_t *rtt = malloc((size_t)MAX_SAMPLES * sizeof *rtt);
  if (rtt == NULL)
    die("malloc");
  unsigned char out[2048], in[2048];
  memset(out, 0, sizeof out);
  size_t n_samples = 0;
  uint16_t seq = 0;
  int64_t start = now_ns();
  for (;;) {
    int64_t t = now_ns();
    int counting = t - start >= WARMUP_NS;
    if (t - start >= WARMUP_NS + secs_ns || n_samples == MAX_SAMPLES)
      break;
    seq = (uint16_t)((seq + 1) & 0x7fff);
    out[0] = (unsigned char)(seq & 0xff);
    out[1] = (unsigned char)(seq >> 8);
    int64_t t0 = now_ns();
    while (send(fd, out, (size_t)size, 0) < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ENOBUFS)
        die("send ping");
      if (now_ns() - t0 > 1000000000LL) {
        errno = 0;
        die("ping: cannot send for 1 s");
      }
    }
    int64_t t1;
    for (;;) {
      ssize_t n = spin_recv(fd, in, sizeof in, t0 + 1000000000LL);
      if (n < 0) {
        errno = 0;
        die("ping: no answer within 1 s");
      }
      t1 = now_ns();
      if (n >= 2 && in[0] == out[0] && in[1] == out[1])
        break; /* a stale answer is skipped */
    }
    if (counting)
      rtt[n_samples++] = (uint32_t)(t1 - t0);
  }
  out[0] = STOP_SEQ & 0xff;
  out[1] = STOP_SEQ >> 8;
  for (int i = 0; i < 3; i++)
    if (send(fd, out, 2, 0) < 0 && errno != ECONNREFUSED)
      die("send stop");
  if (reap(child, 5000) != 0) {
    errno = 0;
    die("the pong process failed");
  }
  if (n_samples == 0) {
    errno = 0;
    die("no round trip measured");
  }
  qsort(rtt, n_samples, sizeof *rtt, cmp_u32);
  double median = rtt[n_samples / 2] / 2000.0;
  double p99 = rtt[(n_samples * 99) / 100] / 2000.0;
  printf("ok mode=pingpong size=%ld samples=%zu half_rtt_median_us=%.2f half_rtt_p99_us=%.2f\n",
         size, n_samples, median, p99);
  free(rtt);
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: udp_yard bulk|gso|mmsg|pingpong SIZE SECS ADDR_A ADDR_B\n");
    return 2;
  }
  enum mode m;
  if (strcmp(argv[1], "bulk") == 0)
    m = BULK;
  else if (strcmp(argv[1], "gso") == 0)
    m = GSO;
  else if (strcmp(argv[1], "mmsg") == 0)
    m = MMSG;
  else if (strcmp(argv[1], "pingpong") == 0)
    m = PINGPONG;
  else {
    fprintf(stderr, "udp_yard: unknown mode '%s'\n", argv[1]);
    return 2;
  }
  long size = parse_long(argv[2], 2, m == BULK ? GSO_BYTES : m == GSO ? 8192 : 2048, "size");
  long secs = parse_long(argv[3], 1, 600, "seconds");
  int64_t secs_ns = (int64_t)secs * 1000000000LL;
  if (setvbuf(stdout, NULL, _IOLBF, 0) != 0)
    die("setvbuf");

  struct sockaddr_in a, b;
  int fa = udp_socket(argv[4], m == PINGPONG, &a);
  int fb = udp_socket(argv[5], m == PINGPONG, &b);
  connect_to(fb, &a);
  connect_to(fa, &b);
  if (m == GSO) {
    int seg = (int)size;
    if (setsockopt(fb, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) != 0) {
      if (errno == ENOPROTOOPT || errno == EINVAL) {
        printf("na reason=\"kernel lacks UDP_SEGMENT\"\n");
        return 0;
      }
      die("setsockopt UDP_SEGMENT");
    }
    int on = 1;
    if (setsockopt(fa, SOL_UDP, UDP_GRO, &on, sizeof on) != 0) {
      if (errno == ENOPROTOOPT || errno == EINVAL) {
        printf("na reason=\"kernel lacks UDP_GRO\"\n");
        return 0;
      }
      die("setsockopt UDP_GRO");
    }
  }

  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0)
    die("pipe2");
  if (fflush(NULL) != 0)
    die("fflush");
  pid_t pid = fork();
  if (pid < 0)
    die("fork");
  unsigned limit = (unsigned)secs + 30; /* the watchdog: SIGALRM kills */
  if (pid == 0) {
    role = m == PINGPONG ? "udp_yard pong" : "udp_yard receiver";
    alarm(limit);
    if (close(pfd[0]) != 0 || close(fb) != 0)
      die("close");
    if (m == PINGPONG)
      pong(fa, secs_ns);
    else
      receiver(m, fa, size, secs_ns, pfd[1]);
    _exit(0);
  }
  role = m == PINGPONG ? "udp_yard ping" : "udp_yard sender";
  alarm(limit);
  if (close(pfd[1]) != 0 || close(fa) != 0)
    die("close");
  if (m == PINGPONG) {
    ping(fb, size, secs_ns, pid);
    return 0;
  }
  struct result r;
  memset(&r, 0, sizeof r);
  if (sender(m, fb, size, secs_ns, pfd[0], &r, pid) != 0) {
    (void)reap(pid, 5000);
    printf("na reason=\"kernel lacks UDP_SEGMENT\"\n");
    return 0;
  }
  if (reap(pid, 5000) != 0) {
    errno = 0;
    die("the receiver failed");
  }
  double s = (double)r.ns / 1e9;
  printf("ok mode=%s size=%ld secs=%.3f bytes=%" PRIu64 " dgrams=%" PRIu64
         " recvs=%" PRIu64 " gro_recvs=%" PRIu64 " mib_s=%.1f mdgram_s=%.4f"
         " per_send=%ld\n",
         argv[1], size, s, r.bytes, r.dgrams, r.recvs, r.gro_recvs, (double)r.bytes / s / 1048576.0,
         (double)r.dgrams / s / 1e6, m == GSO ? gso_segments(size) : m == MMSG ? BATCH : 1L);
  return 0;
}
