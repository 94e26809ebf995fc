/* Signals a program blocks stay its own (issue 24, item 9).
 *
 * tgt's iSER target opens the RDMA device, then blocks SIGUSR2 in its main
 * thread and reads it from a signalfd while its I/O threads send it to the
 * process. A process-directed signal goes to any thread that does not
 * block it: a thread the verbs library started with an empty mask would
 * take it, and the default action would end the process. Here: open the
 * devices through rdma_cm (the engine and CM start), block SIGUSR2 and
 * SIGALRM, then send each to the process 10 times from a thread of ours:
 * they must come out of the signalfd, and the process must live.
 * Prints how many were read and exits 0 when both kinds came. */
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>
#include <sys/signalfd.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
#include <pthread.h>
#include <poll.h>

#define ROUNDS 10

static void *sender(void *arg) {
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        kill(getpid(), SIGUSR2);
        kill(getpid(), SIGALRM);
        usleep(2000);
    }
    return NULL;
}

int main(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id = NULL;
    if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
        perror("rdma_create_id");
        return 1;
    }
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(7471) };
    if (rdma_bind_addr(id, (struct sockaddr *)&sa)) {
        perror("rdma_bind_addr");
        return 1;
    }
    /* Also a verbs context of every device, as a verbs program has. */
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    struct ibv_context *ctx[8];
    int opened = 0;
    for (int i = 0; list && i < n && opened < 8; i++)
        if ((ctx[opened] = ibv_open_device(list[i])))
            opened++;
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR2);
    sigaddset(&m, SIGALRM);
    if (sigprocmask(SIG_BLOCK, &m, NULL)) {
        perror("sigprocmask");
        return 1;
    }
    int sfd = signalfd(-1, &m, 0);
    if (sfd < 0) {
        perror("signalfd");
        return 1;
    }
    pthread_t t;
    pthread_create(&t, NULL, sender, NULL);
    /* Standard signals do not queue: one pending SIGUSR2 absorbs the next
     * until read. Count what arrives until the sender is done and the fd
     * stays quiet; at least one of each kind must come, and every read
     * must be one of them. */
    int got = 0, usr2 = 0, alrm = 0;
    struct signalfd_siginfo si;
    for (;;) {
        struct pollfd p = { sfd, POLLIN, 0 };
        if (poll(&p, 1, 300) <= 0)
            break;
        if (read(sfd, &si, sizeof si) != sizeof si)
            break;
        got++;
        usr2 += si.ssi_signo == SIGUSR2;
        alrm += si.ssi_signo == SIGALRM;
    }
    pthread_join(t, NULL);
    for (int i = 0; i < opened; i++)
        ibv_close_device(ctx[i]);
    ibv_free_device_list(list);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    printf("%d signals read from the signalfd (SIGUSR2 %d, SIGALRM %d), %d devices open\n",
           got, usr2, alrm, opened);
    return (usr2 > 0 && alrm > 0 && got == usr2 + alrm && opened > 0) ? 0 : 1;
}
