// rendezvous.c: the TCP exchange of rendezvous.h. A peer's hello is 20 bytes: "gemc", its
// rank and the world size (little-endian 32-bit), and its job token (little-endian 64-bit);
// rank 0 answers with the blob.
#include "rendezvous.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "checked.h"
#include "clock.h"

// A peer has this long to say hello once connected, so a silent connection (a port scanner,
// a stale client) cannot hold rank 0 for the whole deadline.
static const double HELLO_S = 10;

static int ms_left(double deadline) {
  double left = deadline - monotonic_seconds();
  return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1e3) + 1;
}

// Moves all n bytes (send or receive) before the deadline; false on a timeout, an error or a
// closed peer.
static bool move_all(int fd, void *buf, size_t n, bool sending, double deadline) {
  char *p = buf;
  while (n > 0) {
    struct pollfd pf = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
    int ms = ms_left(deadline);
    if (ms == 0 || poll(&pf, 1, ms) <= 0) return false;
    ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    p += k;
    n -= (size_t)k;
  }
  return true;
}

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static bool resolve(const char *addr, int port, bool passive, struct addrinfo **out, char *err,
                    size_t err_size) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = passive ? AI_PASSIVE : 0};
  int rc = getaddrinfo(passive ? NULL : addr, service, &hints, out);
  if (rc != 0)
    return fail(err, err_size, "rendezvous: cannot resolve %s:%d: %s", addr, port,
                gai_strerror(rc));
  return true;
}

enum { HELLO_BYTES = 20 };

static bool serve(int port, const char *addr, int world, uint64_t job, void *blob,
                  size_t size, double deadline, double timeout_s, char *err, size_t err_size) {
  struct addrinfo *ai;
  if (!resolve(addr, port, true, &ai, err, err_size)) return false;
  int fd = -1;
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, 0);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, world) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  if (fd < 0)
    return fail(err, err_size, "rendezvous: rank 0 cannot listen on port %d: %s (MASTER_PORT "
                "taken?)", port, strerror(errno));
  bool *came = xcalloc((size_t)world, sizeof *came);
  int waiting = world - 1;
  bool ok = true;
  while (ok && waiting > 0) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int ms = ms_left(deadline);
    if (ms == 0 || poll(&pf, 1, ms) <= 0) {
      char missing[256] = "";
      for (int r = 1, n = 0; r < world && n < 8; r++)
        if (!came[r]) {
          snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%d",
                   n ? ", " : "", r);
          n++;
        }
      ok = fail(err, err_size, "rendezvous: %d of %d ranks did not reach rank 0 at port %d "
                "within %g s (missing: %s%s)", waiting, world - 1, port, timeout_s, missing,
                waiting > 8 ? ", ..." : "");
      break;
    }
    int peer = accept(fd, NULL, NULL);
    if (peer < 0) continue;
    unsigned char hello[HELLO_BYTES];
    double hello_by = monotonic_seconds() + HELLO_S < deadline ? monotonic_seconds() + HELLO_S : deadline;
    bool good = move_all(peer, hello, sizeof hello, false, hello_by) &&
                memcmp(hello, "gemc", 4) == 0;
    int r = good ? (int)get32(hello + 4) : -1, w = good ? (int)get32(hello + 8) : -1;
    uint64_t their = good ? get32(hello + 12) | (uint64_t)get32(hello + 16) << 32 : 0;
    if (good && their != job) {
      fprintf(stderr, "gemc: note: rendezvous: a peer of another job (rank %d of %d) reached "
              "port %d; turned away\n", r, w, port);
    } else if (good && (w != world || r <= 0 || r >= world || came[r])) {
      ok = fail(err, err_size, "rendezvous: a peer says rank %d of %d; this world has %d ranks%s",
                r, w, world, r > 0 && r < world && came[r] ? " and that rank came already" : "");
    } else if (good && move_all(peer, blob, size, true, deadline)) {
      came[r] = true;
      waiting--;
    }
    close(peer);
  }
  free(came);
  close(fd);
  return ok;
}

// A connect that gives up at the deadline (a blocking one can wait minutes on an address
// that drops packets).
static bool connect_by(int fd, const struct addrinfo *a, double deadline) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return false;
  bool ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
  if (!ok && errno == EINPROGRESS) {
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    int ms = ms_left(deadline), soerr = 1;
    socklen_t len = sizeof soerr;
    ok = ms > 0 && poll(&pf, 1, ms) == 1 &&
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0;
  }
  return ok && fcntl(fd, F_SETFL, flags) == 0;
}

static bool join(const char *addr, int port, int rank, int world, uint64_t job, void *blob,
                 size_t size, double deadline, double timeout_s, char *err, size_t err_size) {
  // Rank 0 may not listen yet: try again until the deadline.
  for (;;) {
    struct addrinfo *ai;
    if (!resolve(addr, port, false, &ai, err, err_size)) return false;
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
      fd = socket(a->ai_family, a->ai_socktype, 0);
      if (fd >= 0 && !connect_by(fd, a, deadline)) {
        close(fd);
        fd = -1;
      }
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
      unsigned char hello[HELLO_BYTES];
      memcpy(hello, "gemc", 4);
      put32(hello + 4, (uint32_t)rank);
      put32(hello + 8, (uint32_t)world);
      put32(hello + 12, (uint32_t)job);
      put32(hello + 16, (uint32_t)(job >> 32));
      // Connected: rank 0 answers or the rendezvous fails (no second try, which rank 0
      // would take for a duplicate rank).
      bool ok = move_all(fd, hello, sizeof hello, true, deadline) &&
                move_all(fd, blob, size, false, deadline);
      close(fd);
      if (ok) return true;
      return fail(err, err_size, "rendezvous: rank %d reached rank 0 at %s:%d, which did not "
                  "answer with the id (%zu bytes) within %g s", rank, addr, port, size,
                  timeout_s);
    }
    if (monotonic_seconds() >= deadline)
      return fail(err, err_size, "rendezvous: rank %d could not get the id from rank 0 at %s:%d "
                  "within %g s", rank, addr, port, timeout_s);
    struct timespec nap = {0, 50 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
}

bool rendezvous_share(const char *addr, int port, int rank, int world, uint64_t job, void *blob,
                      size_t size, double timeout_s, char *err, size_t err_size) {
  if (world <= 1) return true;
  if (!addr || !*addr || port <= 0)
    return fail(err, err_size, "rendezvous: %d ranks need MASTER_ADDR and MASTER_PORT (torchrun "
                "and gemc launch set them)", world);
  double deadline = monotonic_seconds() + timeout_s;
  return rank == 0 ? serve(port, addr, world, job, blob, size, deadline, timeout_s, err,
                           err_size)
                   : join(addr, port, rank, world, job, blob, size, deadline, timeout_s, err,
                          err_size);
}
