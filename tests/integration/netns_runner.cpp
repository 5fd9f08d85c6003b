// Runs one command in its own network namespace (and its own mount namespace, where a shared
// directory is bind-mounted at a path of its own), as one node of a cluster sharing a file
// system would: test_fleet_pull's shared-directory variant.
//
//   netns_runner PORT SHARED MOUNTPOINT -- COMMAND ARGS...
//
// The new namespace has only its loopback, so the runner relays 127.0.0.1:PORT inside it to
// 127.0.0.1:PORT outside (the registry): each accepted connection gets a socket made in the
// original namespace (setns there and back; a socket stays in the namespace it was made in). The
// command sees SHARED at MOUNTPOINT (a bind mount in a private mount namespace). Exits with the
// command's status; 77 when namespaces cannot be made here (not root, no CAP_SYS_ADMIN, a
// seccomp profile): the test skips then.
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kCannotIsolate = 77;

[[noreturn]] void cannot(const char* what) {
  std::fprintf(stderr, "netns_runner: %s: %s\n", what, std::strerror(errno));
  std::exit(kCannotIsolate);
}

void bring_loopback_up() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) cannot("socket for the loopback");
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) != 0) cannot("SIOCGIFFLAGS lo");
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0) cannot("SIOCSIFFLAGS lo");
  ::close(s);
}

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Copies both ways until either side closes.
void relay(int a, int b) {
  pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
  char buf[1 << 16];
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    bool done = false;
    for (int i = 0; i < 2 && !done; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        done = true;
        break;
      }
      for (ssize_t off = 0; off < n;) {
        ssize_t w = ::write(fds[1 - i].fd, buf + off, static_cast<size_t>(n - off));
        if (w <= 0) {
          done = true;
          break;
        }
        off += w;
      }
    }
    if (done) break;
  }
  ::close(a);
  ::close(b);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6 || std::string(argv[4]) != "--") {
    std::fprintf(stderr, "usage: netns_runner PORT SHARED MOUNTPOINT -- COMMAND ARGS...\n");
    return 2;
  }
  const int port = std::atoi(argv[1]);
  const char* shared = argv[2];
  const char* mountpoint = argv[3];

  int outside = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (outside < 0) cannot("open /proc/self/ns/net");
  if (::unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) cannot("unshare(CLONE_NEWNET | CLONE_NEWNS)");
  int inside = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (inside < 0) cannot("open the new /proc/self/ns/net");
  // Mounts made here stay here: the bind mount is this node's view of the shared directory.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) cannot("make / private");
  if (::mount(shared, mountpoint, nullptr, MS_BIND, nullptr) != 0) cannot("bind mount");
  bring_loopback_up();

  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr = loopback(port);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 64) != 0) {
    cannot("listen on 127.0.0.1 in the new namespace");
  }

  pid_t child = ::fork();
  if (child < 0) cannot("fork");
  if (child == 0) {
    ::execvp(argv[5], argv + 5);
    std::fprintf(stderr, "netns_runner: cannot run %s: %s\n", argv[5], std::strerror(errno));
    ::_exit(127);
  }

  // Relays until the command exits (a thread per connection; the process ends with them).
  std::thread([listener, outside, inside, port] {
    for (;;) {
      int in = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (in < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (::setns(outside, CLONE_NEWNET) != 0) cannot("setns to the original namespace");
      int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::setns(inside, CLONE_NEWNET) != 0) cannot("setns back");
      sockaddr_in up = loopback(port);
      if (out < 0 || ::connect(out, reinterpret_cast<sockaddr*>(&up), sizeof up) != 0) {
        ::close(in);
        if (out >= 0) ::close(out);
        continue;
      }
      std::thread(relay, in, out).detach();
    }
  }).detach();

  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  std::fflush(nullptr);
  if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
  ::_exit(128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
}
